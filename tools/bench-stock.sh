#!/bin/bash
# Build an unpatched baseline for `make bench`: pristine CPython 3.11.2 from
# the same verified tarball as our tree.  Without configure arguments, it
# gets the frame-pointer flags our patched configure adds by default and
# the Makefile's BASE_FLAGS (the environment passes them) and nothing else,
# so that "ours with perf off / stock" measures the patch and not the
# configuration; with them (make stock-release), exactly those.
#
#   tools/bench-stock.sh [DIR [CONFIGURE ARGS...]]
#                                   (default: build/cpython-stock)
#
# Prints nothing but progress on stderr; skips all work when DIR/python is
# already built from this tarball with these flags.  Configuring and
# compiling is tools/build.sh's job, as for our own trees.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
DIR=${1:-$ROOT/build/cpython-stock}
[ $# -gt 0 ] && shift
args=("$@")
# (BASE_FLAGS unquoted: several arguments)
[ $# -gt 0 ] || args=(CFLAGS="-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer" ${BASE_FLAGS:-})
NPROC=$(nproc 2>/dev/null || echo 2)
[ "$NPROC" -gt 2 ] && NPROC=2    # shared machines: never more than 2 jobs
STAMP=$DIR/.bench-stock-stamp

say() { echo "bench-stock: $*" >&2; }

tarball=$("$ROOT/tools/fetch-source.sh")
want="$(sha256sum <"$tarball" | cut -c1-64) ${args[*]}"

if [ -x "$DIR/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
    say "stock $("$DIR/python" -c 'import sys; print(sys.version.split()[0])') already built at $DIR/python"
    exit 0
fi

say "unpacking $tarball into $DIR"
unpack_source "$tarball" "$DIR"

start=$SECONDS
BUILD_JOBS=$NPROC "$ROOT/tools/build.sh" "$DIR" "${args[@]}"
"$DIR/python" -c pass || { say "$DIR/python does not start"; exit 1; }
echo "$want" >"$STAMP"
say "stock $("$DIR/python" -c 'import sys; print(sys.version.split()[0])') built in $((SECONDS - start)) s at $DIR/python"
