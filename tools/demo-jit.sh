#!/bin/bash
# make demo-jit: profile examples/demo.py with -X perf_jit on an interpreter
# built without frame pointers: perf records stacks for DWARF unwinding,
# perf inject --jit merges the unwind info the interpreter wrote to
# /tmp/jit-<pid>.dump, and perf report shows the Python frames.  The
# 32 KiB stack copy (default 8) reaches past deep C frames like printf's.
# perf >= 6.1 is needed: PERF, default the private copy install-deps.sh
# unpacks.  Exits 0 only if the injected profile shows Python frames.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
PERF=${PERF:-$PRIVATE_PERF}
OUT=$ROOT/build/demo-jit
rm -rf "$OUT"
mkdir -p "$OUT"
cd "$OUT"
[ -x "$PERF" ] || { echo "demo-jit: no $PERF (run: tools/install-deps.sh jit)" >&2; exit 1; }
perf_cmd=("$PERF" --buildid-dir "$OUT/debug")

echo "demo-jit: perf record -k 1 --call-graph dwarf,32768 -- $PYTHON -X perf_jit examples/demo.py" >&2
cflags=$("$PYTHON" -c 'import sysconfig; print(sysconfig.get_config_var("CFLAGS"))')
[[ $cflags != *-fno-omit-frame-pointer* ]] ||
    echo "demo-jit: note: $PYTHON has frame pointers; perf_jit does not need them" >&2
if ! "${perf_cmd[@]}" record -q -k 1 -e cpu-clock -F 499 --call-graph dwarf,32768 \
        -o perf.data -- "$PYTHON" -X perf_jit "$ROOT/examples/demo.py" 2>record.log; then
    cat record.log >&2
    echo "demo-jit: perf record failed" >&2
    exit 1
fi
"${perf_cmd[@]}" script -i perf.data -F pid >pids.txt 2>/dev/null
pid=$(awk 'NF { print $1; exit }' pids.txt)
echo "demo-jit: perf inject --jit (merging /tmp/jit-$pid.dump)" >&2
"${perf_cmd[@]}" inject --jit -i perf.data -o perf.jit.data
# Whole outputs to files first: a filter that stops early would kill perf
# with SIGPIPE and fail the pipeline.
"${perf_cmd[@]}" report -i perf.jit.data --stdio --children --sort sym -g none \
    --percent-limit 3 >report.txt 2>/dev/null
"${perf_cmd[@]}" script -i perf.jit.data -F ip,sym >script.txt 2>/dev/null
rm -f /tmp/jitted-"$pid"-*.so

echo
echo "== Hottest Python functions, including their callees =="
awk '/^ +[0-9.]+%.*py::/ { sub(/\[\.\] /, ""); print; if (++n == 12) exit }' report.txt
echo
echo "== One sampled call stack, innermost first =="
awk -v RS= '/py::parse/ && /py::handle_request/ { print; exit }' script.txt >stack.txt
awk '!/__libc|_start$/ { $1 = ""; sub(/^ /, ""); print "    " $0; if (++n == 24) exit }' stack.txt
echo
echo "perf data: $OUT/perf.jit.data (explore: $PERF report -i $OUT/perf.jit.data)"
if ! grep -q 'py::handle_request:' report.txt || [ ! -s stack.txt ]; then
    echo "demo-jit: error: the injected profile shows no Python frames of" \
        "examples/demo.py (perf report: $OUT/report.txt)" >&2
    exit 1
fi
