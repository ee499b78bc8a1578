#!/bin/bash
# Build the unpatched baseline for `make bench`: pristine CPython 3.11.2 from
# the same verified tarball as our tree, configured with the frame-pointer
# flags our patched configure adds by default and nothing else, so that
# "ours with perf off / stock" measures the patch and not the compiler flags.
#
#   tools/bench-stock.sh [DIR]      (default: build/cpython-stock)
#
# Prints nothing but progress on stderr; skips all work when DIR/python is
# already built from this tarball with these flags.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
DIR=${1:-$ROOT/build/cpython-stock}
FLAGS="-fno-omit-frame-pointer -mno-omit-leaf-frame-pointer"
NPROC=$(nproc 2>/dev/null || echo 2)
[ "$NPROC" -gt 2 ] && NPROC=2    # shared machines: never more than 2 jobs
STAMP=$DIR/.bench-stock-stamp

say() { echo "bench-stock: $*" >&2; }

tarball=$("$ROOT/tools/fetch-source.sh")
want="$(sha256sum <"$tarball" | cut -c1-64) CFLAGS=$FLAGS"

if [ -x "$DIR/python" ] && [ "$(cat "$STAMP" 2>/dev/null)" = "$want" ]; then
    say "stock $("$DIR/python" -c 'import sys; print(sys.version.split()[0])') already built at $DIR/python"
    exit 0
fi

say "unpacking $tarball into $DIR"
rm -rf "$DIR"
mkdir -p "$DIR"
tar -xzf "$tarball" -C "$DIR" --strip-components=1

say "configuring (CFLAGS=\"$FLAGS\")"
(cd "$DIR" && ./configure -q CFLAGS="$FLAGS" >configure.out 2>&1) || {
    tail -30 "$DIR/configure.out" >&2
    say "configure failed; full log in $DIR/config.log"
    exit 1
}

say "compiling with $NPROC jobs (about 2-3 minutes on 2 cores)"
start=$SECONDS
make -C "$DIR" -s -j"$NPROC" >"$DIR/build.log" 2>&1 || {
    grep -E 'error|Error' "$DIR/build.log" | head -30 >&2
    say "make failed; full log in $DIR/build.log"
    exit 1
}
"$DIR/python" -c pass || { say "$DIR/python does not start"; exit 1; }
echo "$want" >"$STAMP"
say "stock $("$DIR/python" -c 'import sys; print(sys.version.split()[0])') built in $((SECONDS - start)) s at $DIR/python"
