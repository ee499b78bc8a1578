#!/bin/bash
# make ext: build perftramp311 (ext/) for each stock CPython 3.11 here,
# the way the README tells its users to install it: Debian's
# /usr/bin/python3.11 always, pyenv's 3.11.x where pyenv has one.  For
# each, a venv of that interpreter, build/ext/venv-NAME, gets
# `pip install ./ext` (the interpreter's own pip and the in-tree build
# backend, ext/perftramp311_build.py: nothing else, offline), and its
# wheel is built into build/ext/dist/NAME/.  The sdist, the standalone
# source, goes to build/ext/dist/.  tools/run_tests.py runs ext/tests
# with every such venv.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
OUT=$ROOT/build/ext
say() { echo "ext: $*" >&2; }

interpreters=("debian:/usr/bin/python3.11")
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
for py in "$pyenv_root"/versions/3.11.*/bin/python3.11; do
    if [ -x "$py" ]; then
        version=${py#"$pyenv_root"/versions/}
        interpreters+=("pyenv-${version%%/*}:$py")
    fi
done

[ -x /usr/bin/python3.11 ] || {
    say "error: /usr/bin/python3.11 is missing (make deps-test installs it)"
    exit 1
}
mkdir -p "$OUT/dist"
cd "$ROOT"
for entry in "${interpreters[@]}"; do
    name=${entry%%:*}
    py=${entry#*:}
    venv=$OUT/venv-$name
    say "$name: $py: pip install ./ext into $venv"
    rm -rf "$venv" "$OUT/dist/$name"
    "$py" -m venv "$venv"
    "$venv/bin/pip" install ./ext
    "$venv/bin/pip" wheel -q --no-deps -w "$OUT/dist/$name" ./ext
    "$venv/bin/python" -m perftramp311 --status >&2
done
# The hook pip would call; no frontend for sdists comes with 3.11.
rm -f "$OUT"/dist/perftramp311-*.tar.gz
/usr/bin/python3.11 -I -c 'import sys; sys.path.insert(0, "ext")
import perftramp311_build; perftramp311_build.build_sdist(sys.argv[1])' \
    "$OUT/dist"
say "wheels and sdist: $(cd "$OUT" && echo dist/*/*.whl dist/*.tar.gz)"
