#!/bin/bash
# Configure (when the tree or the arguments changed) and build a CPython
# tree in place: tools/build.sh DIR [CONFIGURE ARGS...]
# (e.g. --without-frame-pointers, or CFLAGS="..." as one argument).
# BUILD_JOBS: parallel make jobs (default: the number of CPUs).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
dir=$1; shift
args="$*"
# The arguments of the last configure: inside .git in an assembled tree
# (export would take a file beside the sources for a new one), beside the
# sources in a plain unpacked tree (tools/bench-stock.sh).
stamp=$dir/.configure-args
if [ -d "$dir/.git" ]; then
    stamp=$dir/.git/configure-args
fi
nproc=${BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
started=$SECONDS

if [ ! -f "$dir/Makefile" ] || [ "$(cat "$stamp" 2>/dev/null)" != "$args" ]; then
    # Objects do not depend on the compiler flags, nor a PGO build's
    # profile on anything: what was built with other arguments goes.
    if [ -f "$dir/Makefile" ]; then
        echo "build: the arguments changed: make clean in $dir" >&2
        make -C "$dir" -s clean >/dev/null 2>&1 || true
    fi
    echo "build: configuring $dir ${args:+($args)}" >&2
    (cd "$dir" && ./configure -q "$@" >configure.out 2>&1) || {
        tail -30 "$dir/configure.out" >&2
        echo "build: configure failed; full log in $dir/config.log" >&2
        exit 1
    }
    echo "$args" >"$stamp"
fi
# CPython's own Makefile re-runs config.status when configure changed.
if make -C "$dir" -q -s python >/dev/null 2>&1 && [ -x "$dir/python" ]; then
    exit 0
fi
# A PGO build's profile describes the sources it was trained on: GCC
# rejects it for a changed file, so the training runs again.
if [ -f "$dir/profile-run-stamp" ]; then
    echo "build: sources changed since the PGO training: make clean in $dir" >&2
    make -C "$dir" -s clean >/dev/null 2>&1 || true
fi
# Times measured from scratch on 2 cores (bench/README.md, "Build times").
case " $args " in
*" --enable-optimizations "*) took="PGO + LTO: 17 to 30 minutes" ;;
*) took="about 5 minutes" ;;
esac
echo "build: compiling $dir with $nproc jobs ($took from scratch on 2 cores)" >&2
make -C "$dir" -s -j"$nproc" >"$dir/build.log" 2>&1 || {
    # grep -m, not | head: under pipefail an early-exiting reader fails
    # the pipeline, and so would grep finding nothing.
    grep -m 30 -E 'error|Error' "$dir/build.log" >&2 || true
    echo "build: make failed; full log in $dir/build.log" >&2
    exit 1
}
# A cross build's interpreter does not run here (tools/build-aarch64.sh).
version=$("$dir/python" -c 'import sys; print(sys.version.split()[0])' 2>/dev/null) ||
    version="built for $(sed -n 's/^MULTIARCH=[[:space:]]*//p' "$dir/Makefile")"
echo "build: $version at $dir/python ($((SECONDS - started)) s)" >&2
