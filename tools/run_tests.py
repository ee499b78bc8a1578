"""Run the project's tests and print one closing line of counts.

Our own package (Lib/test/test_perf_profiler) and the tooling tests
(tools/test_tooling.py) run through tools/unit_counts.py, which accounts
for every test case with unittest's own result: each failing subTest,
each class- or module-level skip or error, with its reason.  The package
being skipped as a whole (a build without the feature) is a failure,
unless the build was configured --disable-perf-trampoline on purpose.

CPython's own tests run with its runner (python -m test), which reports
modules, not cases, so we ask it for a JUnit XML file and count the cases
in it.  A test module that crashed or failed to load shows up as a
regrtest failure without a failing case; it is counted as one failed case
so it cannot go unnoticed.
"""

import concurrent.futures
import glob
import json
import os
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.environ.get("TREE", os.path.join(ROOT, "build", "cpython"))

# The upstream tests covering what we patch.
REGRTESTS = ["test_sys", "test_cmd_line", "test_embed",
             "test_capi", "test_sysconfig", "test_threading", "test_os",
             "test_generators", "test_exceptions", "test_sys_settrace",
             "test_subprocess", "test_multiprocessing_fork"]

# Then a large part of CPython's suite again with PYTHONPERFSUPPORT=1, so
# that every interpreter the tests start runs with trampolines: the parts
# of the interpreter the fast path and the hook touch (calls, frames,
# tracing, generators, exceptions, threads, signals, fork, GC, code
# objects).  The whole suite, with and without perf, is
# `make test-regrtest-perf` (about an hour on 2 cores: too long for CI).
REGRTESTS_UNDER_PERF = [
    "test_sys", "test_threading", "test_os", "test_subprocess",
    "test_generators", "test_exceptions", "test_sys_settrace", "test_code",
    "test_frame", "test_traceback", "test_coroutines", "test_asyncgen",
    "test_signal", "test_gc", "test_weakref", "test_dis", "test_pdb",
    "test_inspect", "test_functools", "test_contextlib", "test_scope",
    "test_call", "test_class", "test_descr", "test_faulthandler",
    "test_tracemalloc", "test_profile", "test_cprofile", "test_trace",
    "test_bdb", "test_dataclasses", "test_json", "test_re",
    "test_pickle", "test_copy", "test_unittest", "test_doctest",
    "test_importlib", "test_asyncio", "test_concurrent_futures",
    "test_multiprocessing_fork", "test_multiprocessing_forkserver",
    "test_capi", "test_embed", "test_cmd_line", "test_cmd_line_script",
    "test_ctypes", "test_decorators", "test_keywordonlyarg",
    "test_positional_only_arg", "test_grammar", "test_compile",
    "test_exception_group", "test_raise", "test_with", "test_typing",
]


def count_junit(path):
    passed = failed = skipped = 0
    for case in ET.parse(path).iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"} or case.get("status") is None:
            # regrtest names a case only when it reports an outcome; one
            # whose subtests failed reports none.
            failed += 1
        elif "skipped" in kinds:
            skipped += 1
        else:
            passed += 1
    return passed, failed, skipped


