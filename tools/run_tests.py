"""Run the project's tests and print one closing line of counts.

CPython's runner (python -m test) reports test modules, not test cases, so
we ask it for a JUnit XML file and count the cases in it.  The tooling tests
(tools/test_tooling.py) run in this process with unittest.  A test module
that crashed or failed to load shows up as a regrtest failure without a
failing case; it is counted as one failed case so it cannot go unnoticed.
"""

import os
import signal
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.environ.get("TREE", os.path.join(ROOT, "build", "cpython"))

# Ours first, then the upstream tests covering what we patch.
REGRTESTS = ["test_perf_profiler", "test_sys", "test_cmd_line", "test_embed",
             "test_capi", "test_sysconfig", "test_threading", "test_os",
             "test_generators", "test_exceptions", "test_sys_settrace",
             "test_subprocess", "test_multiprocessing_fork"]


def count_junit(path):
    passed = failed = skipped = 0
    for case in ET.parse(path).iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
        elif "skipped" in kinds:
            skipped += 1
            # Our own skips must be visible: each names its reason.
            name = case.get("name", "")
            if "test_perf_profiler" in name:
                element = case.find("skipped")
                reason = element.get("message") or (element.text or "").strip()
                print(f"run-tests: skipped {name}: {reason}")
        else:
            passed += 1
    return passed, failed, skipped


def clean_environment():
    """os.environ without PYTHON* variables: CPython's tests expect the
    interpreter's defaults (e.g. test_cmd_line fails under
    PYTHONUNBUFFERED), and a PYTHONPERFSUPPORT from outside would change
    what our tests see."""
    dropped = sorted(k for k in os.environ if k.startswith("PYTHON"))
    if dropped:
        print("run-tests: running without", " ".join(dropped), flush=True)
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}


def run_regrtests(tests, extra_args):
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        cmd = [sys.executable, "-m", "test", "-j", str(os.cpu_count() or 2),
               "--timeout", "1200", "--junit-xml", xml, *extra_args, *tests]
        print("run-tests:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=TREE, env=clean_environment())
        counts = count_junit(xml) if os.path.exists(xml) else (0, 0, 0)
    passed, failed, skipped = counts
    if proc.returncode != 0 and failed == 0:
        print(f"run-tests: regrtest exited {proc.returncode} without a "
              "failing case: counting one failure", flush=True)
        failed = 1
    return passed, failed, skipped


def run_tooling_tests():
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    suite = unittest.defaultTestLoader.loadTestsFromName("test_tooling")
    print("run-tests: tools/test_tooling.py", flush=True)
    result = unittest.TextTestRunner(verbosity=2).run(suite)
    failed = len(result.failures) + len(result.errors)
    skipped = len(result.skipped)
    return result.testsRun - failed - skipped, failed, skipped


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
    totals = [0, 0, 0]
    for counts in (run_regrtests(tests, sys.argv[1:]), run_tooling_tests()):
        totals = [a + b for a, b in zip(totals, counts)]
    passed, failed, skipped = totals
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
