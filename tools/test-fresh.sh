#!/bin/bash
# make test-fresh: run the README's two commands as a new user would, in a
# clean Debian 12 root, so that nothing installed on this machine by hand
# can make them pass.
#
# - The root is debootstrap's minbase of bookworm (tools/fresh-root.sh
#   says how it is made, run in and removed).
# - Inside it: only the README's prerequisites (git, make,
#   ca-certificates), this machine's local certificate authorities and
#   npm configuration, then a clone of this repository's committed HEAD
#   (uncommitted changes are not part of the test), and what the tests
#   use of this machine's pyenv, where it has it: the pyenv command, its
#   3.11.x, upstream's perf test files (copy_pyenv in fresh-root.sh).
# - `make demo` and `make test` run in it through chroot with /proc, /sys
#   and /dev mounted, as root.
#
# Prints both commands' exit statuses; ends with make test's closing line.
#
# `test-fresh.sh deb` (make deb-fresh) runs `make deb` there instead and
# puts the packages it built into build/deb/, for make test-deb: packages
# built on a machine with nothing but the README's prerequisites.
# Needs root.  The root is build/fresh/root (FRESH_DIR), about 3 GB while
# it runs; the logs stay in build/fresh/.
set -euo pipefail
# One compound command: bash reads it whole before running it, so editing
# this file during an (hour-long) run cannot change what the run does.
{
. "$(dirname "$0")/lib.sh"

PREREQUISITES=(git make ca-certificates)
MODE=${1:-test}
[[ $MODE == test || $MODE == deb ]] || { echo "usage: $0 [deb]" >&2; exit 2; }
WORK=$(realpath -m "${FRESH_DIR:-$ROOT/build/fresh}")
CHROOT=$WORK/root
SRC=/root/perf-trampolines

say() { echo "test-fresh: $*" >&2; }
die() { say "error: $*"; exit 1; }
. "$ROOT/tools/fresh-root.sh"

make_root

say "installing the README's prerequisites: ${PREREQUISITES[*]}"
root_install "$WORK/prerequisites.log" "${PREREQUISITES[@]}"
# What reaching npm's registry takes on this machine's network, a machine
# on it has too: the certificate authorities it adds to Debian's (a TLS
# proxy's, say) and npm's configuration.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
    cp /usr/local/share/ca-certificates/*.crt "$CHROOT/usr/local/share/ca-certificates/"
    in_root update-ca-certificates >>"$WORK/prerequisites.log" 2>&1 ||
        die "update-ca-certificates failed (log: $WORK/prerequisites.log)"
fi
if [ -f /etc/npmrc ]; then
    cp /etc/npmrc "$CHROOT/etc/npmrc"
fi

head=$(git -C "$ROOT" rev-parse HEAD)
say "cloning $ROOT at ${head:0:12} into the root"
git clone -q --no-hardlinks "$ROOT" "$CHROOT$SRC"
git -C "$CHROOT$SRC" checkout -q --detach "$head"
if [ "$MODE" = test ]; then
    say "copying what the tests use of this machine's pyenv to the root's ~/.pyenv"
    copy_pyenv "${PYENV_ROOT:-$HOME/.pyenv}" "$CHROOT/root/.pyenv"
fi

# make_in_root TARGET: make TARGET in the root, its output also in
# $WORK/TARGET.log; returns make's status.  It runs in the background and
# is waited for: bash runs a trap only between commands, and `wait` is the
# one a signal cuts short, so TERM or Ctrl-C cleans up at once (cleanup
# kills what runs in the root).
make_in_root() {
    say "== make $1 (in the fresh root) =="
    (in_root make -C "$SRC" "$1" 2>&1 | tee "$WORK/$1.log"
     exit "${PIPESTATUS[0]}") &
    wait $!
}

started=$SECONDS
set +e
if [ "$MODE" = deb ]; then
    make_in_root deb
    deb_status=$?
    set -e
    echo "test-fresh: make deb exited $deb_status ($(( (SECONDS - started) / 60 )) min in a clean Debian 12 root)"
    [ "$deb_status" -eq 0 ] || exit "$deb_status"
    rm -f "$ROOT"/build/deb/*.deb
    mkdir -p "$ROOT/build/deb"
    cp "$CHROOT$SRC"/build/deb/*.deb "$ROOT/build/deb/"
    echo "test-fresh: its packages are in $ROOT/build/deb/ (make test-deb checks them)"
    exit 0
fi
make_in_root demo
demo_status=$?
demo_minutes=$(( (SECONDS - started) / 60 ))
make_in_root test
test_status=$?
test_minutes=$(( (SECONDS - started) / 60 - demo_minutes ))
set -e
closing=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$WORK/test.log" |
          tail -1 || true)
echo
echo "test-fresh: make demo exited $demo_status ($demo_minutes min)"
echo "test-fresh: make test exited $test_status ($test_minutes min); its parts:"
grep -hE '^build: .* \([0-9]+ s\)$|^run-tests: +[0-9.]+ min' \
    "$WORK/demo.log" "$WORK/test.log" || true
echo "test-fresh: both took $(( (SECONDS - started) / 60 )) min in a clean Debian 12 root"
if [ -z "$closing" ]; then
    echo "test-fresh: make test printed no closing line (log: $WORK/test.log)"
    exit 1
fi
echo "$closing"
[ "$demo_status" -eq 0 ] && [ "$test_status" -eq 0 ]
exit
}