def clean_environment(quiet=False):
    """os.environ without PYTHON* variables: CPython's tests expect the
    interpreter's defaults (e.g. test_cmd_line fails under
    PYTHONUNBUFFERED), and a PYTHONPERFSUPPORT from outside would change
    what our tests see."""
    dropped = sorted(k for k in os.environ if k.startswith("PYTHON"))
    if dropped and not quiet:
        print("run-tests: running without", " ".join(dropped), flush=True)
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def known_differences():
    """Tests that legitimately differ under perf, with the reason
    (tools/regrtest_compare.py)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from regrtest_compare import KNOWN_DIFFERENCES
    return KNOWN_DIFFERENCES


def run_regrtests(tests, extra_args, env_extra=None):
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "test", "-j", str(os.cpu_count() or 2),
               "--timeout", "1200", "--junit-xml", xml, *extra_args, *tests]
        print("run-tests:", " ".join(cmd), flush=True)
        env = clean_environment()
        env.update(env_extra or {})
        proc = subprocess.run(cmd, cwd=TREE, env=env)
        counts = count_junit(xml) if os.path.exists(xml) else (0, 0, 0)
    passed, failed, skipped = counts
    if proc.returncode != 0 and failed == 0:
        print(f"run-tests: regrtest exited {proc.returncode} without a "
              "failing case: counting one failure", flush=True)
        failed = 1
    return passed, failed, skipped


def profiler_files():
    return set(glob.glob("/tmp/perf-*.map") + glob.glob("/tmp/jit-*.dump")
               + glob.glob("/tmp/jitted-*.so"))


def remove_new_profiler_files(before, since):
    """Remove the profiler files that processes of this run left in /tmp
    (perf reads them at report time, so nothing else removes them)."""
    removed = 0
    for path in profiler_files() - before:
        try:
            st = os.stat(path)
            if st.st_uid == os.geteuid() and st.st_mtime >= since:
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    print(f"run-tests: removed {removed} profiler files left in /tmp")


def feature_disabled_on_purpose():
    args = sysconfig.get_config_var("CONFIG_ARGS") or ""
    return "--disable-perf-trampoline" in args


def run_unit_module(module, log_dir):
    """Run one test module in the interpreter under test through
    unit_counts.py; return (module, outcomes, log path, exit status)."""
    out = os.path.join(log_dir, module + ".json")
    log = os.path.join(log_dir, module + ".log")
    with open(log, "w") as f:
        proc = subprocess.run(
            [sys.executable, os.path.join(ROOT, "tools", "unit_counts.py"),
             out, module],
            stdout=f, stderr=subprocess.STDOUT, cwd=log_dir,
            env=clean_environment(quiet=True))
    try:
        with open(out, encoding="utf-8") as f:
            outcomes = json.load(f)
    except (OSError, ValueError):
        outcomes = {"passed": [], "skipped": [],
                    "failed": [[module, f"runner exited {proc.returncode} "
                                f"without counts (log: {log})"]]}
    return module, outcomes, log, proc.returncode


def our_modules():
    package = os.path.join(TREE, "Lib", "test", "test_perf_profiler")
    names = sorted(name[:-3] for name in os.listdir(package)
                   if name.startswith("test_") and name.endswith(".py"))
    return [f"test.test_perf_profiler.{name}" for name in names]


def run_unit_tests(modules, log_dir):
    """Our package's modules (and the tooling tests), two at a time."""
    os.makedirs(log_dir, exist_ok=True)
    totals = [0, 0, 0]
    jobs = min(len(modules), os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for module, outcomes, log, status in pool.map(
                lambda m: run_unit_module(m, log_dir), modules):
            passed = outcomes["passed"]
            failed = outcomes["failed"]
            skipped = outcomes["skipped"]
            if outcomes.get("module_skipped"):
                if feature_disabled_on_purpose():
                    print(f"run-tests: {module} skipped: this build was "
                          "configured --disable-perf-trampoline")
                else:
                    failed, skipped = skipped, []
            print(f"run-tests: {module}: {len(passed)} passed, "
                  f"{len(failed)} failed, {len(skipped)} skipped "
                  f"(log: {log})", flush=True)
            for test_id, why in skipped:
                print(f"run-tests:   skipped {test_id}: {why}")
            for test_id, why in failed:
                print(f"run-tests:   FAILED {test_id}: {why}")
            if failed or status != 0:
                with open(log, errors="backslashreplace") as f:
                    sys.stdout.write(f.read())
            if status != 0 and not failed:
                failed = [[module, f"exited {status}"]]
            counts = (len(passed), len(failed), len(skipped))
            totals = [a + b for a, b in zip(totals, counts)]
    return totals


def restore_signals():
    """A shell started in the background (a CI runner, cmd &) hands its
    children SIGINT and SIGQUIT ignored, an ignored disposition survives
    exec, and a Python started that way never raises KeyboardInterrupt:
    every test about it would fail.  Give the tests the usual defaults."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def main():
    restore_signals()
    tests = [t for t in REGRTESTS
             if os.path.exists(os.path.join(TREE, "Lib", "test", t))
             or os.path.exists(os.path.join(TREE, "Lib", "test", t + ".py"))]
    under_perf = list(dict.fromkeys(REGRTESTS_UNDER_PERF))
    ignored = []
    for test_id, reason in known_differences().items():
        print(f"run-tests: under perf, not running {test_id}: {reason}")
        ignored += ["-i", test_id.rsplit(".", 1)[-1]]
    print("run-tests: CPython's tests again with PYTHONPERFSUPPORT=1",
          flush=True)
    before, since = profiler_files(), time.time() - 1
    log_dir = os.path.join(ROOT, "build", "test-logs")
    print("run-tests: our tests and the tooling tests (logs in "
          f"{log_dir})", flush=True)
    totals = [0, 0, 0]
    for counts in (run_unit_tests([*our_modules(), "test_tooling"], log_dir),
                   run_regrtests(tests, sys.argv[1:]),
                   run_regrtests(under_perf, [*ignored, *sys.argv[1:]],
                                 {"PYTHONPERFSUPPORT": "1"})):
        totals = [a + b for a, b in zip(totals, counts)]
    remove_new_profiler_files(before, since)
    passed, failed, skipped = totals
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
