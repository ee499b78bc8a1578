#!/bin/bash
# make bench: build the unpatched 3.11.2 baseline if needed, then run the
# bench/ workloads on stock, ours (perf off and -X perf) and upstream
# 3.12/3.13 when present, and the python3.11 of make deb's packages when
# built (unpacked into build/deb/root), then memory per code object and the
# cost of fork (bench/side_costs.py), and what each perf-off change of the
# evaluator patch wins (tools/bench-perf-off.sh).  Prints the tables; writes
# every run's figures to build/bench/, then the ones the documents quote to
# bench/results.json and the documents' tables from it (bench/figures.py).
# Variables: BENCH_RUNS, BENCH_FILTER, BENCH_UPSTREAM (see bench/README.md).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
[ -x "$PYTHON" ] || { echo "bench: $PYTHON is not built (run 'make')" >&2; exit 1; }

"$ROOT/tools/bench-stock.sh" "$ROOT/build/cpython-stock"

# make deb's interpreter runs from where dpkg-deb -x unpacks it: it finds
# its standard library beside it (../lib/python3.11).
shopt -s nullglob
debs=("$ROOT"/build/deb/{python3.11-minimal,libpython3.11-minimal,libpython3.11-stdlib}_*.deb)
shopt -u nullglob
if [ ${#debs[@]} -eq 3 ]; then
    rm -rf "$ROOT/build/deb/root"
    for deb in "${debs[@]}"; do
        dpkg-deb -x "$deb" "$ROOT/build/deb/root"
    done
fi

# The driver is plain Python 3; any python3 will do, ours as a fallback.
driver=$(command -v python3 || echo "$PYTHON")
"$driver" "$ROOT/bench/run_bench.py" \
    --ours "$PYTHON" --stock "$ROOT/build/cpython-stock/python" \
    --json "$ROOT/build/bench/results.json" "$@"
echo
"$driver" "$ROOT/bench/side_costs.py" --json "$ROOT/build/bench/side_costs.json" "$PYTHON"
# Only a whole run measures the perf-off changes (tools/bench-perf-off.sh)
# and replaces the figures the documents quote.
if [ -z "${BENCH_FILTER:-}" ]; then
    echo
    "$ROOT/tools/bench-perf-off.sh" --json "$ROOT/build/bench/perf_off.json"
    "$driver" "$ROOT/bench/figures.py" collect \
        "$ROOT/build/bench/results.json" "$ROOT/build/bench/side_costs.json" \
        "$ROOT/build/bench/perf_off.json"
    "$driver" "$ROOT/bench/figures.py" update
fi
