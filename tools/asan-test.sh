#!/bin/bash
# make test-asan: build a second tree with AddressSanitizer and
# UndefinedBehaviorSanitizer (configure --with-address-sanitizer
# --with-undefined-behavior-sanitizer) and run our tests with it.
#
# - The tree is build/cpython-asan (ASAN_TREE), assembled from the
#   repository like build/cpython and built with -j$(nproc).
# - ASAN_OPTIONS=detect_leaks=0: CPython does not free everything at exit
#   (interned strings, static types, caches), so LeakSanitizer reports are
#   expected from any CPython and say nothing about us.  Every other ASan
#   check is on, and the first error aborts the process.
# - verify_asan_link_order=0: test_faults' NoExecTests LD_PRELOAD a small
#   shim library ahead of the ASan runtime; the shim only wraps mmap and
#   mprotect and forwards to the next definition (ASan's or libc's).
# - UBSAN_OPTIONS=halt_on_error=1: the first undefined behaviour report
#   fails the test that caused it.
# Child interpreters started by the tests inherit both settings.
# - The runner starts through `tools/tooling.py clean-exec`: without the
#   caller's PYTHON* variables, and with SIGINT and SIGQUIT at their usual
#   actions (a background job inherits them ignored; see
#   tools/regrtest-perf.sh).  The log is build/asan-test.log.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
ASAN_TREE=${ASAN_TREE:-$ROOT/build/cpython-asan}
# ASAN_TESTS: space-separated test names (default: our package).
read -r -a TESTS <<<"${ASAN_TESTS:-test_perf_profiler}"

# Also for the build: it runs the new interpreter (setup.py, sharedmods),
# which would fail on LeakSanitizer's report at exit.
export ASAN_OPTIONS=detect_leaks=0:verify_asan_link_order=0:abort_on_error=1:print_summary=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1:print_summary=1

TREE=$ASAN_TREE "$ROOT/tools/assemble.sh"
"$ROOT/tools/build.sh" "$ASAN_TREE" --with-address-sanitizer \
    --with-undefined-behavior-sanitizer
echo "asan: $ASAN_TREE/python -m test -v ${TESTS[*]} (ASAN_OPTIONS=$ASAN_OPTIONS)"
cd "$ASAN_TREE"
log=$ROOT/build/asan-test.log
set +e
tooling ./python clean-exec ./python -m test -v --timeout 3600 "${TESTS[@]}" \
    2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
# A sanitizer report in a child process shows up in its stderr, which a
# test may have captured and printed: look for any in the whole log.
if grep -E "ERROR: AddressSanitizer|runtime error:|SUMMARY: (Address|UndefinedBehavior)Sanitizer" "$log"; then
    echo "asan: FAILED: sanitizer reports above (full log: $log)"
    exit 1
fi
if [ "$status" -ne 0 ]; then
    echo "asan: FAILED: the tests failed under ASan/UBSan (log: $log)"
    exit "$status"
fi
echo "asan: OK: ${TESTS[*]} passed under ASan/UBSan, no sanitizer reports"
