#!/bin/bash
# make demo: profile examples/demo.py under perf with -X perf and show the
# Python functions next to the C functions they call.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
OUT=$ROOT/build/demo
DATA=$OUT/perf.data
mkdir -p "$OUT"

command -v perf >/dev/null || { echo "demo: perf is not installed (make deps)" >&2; exit 1; }
echo "demo: perf record -e cpu-clock -F 999 -g -- $PYTHON -X perf examples/demo.py" >&2
if ! perf record -q -e cpu-clock -F 999 -g -o "$DATA" -- \
        "$PYTHON" -X perf "$ROOT/examples/demo.py" 2>"$OUT/record.log"; then
    cat "$OUT/record.log" >&2
    echo "demo: perf record failed; as non-root, try: sudo sysctl kernel.perf_event_paranoid=1" >&2
    exit 1
fi

echo
echo "== Hottest functions, including time spent in their callees =="
echo "   (py:: entries are Python functions; the others are C)"
perf report -i "$DATA" --stdio --children --sort sym -g none --percent-limit 3 2>/dev/null |
    grep -E '^ +[0-9.]+%' | grep -vE '_start|__libc|Py_BytesMain|pymain_|_PyRun_|run_mod|PyEval_EvalCode' |
    head -25 | sed -E 's/\[\.\] //'

echo
echo "== One sampled call stack, innermost first =="
perf script -i "$DATA" -F ip,sym 2>/dev/null | awk -v RS= '
    /py::parse/ && /py::handle_request/ && !/^[[:space:]]*[0-9a-f]+ _PyEval_EvalFrameDefault/ {
        print; exit }' | awk '{ $1 = ""; sub(/^ /, ""); print "    " $0 }' |
    grep -vE '__libc|_start$' | head -24

echo
echo "perf data: $DATA"
echo "Explore it with:"
echo "    perf report -i $DATA                      # interactive"
echo "    perf report -i $DATA --stdio --children --sort sym"
echo "    perf script -i $DATA                      # every sample's stack"
echo "The names come from /tmp/perf-<pid>.map, which perf reads at report time."
