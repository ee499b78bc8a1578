#!/bin/bash
# make test: run our tests and the regression tests of what we patch with
# the built interpreter's own runner, then print the closing line
# "N passed, N failed, N skipped" (test cases).  Exits non-zero on failure.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
# The private perf (6.12) for the tests: test_jit and record read PERF.
export PERF=${PERF:-$PRIVATE_PERF}
[ -x "$PYTHON" ] || { echo "run-tests: $PYTHON is not built (run 'make')" >&2; exit 1; }
exec "$PYTHON" "$ROOT/tools/run_tests.py" "$@"
