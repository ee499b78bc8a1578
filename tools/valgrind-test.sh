#!/bin/bash
# make test-valgrind: valgrind memcheck on a short workload run with
# -X perf by the built interpreter; passes only with "ERROR SUMMARY: 0
# errors".
#
# PYTHONMALLOC=malloc sends every allocation to the C allocator, so
# memcheck sees each object (pymalloc's arenas would hide them and trip
# its uninitialised-read heuristics); Misc/valgrind-python.supp from the
# tree covers the remaining known CPython noise.  Leaks are not checked
# (--leak-check=no): CPython keeps some memory until exit by design, and
# trampoline arenas are never unmapped by design.
#
# -B -X pycache_prefix=<empty dir>: modules are compiled from source, not
# read from .pyc files.  Stock 3.11.2 reads uninitialised memory when
# importlib decodes a .pyc header: int.from_bytes() of zero bytes makes a
# zero-digit int and maybe_small_long() multiplies its size (0) by its
# never-written first digit (_PyLong_FromByteArray, longobject.c); memcheck
# then reports every later use of that small int.  Fixed upstream after
# 3.11.2; it shows with any 3.11.2 build ("python -c pass": 15 errors from
# 4 contexts), so we sidestep it rather than suppress whole call sites.
#
# The workload (tools/valgrind_workload.py) exercises what the C code of
# the trampolines does: trampolined calls of every kind, deep recursion
# past the fast path's stack budget, generators and exceptions through
# trampolines, activate/deactivate cycles, threads, map names that need
# escaping and cutting, and a map write for each new code object.  No
# fork: memcheck follows children poorly and the fork path has its own
# tests.  It runs without the caller's PYTHON* variables and removes its
# own perf map when it ends.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
OUT=${VALGRIND_OUT:-$ROOT/build/valgrind}

command -v valgrind >/dev/null || {
    echo "valgrind: not installed (apt-get install valgrind)" >&2; exit 2; }
[ -x "$PYTHON" ] || { echo "valgrind: $PYTHON is not built (run 'make')" >&2; exit 2; }
mkdir -p "$OUT"
cache=$(mktemp -d)
trap 'rm -rf "$cache"' EXIT
log=$OUT/memcheck.log
echo "valgrind: memcheck on $PYTHON -X perf tools/valgrind_workload.py (log: $log; about a minute)"
set +e
tooling "$PYTHON" clean-exec PYTHONMALLOC=malloc \
    valgrind --tool=memcheck --error-exitcode=99 \
    --leak-check=no --track-origins=yes --num-callers=30 \
    --suppressions="$TREE/Misc/valgrind-python.supp" \
    --log-file="$log" \
    "$PYTHON" -B -X pycache_prefix="$cache" -X perf \
    "$ROOT/tools/valgrind_workload.py" >"$OUT/stdout" 2>"$OUT/stderr"
status=$?
set -e
cat "$OUT/stdout"
grep "ERROR SUMMARY" "$log" | tail -1
if [ "$status" -ne 0 ] || ! grep -q "ERROR SUMMARY: 0 errors" "$log" ||
   [ -s "$OUT/stderr" ] || ! grep -qx "workload done" "$OUT/stdout"; then
    echo "valgrind: FAILED (exit $status): see $log and $OUT/stderr"
    cat "$OUT/stderr"
    exit 1
fi
echo "valgrind: OK: 0 errors"
