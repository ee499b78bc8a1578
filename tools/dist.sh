#!/bin/bash
# make dist: the whole project as one patch for the pristine CPython 3.11.2
# source (the unpacked Python-3.11.2.tgz), for other people's builds:
#   tools/dist.sh OUT
# OUT holds the overlay files, patches/ and the configure and
# pyconfig.h.in regenerated with autoconf 2.69, so it applies with
# `patch -p1` (or `git apply`, or `pyenv install --patch`) and needs no
# autoconf afterwards.  It is the diff between the two commits of a tree
# assembled for it alone ($TREE, default build/cpython-dist), never edited
# and never built: it holds what the repository holds, nothing a developer
# left in build/cpython.  Same repository, same bytes: no timestamps, no
# index lines, and OUT is only rewritten when its content changes.
set -euo pipefail
export TREE=${TREE:-$(dirname "$0")/../build/cpython-dist}
. "$(dirname "$0")/lib.sh"
OUT=$(realpath -m "${1:?usage: tools/dist.sh OUT}")
say() { echo "dist: $*" >&2; }

"$ROOT/tools/assemble.sh"
new=$OUT.tmp.$$
trap 'rm -f "$new"' EXIT
mkdir -p "$(dirname "$OUT")"
{
    echo "Perf trampolines for CPython 3.11.2: Linux perf sees Python functions"
    echo "(-X perf, -X perf_jit, PYTHONPERFSUPPORT=1, sys.activate_stack_trampoline)."
    echo "Apply it with patch -p1 in Python-3.11.2/, unpacked from Python-3.11.2.tgz,"
    echo "then ./configure and make as usual (configure is already regenerated)."
    echo
    tree_diff pristine overlay
} >"$new"
# GNU patch cannot apply git's binary diffs.
if grep -q '^Binary files ' "$new"; then
    say "error: the overlay holds binary files, which patch -p1 cannot create:"
    grep '^Binary files ' "$new" >&2
    exit 1
fi
if cmp -s "$new" "$OUT"; then
    say "$OUT is current"
else
    mv "$new" "$OUT"
    say "wrote $OUT"
fi
say "$(grep -c '^diff --git ' "$OUT") files, $(wc -c <"$OUT") bytes"
