#!/bin/bash
# make test-fresh: run the README's two commands as a new user would, in a
# clean Debian 12 root, so that nothing installed on this machine by hand
# can make them pass.
#
# - The root is debootstrap's minbase of bookworm, from the first Debian
#   mirror of this machine's apt configuration.  The bare root is cached
#   as a tarball in the user's cache directory (FRESH_REBUILD=1 makes it
#   anew), so later runs unpack it in seconds.
# - Inside it: the apt sources a Debian 12 install has (release, updates,
#   security), then only the README's prerequisites (git, make,
#   ca-certificates), this machine's network settings (apt proxy, local
#   certificate authorities, npm's configuration), then a clone of this
#   repository's committed HEAD
#   (uncommitted changes are not part of the test), and upstream's perf
#   test files from this machine's pyenv, if it has them.
# - `make demo` and `make test` run in it through chroot with /proc, /sys
#   and /dev mounted, as root, with a minimal environment (CI and
#   PERF_TESTS_REQUIRED are passed on).
# - On every exit path (failure, Ctrl-C, TERM) the processes left in the
#   root are killed, its mounts unmounted and the root removed.
#
# Prints both commands' exit statuses; ends with make test's closing line.
# Needs root.  The root is build/fresh/root (FRESH_DIR), about 3 GB while
# it runs; the logs stay in build/fresh/.
set -euo pipefail
# One compound command: bash reads it whole before running it, so editing
# this file during an (hour-long) run cannot change what the run does.
{
. "$(dirname "$0")/lib.sh"

SUITE=bookworm
PREREQUISITES=(git make ca-certificates)
ARCH=$(dpkg --print-architecture)
BASE=$CACHE_DIR/debian-$SUITE-minbase-$ARCH.tar.gz
WORK=$(realpath -m "${FRESH_DIR:-$ROOT/build/fresh}")
CHROOT=$WORK/root
SRC=/root/perf-trampolines

say() { echo "test-fresh: $*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mounts)"
# /proc/self/mounts escapes white space: such a root could not be unmounted.
[[ $CHROOT != *[[:space:]]* ]] || die "FRESH_DIR may not contain white space: $WORK"
"$ROOT/tools/install-deps.sh" fresh

mounts_under() {
    awk -v root="$1" '$2 == root || index($2, root "/") == 1 { print $2 }' \
        /proc/self/mounts | sort -r
}

# Kill what still runs in the root, unmount it, remove it.
remove_root() {
    local proc m
    [ -d "$CHROOT" ] || return 0
    # Processes left in the root (a test's child, a hung build) would keep
    # its mounts busy.
    for proc in /proc/[0-9]*; do
        if [ "$(readlink "$proc/root" 2>/dev/null)" = "$CHROOT" ]; then
            kill -9 "${proc#/proc/}" 2>/dev/null || true
        fi
    done
    for m in $(mounts_under "$CHROOT"); do
        # A slave first: if a signal came between --rbind and
        # --make-rslave, unmounting a shared peer would unmount the
        # host's own mounts under /sys or /dev.
        mount --make-rslave "$m" 2>/dev/null || true
        umount "$m" 2>/dev/null || umount -l "$m" || true
    done
    if [ -n "$(mounts_under "$CHROOT")" ]; then
        say "error: still mounted under $CHROOT; not removing it:"
        mounts_under "$CHROOT" >&2
        return 1
    fi
    # --one-file-system: never descend into anything still mounted.
    rm -rf --one-file-system "$CHROOT"
}

cleanup() {
    local status=$?
    # No second signal may interrupt the unmounting.
    trap '' INT TERM
    trap - EXIT
    remove_root || status=1
    exit $status
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT
trap 'say "terminated"; exit 143' TERM

in_root() { chroot "$CHROOT" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    ${CI:+CI=$CI} ${PERF_TESTS_REQUIRED:+PERF_TESTS_REQUIRED=$PERF_TESTS_REQUIRED} \
    "$@"; }

# (awk reads everything: an early exit would fail the pipeline)
mirror=$(apt_mirrors | awk '!/security/ && !found++')
security=$(apt_mirrors | awk '/security/ && !found++')
[ -n "$mirror" ] || die "no Debian mirror in this machine's apt configuration"

if [ -d "$CHROOT" ]; then
    say "removing the root a previous run left in $CHROOT"
    remove_root || die "cannot remove $CHROOT"
fi
mkdir -p "$CHROOT"

if [ -f "$BASE" ] && [ -z "${FRESH_REBUILD:-}" ]; then
    say "unpacking the cached $SUITE minbase root ($BASE)"
    tar -xzpf "$BASE" -C "$CHROOT"
else
    say "debootstrap --variant=minbase $SUITE from $mirror (a few minutes)"
    debootstrap --variant=minbase "$SUITE" "$CHROOT" "$mirror" \
        >"$WORK/debootstrap.log" 2>&1 ||
        { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
    mkdir -p "$CACHE_DIR"
    tar -czpf "$BASE.tmp.$$" -C "$CHROOT" . && mv "$BASE.tmp.$$" "$BASE"
fi

# What a Debian 12 installation from the same mirror has configured.
{
    printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' \
        "$mirror" "$SUITE" "$SUITE"
    printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    if [ -n "$security" ]; then
        printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' \
            "$security" "$SUITE"
        printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
    fi
} >"$CHROOT/etc/apt/sources.list.d/debian.sources"
rm -f "$CHROOT/etc/apt/sources.list"
cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
# An apt proxy this machine needs, the root needs too.
apt-config dump | grep -i '::proxy' >"$CHROOT/etc/apt/apt.conf.d/90proxy" || true

# The root is a mount point, as / is on a real system (unshare's private
# propagation, which the tests use, needs one).
mount --bind "$CHROOT" "$CHROOT"
mount --make-private "$CHROOT"
mount -t proc proc "$CHROOT/proc"
for m in sys dev; do
    mount --rbind "/$m" "$CHROOT/$m"
    mount --make-rslave "$CHROOT/$m"
done

say "installing the README's prerequisites: ${PREREQUISITES[*]}"
in_root apt-get update -qq >"$WORK/prerequisites.log" 2>&1 &&
    in_root apt-get install -y -qq "${PREREQUISITES[@]}" >>"$WORK/prerequisites.log" 2>&1 ||
    { tail -20 "$WORK/prerequisites.log" >&2; die "installing the prerequisites failed"; }
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
# Upstream CPython's own perf tests, which test_upstream runs unchanged,
# where this machine has them (pyenv's 3.12.1 and 3.13.0): their test
# files alone, at the same place under the root's ~/.pyenv.
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
for f in "$pyenv_root"/versions/3.1[23].*/lib/python3.1[23]/test/test_perf{_profiler,maps}.py; do
    [ -f "$f" ] || continue
    dest=$CHROOT/root/.pyenv/${f#"$pyenv_root"/}
    mkdir -p "$(dirname "$dest")"
    cp "$f" "$dest"
done

# Each command runs in the background and is waited for: bash runs a trap
# only between commands, and `wait` is the one a signal cuts short, so
# TERM or Ctrl-C cleans up at once (cleanup kills what runs in the root).
started=$SECONDS
say "== make demo (in the fresh root) =="
set +e
in_root make -C "$SRC" demo &
wait $!
demo_status=$?
demo_minutes=$(( (SECONDS - started) / 60 ))
say "== make test (in the fresh root) =="
(in_root make -C "$SRC" test 2>&1 | tee "$WORK/test.log"
 exit "${PIPESTATUS[0]}") &
wait $!
test_status=$?
set -e
closing=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped$' "$WORK/test.log" |
          tail -1 || true)
echo
echo "test-fresh: make demo exited $demo_status ($demo_minutes min)"
echo "test-fresh: make test exited $test_status"
echo "test-fresh: both took $(( (SECONDS - started) / 60 )) min in a clean Debian 12 root"
if [ -z "$closing" ]; then
    echo "test-fresh: make test printed no closing line (log: $WORK/test.log)"
    exit 1
fi
echo "$closing"
[ "$demo_status" -eq 0 ] && [ "$test_status" -eq 0 ]
exit
}
