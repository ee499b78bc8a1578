#!/bin/bash
# make bench: build the unpatched 3.11.2 baseline if needed, then run the
# bench/ workloads on stock, ours (perf off and -X perf) and upstream
# 3.12/3.13 when present, then memory per code object and the cost of fork
# (bench/side_costs.py).  Prints the tables; writes build/bench/results.json.
# Variables: BENCH_RUNS, BENCH_FILTER, BENCH_UPSTREAM (see bench/README.md).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
[ -x "$PYTHON" ] || { echo "bench: $PYTHON is not built (run 'make')" >&2; exit 1; }

"$ROOT/tools/bench-stock.sh" "$ROOT/build/cpython-stock"

# The driver is plain Python 3; any python3 will do, ours as a fallback.
driver=$(command -v python3 || echo "$PYTHON")
"$driver" "$ROOT/bench/run_bench.py" \
    --ours "$PYTHON" --stock "$ROOT/build/cpython-stock/python" "$@"
echo
"$driver" "$ROOT/bench/side_costs.py" "$PYTHON"
