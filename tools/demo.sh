#!/bin/bash
# make demo: profile examples/demo.py under perf with -X perf and show the
# Python functions next to the C functions they call, then write the
# flame graphs (whole stacks and the Python view) and the other reports.
# Exits 0 only if perf's report shows the demo's Python frames.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
OUT=${DEMO_OUT:-$ROOT/build/demo}
DATA=$OUT/perf.data
PERF=${PERF:-perf}
mkdir -p "$OUT"

command -v "$PERF" >/dev/null ||
    { echo "demo: $PERF is not installed (run: make deps)" >&2; exit 1; }
[ -x "$PYTHON" ] || { echo "demo: $PYTHON is not built (run: make)" >&2; exit 1; }
echo "demo: perf record -e cpu-clock -F 999 -g -- $PYTHON -X perf examples/demo.py" >&2
if ! "$PERF" record -q -e cpu-clock -F 999 -g -o "$DATA" -- \
        "$PYTHON" -X perf "$ROOT/examples/demo.py" 2>"$OUT/record.log"; then
    cat "$OUT/record.log" >&2
    echo "demo: perf record failed; as non-root, perf needs kernel.perf_event_paranoid at 2 or lower (sudo sysctl kernel.perf_event_paranoid=2)" >&2
    exit 1
fi

# perf's whole output goes to files first: a filter that stops reading
# early would kill perf with SIGPIPE and fail the pipeline.
"$PERF" report -i "$DATA" --stdio --children --sort sym -g none \
    --percent-limit 3 >"$OUT/report.txt" 2>"$OUT/report.log"
"$PERF" script -i "$DATA" -F ip,sym >"$OUT/script.txt" 2>"$OUT/script.log"

echo
echo "== Hottest functions, including time spent in their callees =="
echo "   (py:: entries are Python functions; the others are C)"
awk '/^ +[0-9.]+%/ && !/_start|__libc|Py_BytesMain|pymain_|_PyRun_|run_mod|PyEval_EvalCode| 0x[0-9a-f]+$/ {
        sub(/\[\.\] /, ""); print; if (++n == 25) exit }' "$OUT/report.txt"

echo
echo "== One sampled call stack, innermost first =="
awk -v RS= '/py::parse/ && /py::handle_request/ &&
            !/^[[:space:]]*[0-9a-f]+ _PyEval_EvalFrameDefault/ { print; exit }' \
    "$OUT/script.txt" >"$OUT/stack.txt"
awk '!/__libc|_start$/ { $1 = ""; sub(/^ /, ""); print "    " $0; if (++n == 24) exit }' \
    "$OUT/stack.txt"

echo
echo "perf data: $DATA"
echo "Explore it with:"
echo "    perf report -i $DATA                      # interactive"
echo "    perf report -i $DATA --stdio --children --sort sym"
echo "    perf script -i $DATA                      # every sample's stack"
echo "The names come from /tmp/perf-<pid>.map, which perf reads at report time."

# The record workflow's reports (perf_trampoline._reports), made by the
# interpreter under test: the flame graphs open offline in a browser.
echo
echo "== Reports (in $OUT) =="
"$PYTHON" -I -c '
import sys
from perf_trampoline import _reports
try:
    reports = _reports.write_reports(*sys.argv[1:])
except _reports.ReportError as exc:
    sys.exit(f"demo: error: the reports were not written: {exc}")
for description, path in reports:
    print(f"    {description}" + (f": {path}" if path else ""))
' "$PERF" "$OUT"

if ! grep -q 'py::handle_request:' "$OUT/report.txt" ||
   [ ! -s "$OUT/stack.txt" ]; then
    echo "demo: error: perf shows no Python frames of examples/demo.py" \
        "(perf report: $OUT/report.txt); is $PYTHON built with perf" \
        "trampolines (sysconfig PY_HAVE_PERF_TRAMPOLINE)?" >&2
    exit 1
fi
