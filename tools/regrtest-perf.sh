#!/bin/bash
# make test-regrtest-perf: run CPython's own regression suite twice on the
# same build, once plain and once with PYTHONPERFSUPPORT=1, and list every
# test that passes without perf trampolines and fails with them.
#
# Why the environment variable and not -X perf: regrtest's -j workers, and
# every interpreter a test starts with the default environment, inherit it,
# so the whole process tree runs with trampolines.  (Subprocesses started
# with -E or -I, e.g. test.support.script_helper's isolated mode, ignore the
# environment by design and run without perf in both passes.)
#
# Choices, so nothing is excluded silently:
# - Both passes run without any PYTHON* variable of the caller's environment
#   (PYTHONUNBUFFERED, PYTHONDONTWRITEBYTECODE, PYTHONPATH, ...): they change
#   what some stdlib tests see (test_cmd_line's buffering test, test_cppext,
#   test_compileall fail with the first two), in both passes alike.
# - The whole suite, regrtest's default selection.  No test is excluded.
# - Resources: regrtest's defaults (no -u), i.e. tests needing network,
#   largefile, cpu, gui, audio, curses, decimal, subprocess, urlfetch,
#   tzdata or extralargefile resources report "skipped (resource denied)" in
#   both passes.  Set REGRTEST_RESOURCES (e.g. "all,-network") to pass -u.
# - -j$JOBS (default 2) and --timeout $TIMEOUT seconds per test file
#   (default 1200): a hang is reported as a failure, not waited for.
# - Only the failure categories that make regrtest fail (failed, crashed,
#   timed out, interrupted) count.  "Altered the execution environment"
#   differences are printed as notes.
# - Every test file that fails only with perf is run again on its own, twice
#   with perf and twice without, to tell a reproducible failure from a flaky
#   test.  A reproducible perf-only failure makes this script exit 1; one
#   that does not reproduce with perf is printed as a warning (exit 0).
# - A test that asserts something legitimately different with trampolines
#   on (e.g. the set of open descriptors: the perf map is one) is listed,
#   with the reason, in KNOWN_DIFFERENCES in tools/regrtest_compare.py; it
#   is printed as a known difference and does not fail the run.
# - Arguments after the script name are passed to both regrtest runs, e.g.
#   a subset: tools/regrtest-perf.sh test_sys test_os.
#
# Signals: a shell started in the background (cmd &, nohup, CI runners)
# hands its children SIGINT and SIGQUIT ignored, and a Python that starts
# with SIGINT ignored never raises KeyboardInterrupt, so every test about
# KeyboardInterrupt or SIGINT would fail in both passes.  Bash cannot undo
# an ignored-at-entry signal, so each pass starts through
# `tools/tooling.py clean-exec`, which restores their usual actions (and
# drops the PYTHON* variables), then execs the runner.
#
# Same build for both passes: the tree is first copied to build/regrtest/tree
# (cp -a, ~400 MB), so a rebuild of build/cpython during the hour this takes
# cannot change the interpreter between or inside the passes, and the
# runner's scratch files stay out of the main tree.  REGRTEST_SNAPSHOT=0
# runs the tree in place.
#
# Output goes to build/regrtest/: plain.log, perf.log (regrtest output),
# plain.xml, perf.xml (JUnit), rerun-*.log, summary.txt.  The perf maps that
# the run's processes leave in /tmp (one per process, thousands) are removed
# at the end: the files that did not exist before the run and whose process
# is gone (tools/tooling.py remove-profiler-files).
# No "set -e": the passes are expected to exit non-zero (tests that fail
# without perf too); every step's status is checked where it matters.
set -uo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
OUT=${REGRTEST_OUT:-$ROOT/build/regrtest}
JOBS=${JOBS:-2}
TIMEOUT=${TIMEOUT:-1200}

[ -x "$PYTHON" ] || { echo "regrtest-perf: $PYTHON is not built (run 'make')" >&2; exit 2; }
mkdir -p "$OUT"
if [ "${REGRTEST_SNAPSHOT:-1}" != 0 ]; then
    echo "regrtest-perf: copying $TREE to $OUT/tree"
    rm -rf "$OUT/tree"
    cp -a "$TREE" "$OUT/tree" || exit 2
    TREE=$OUT/tree
    PYTHON=$TREE/python
fi
echo "regrtest-perf: interpreter $PYTHON ($("$PYTHON" -E -c 'import sys; print(sys.version.split()[0], sys.version.split("(")[1].split(",")[0])'))"

# --tempdir: regrtest's scratch directory would otherwise be under the
# build directory the interpreter was configured in (the main tree).
mkdir -p "$OUT/scratch"
ARGS=(-j "$JOBS" --timeout "$TIMEOUT" --tempdir "$OUT/scratch")
if [ -n "${REGRTEST_RESOURCES:-}" ]; then
    ARGS+=(-u "$REGRTEST_RESOURCES")
fi

SNAPSHOT=$(mktemp)
tooling "$PYTHON" profiler-snapshot "$SNAPSHOT"

cleanup() {
    local n
    if n=$(tooling "$PYTHON" remove-profiler-files "$SNAPSHOT"); then
        echo "regrtest-perf: removed $n profiler file(s) left in /tmp by this run"
    fi
    rm -f "$SNAPSHOT"
}
trap cleanup EXIT

# run_pass NAME [NAME=VALUE...]: one regrtest pass with these variables;
# its wall time goes to NAME.time.
run_pass() {
    local name=$1
    shift
    local start end
    start=$(date +%s)
    echo "regrtest-perf: pass '$name' started $(date -u +%H:%M:%SZ); log: $OUT/$name.log"
    (cd "$TREE" && tooling "$PYTHON" clean-exec "$@" \
        "$PYTHON" -m test "${ARGS[@]}" \
        --junit-xml "$OUT/$name.xml" "${TEST_ARGS[@]}") >"$OUT/$name.log" 2>&1
    local rc=$?
    end=$(date +%s)
    echo "$((end - start))" >"$OUT/$name.time"
    echo "regrtest-perf: pass '$name' exited $rc after $((end - start)) s"
}

TEST_ARGS=("$@")
rm -f "$OUT"/plain.* "$OUT"/perf.* "$OUT"/rerun-*.log "$OUT"/summary.txt
run_pass plain
run_pass perf PYTHONPERFSUPPORT=1

# Compare, then rerun each perf-only failure on its own to confirm it.
"$PYTHON" -E "$ROOT/tools/regrtest_compare.py" \
    --python "$PYTHON" --tree "$TREE" --out "$OUT" --timeout "$TIMEOUT" \
    | tee "$OUT/summary.txt"
exit "${PIPESTATUS[0]}"
