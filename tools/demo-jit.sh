#!/bin/bash
# make demo-jit: profile examples/demo.py with -X perf_jit on an interpreter
# built without frame pointers: perf records stacks for DWARF unwinding,
# perf inject --jit merges the unwind info the interpreter wrote to
# /tmp/jit-<pid>.dump, and perf report shows the Python frames.  The
# 32 KiB stack copy (default 8) reaches past deep C frames like printf's.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
OUT=$ROOT/build/demo-jit
rm -rf "$OUT"
mkdir -p "$OUT"
cd "$OUT"
perf_cmd=(perf --buildid-dir "$OUT/debug")

echo "demo-jit: perf record -k 1 --call-graph dwarf,32768 -- $PYTHON -X perf_jit examples/demo.py" >&2
"$PYTHON" -m sysconfig | grep -q no-omit-frame-pointer &&
    echo "demo-jit: note: $PYTHON has frame pointers; perf_jit does not need them" >&2
if ! "${perf_cmd[@]}" record -q -k 1 -e cpu-clock -F 499 --call-graph dwarf,32768 \
        -o perf.data -- "$PYTHON" -X perf_jit "$ROOT/examples/demo.py" 2>record.log; then
    cat record.log >&2
    echo "demo-jit: perf record failed" >&2
    exit 1
fi
pid=$("${perf_cmd[@]}" script -i perf.data -F pid 2>/dev/null | awk 'NF { print $1; exit }')
echo "demo-jit: perf inject --jit (merging /tmp/jit-$pid.dump)" >&2
"${perf_cmd[@]}" inject --jit -i perf.data -o perf.jit.data

echo
echo "== Hottest Python functions, including their callees =="
"${perf_cmd[@]}" report -i perf.jit.data --stdio --children --sort sym -g none \
    --percent-limit 3 2>/dev/null | grep -E '^ +[0-9.]+%.*py::' | head -12 |
    sed -E 's/\[\.\] //'
echo
echo "== One sampled call stack, innermost first =="
"${perf_cmd[@]}" script -i perf.jit.data -F ip,sym 2>/dev/null | awk -v RS= '
    /py::parse/ && /py::handle_request/ { print; exit }' |
    awk '{ $1 = ""; sub(/^ /, ""); print "    " $0 }' | grep -vE '__libc|_start$' | head -24
rm -f /tmp/jitted-"$pid"-*.so
echo
echo "perf data: $OUT/perf.jit.data (explore: perf report -i $OUT/perf.jit.data)"
