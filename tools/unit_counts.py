"""Run test modules with unittest and account for every test case.

    python tools/unit_counts.py [--without-host-tools] [--after-first-tree]
                                OUT.json MODULE...

Runs in the interpreter under test (run_tests.py starts it).  Each test
case ends in exactly one outcome, written to OUT.json as
{"passed": [...], "failed": [[id, why], ...], "skipped": [[id, why], ...]}:

* a failing subTest is one failure each (unittest reports neither success
  nor failure for the test around it);
* a skip or error in setUpModule/setUpClass is an outcome of every test
  case of that module/class, with its reason;
* an error in tearDownClass/tearDownModule, or a module that cannot be
  imported, is a failure of its own;
* a test case that never reported anything is a failure.

--without-host-tools (under qemu-user) leaves out the test cases marked
needs_host in test_perf_profiler/util.py; OUT.json lists them as
"left_out" with the tools they need.  --after-first-tree (make test's
later native trees) leaves out those marked once_per_run, which ran with
the first tree.

(Where tests are required, CI=true or PERF_TESTS_REQUIRED=1, our tests
turn their own skips for want of perf, gdb, ptrace, mounts or cross tools
into failures: see skip_environment() in test_perf_profiler/util.py.)
"""

import faulthandler
import json
import re
import sys
import traceback
import unittest

# An error holder's description: "setUpClass (package.module.Class)".
FIXTURE_RE = re.compile(r"^(setUpModule|setUpClass|tearDownClass|"
                        r"tearDownModule) \((.+)\)$")

# Seconds one module may run before its stacks are dumped and it is ended.
MODULE_TIMEOUT = 40 * 60


def iter_cases(suite):
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            yield from iter_cases(item)
        else:
            yield item


class CountingResult(unittest.TextTestResult):
    """A TextTestResult that also keeps the outcome of each test object
    (not id: a class bound under two names runs its tests twice)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.outcomes = {}          # id(test) -> (kind, why)
        self.subtest_failures = {}  # id(test) -> [[subtest id, why], ...]
        self.subtest_skips = {}     # id(test) -> why
        self.fixtures = []          # (fixture, scope, kind, why)

    def _record(self, test, kind, why=""):
        match = FIXTURE_RE.match(str(test))
        if isinstance(test, unittest.TestCase) or match is None:
            self.outcomes.setdefault(id(test), (kind, why))
        else:
            self.fixtures.append((match.group(1), match.group(2), kind, why))

    @staticmethod
    def _why(err):
        """The first line of the exception, for the summary (the whole
        traceback is in the log)."""
        text = "".join(traceback.format_exception_only(*err[:2])).strip()
        return (text.splitlines() or [""])[0][:300]

    def addSuccess(self, test):
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._record(test, "failed", self._why(err))

    def addError(self, test, err):
        super().addError(test, err)
        self._record(test, "failed", self._why(err))

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        if isinstance(test, unittest.case._SubTest):
            # A skip inside subTest(): the test around it reports nothing.
            self.subtest_skips.setdefault(id(test.test_case), reason)
        else:
            self._record(test, "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._record(test, "passed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._record(test, "failed", "unexpected success")

    def addSubTest(self, test, subtest, err):
        super().addSubTest(test, subtest, err)
        if err is not None:
            self.subtest_failures.setdefault(id(test), []).append(
                [subtest.id(), self._why(err)])


def belongs_to(test_id, scope):
    return test_id == scope or test_id.startswith(scope + ".")


def account(cases, result):
    """One outcome per test case, plus failures not tied to one case."""
    passed, failed, skipped = [], [], []
    lists = {"passed": passed, "failed": failed, "skipped": skipped}
    for case in cases:
        test_id = case.id()
        kind, why = result.outcomes.get(id(case), (None, ""))
        subtest_failures = result.subtest_failures.get(id(case))
        if subtest_failures:
            # Each failing subtest counts; so does an error of the test's
            # own body after them.
            failed.extend(subtest_failures)
            if kind == "failed":
                failed.append([test_id, why])
            continue
        if kind is None and id(case) in result.subtest_skips:
            kind, why = "skipped", result.subtest_skips[id(case)]
        if kind is None:
            # Never ran: its class or module did not set up.
            for fixture, scope, fkind, fwhy in result.fixtures:
                if (fixture.startswith("setUp")
                        and belongs_to(test_id, scope)):
                    kind, why = fkind, f"{fixture}: {fwhy}"
                    break
            else:
                kind, why = "failed", "did not run and reported nothing"
        if kind == "passed":
            passed.append(test_id)
        else:
            lists[kind].append([test_id, why])
    for fixture, scope, kind, why in result.fixtures:
        if fixture.startswith("tearDown") and kind == "failed":
            failed.append([f"{fixture} ({scope})", why])
    return {"passed": passed, "failed": failed, "skipped": skipped}


def marked(case, attribute):
    """What a test case's method, or else its class, is marked with
    (util.needs_host: perf_needs_host; util.once_per_run: perf_once)."""
    method = getattr(case, getattr(case, "_testMethodName", ""), None)
    return (getattr(method, attribute, None)
            or getattr(type(case), attribute, None))


def without(suite, left_out, why):
    """A copy of `suite` without the cases for which why(case) says why
    they are left out; those go to `left_out` as [id, why]."""
    kept = unittest.TestSuite()
    for item in suite:
        if isinstance(item, unittest.TestSuite):
            kept.addTest(without(item, left_out, why))
        elif (reason := why(item)) is not None:
            left_out.append([item.id(), reason])
        else:
            kept.addTest(item)
    return kept


def left_out_why(host_tools_available, first_tree):
    def why(case):
        tools = marked(case, "perf_needs_host")
        if tools and not host_tools_available:
            return ", ".join(tools)
        once = marked(case, "perf_once")
        if once and not first_tree:
            return "ran with the first tree: " + once
        return None
    return why


def run_module(name, host_tools_available, first_tree):
    loader = unittest.TestLoader()
    try:
        suite = loader.loadTestsFromName(name)
    except unittest.SkipTest as exc:
        return {"passed": [], "failed": [], "skipped": [[name, str(exc)]],
                "module_skipped": True, "successful": True}
    left_out = []
    suite = without(suite, left_out,
                    left_out_why(host_tools_available, first_tree))
    cases = list(iter_cases(suite))
    runner = unittest.TextTestRunner(stream=sys.stdout, verbosity=2,
                                     resultclass=CountingResult)
    faulthandler.dump_traceback_later(MODULE_TIMEOUT, exit=True)
    try:
        result = runner.run(suite)
    finally:
        faulthandler.cancel_dump_traceback_later()
    counts = account(cases, result)
    counts["successful"] = result.wasSuccessful()
    counts["left_out"] = left_out
    return counts


def main():
    args = sys.argv[1:]
    options = {"--without-host-tools", "--after-first-tree"}
    host_tools_available = "--without-host-tools" not in args
    first_tree = "--after-first-tree" not in args
    out, *modules = [arg for arg in args if arg not in options]
    total = {"passed": [], "failed": [], "skipped": [], "left_out": [],
             "module_skipped": False}
    successful = True
    for name in modules:
        counts = run_module(name, host_tools_available, first_tree)
        for kind in ("passed", "failed", "skipped", "left_out"):
            total[kind] += counts.get(kind, [])
        total["module_skipped"] |= counts.get("module_skipped", False)
        successful &= counts["successful"]
    with open(out, "w", encoding="utf-8") as f:
        json.dump(total, f)
    # unittest's own verdict too: the counts must never hide a failure.
    return 0 if successful else 1


if __name__ == "__main__":
    sys.exit(main())
