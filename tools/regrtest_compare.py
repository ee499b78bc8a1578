"""Compare a plain and a perf regrtest pass (tools/regrtest-perf.sh).

Reads OUT/plain.log and OUT/perf.log (regrtest's closing summary) and
OUT/plain.xml and OUT/perf.xml (JUnit, one <testcase> per test method), and
prints the test files and test methods that pass without perf trampolines
and fail with them.  Each such test file is then run on its own, twice with
PYTHONPERFSUPPORT=1 and twice without, to tell a reproducible failure from a
flaky test.  Exit status: 1 if a perf-only failure reproduces, else 0.

A few tests assert something that legitimately differs with trampolines
on; KNOWN_DIFFERENCES lists them, each with the reason.  A test file whose
only perf-only failures are listed there is reported as such and does not
fail the run; anything else in the same file still does.
"""

import argparse
import os
import re
import subprocess
import sys

import tooling

# "3 tests failed:", "All 400 tests OK.", "1 test altered the execution
# environment:", "12 tests skipped:", ... followed by indented names.
SECTION = re.compile(r"^(?:All )?(\d+) (?:re-run )?tests? (.*?)[:.]$")
CATEGORIES = {
    "OK": "ok",
    "failed": "failed",
    "altered the execution environment": "env_changed",
    "skipped": "skipped",
    "run no tests": "no_tests",
    "omitted": "omitted",
}
# Progress lines: "0:01:02 load avg: 1.50 [ 12/434/1] test_os failed ..."
PROGRESS = re.compile(r"\[\s*\d+/\d+(?:/\d+)?\] (\S+)")
RERUNS = 2

# Test methods that legitimately fail with PYTHONPERFSUPPORT=1: test id ->
# why.  Keep this list short and every entry explained.
KNOWN_DIFFERENCES = {
    "test.test_subprocess.POSIXProcessTestCase.test_pass_fds_redirected":
        "the child (fd_status.py) lists every descriptor it has open; with "
        "PYTHONPERFSUPPORT=1 that includes its own perf map, kept open "
        "from startup like upstream CPython's, at the lowest free number",
}


def parse_summary(path):
    """Return {category: set of test files} from regrtest's summary."""
    with open(path, encoding="utf-8", errors="replace") as f:
        lines = f.read().splitlines()
    starts = [i for i, line in enumerate(lines)
              if line.startswith("== Tests result:")]
    result = {name: set() for name in CATEGORIES.values()}
    result["result"] = None
    if not starts:
        return result
    start = starts[-1]
    result["result"] = lines[start].strip("= ").split(":", 1)[1].strip()
    # "All N tests OK." does not list them: the tests that ran and are in
    # no other category passed.
    ran = set()
    for line in lines[:start]:
        match = PROGRESS.search(line)
        if match:
            ran.add(match.group(1))
    category = None
    for line in lines[start + 1:]:
        match = SECTION.match(line)
        if match:
            category = CATEGORIES.get(match.group(2))
            continue
        if category is None:
            continue
        if line.startswith("    "):
            result[category].update(line.split())
        elif line.strip():
            category = None
    others = set().union(*(result[name] for name in CATEGORIES.values()
                           if name != "ok"))
    result["ok"] |= ran - others
    return result


def parse_junit(path):
    """Return {test id: "ok" | "failed" | "skipped"} from a JUnit file
    ({} when a pass left none)."""
    return dict(tooling.junit_cases(path) or [])


def rerun(args, test, perf, number):
    # Like the passes (tools/regrtest-perf.sh): no PYTHON* variables.
    env = tooling.clean_environment({"PYTHONPERFSUPPORT": "1"} if perf
                                    else None)
    log = os.path.join(args.out, "rerun-%s-%s-%d.log"
                       % (test, "perf" if perf else "plain", number))
    cmd = [args.python, "-m", "test", "-v", "--timeout", str(args.timeout),
           "--tempdir", os.path.join(args.out, "scratch"), test]
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=args.tree, env=env, stdout=f,
                              stderr=subprocess.STDOUT)
    return proc.returncode == 0, log


def duration(out, name):
    try:
        with open(os.path.join(out, name + ".time")) as f:
            seconds = int(f.read())
    except (OSError, ValueError):
        return "?"
    return "%d min %02d s" % divmod(seconds, 60)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", required=True)
    parser.add_argument("--tree", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--timeout", default="1200")
    args = parser.parse_args()
    # The reruns test KeyboardInterrupt too: they inherit SIGINT's and
    # SIGQUIT's actions from here, even when this runs in the background.
    tooling.restore_signals()
    args.python = os.path.abspath(args.python)
    args.tree = os.path.abspath(args.tree)

    plain = parse_summary(os.path.join(args.out, "plain.log"))
    perf = parse_summary(os.path.join(args.out, "perf.log"))
    for name, summary in (("plain", plain), ("perf", perf)):
        print("pass %-5s: %s in %s; %d OK, %d failed, %d env changed, "
              "%d skipped, %d run no tests, %d omitted"
              % (name, summary["result"], duration(args.out, name),
                 len(summary["ok"]), len(summary["failed"]),
                 len(summary["env_changed"]), len(summary["skipped"]),
                 len(summary["no_tests"]), len(summary["omitted"])))
    if plain["result"] is None or perf["result"] is None:
        print("regrtest-perf: a pass has no regrtest summary (crashed or "
              "interrupted runner); see the logs")
        return 1

    plain_good = plain["ok"] | plain["env_changed"]
    perf_bad = perf["failed"] | perf["omitted"]
    perf_only = sorted(perf_bad & plain_good)
    both = sorted(perf_bad & (plain["failed"] | plain["omitted"]))
    plain_only = sorted((plain["failed"] | plain["omitted"]) - perf_bad)
    env_only = sorted(perf["env_changed"] - plain["env_changed"]
                      - plain["failed"])
    skip_diff = sorted(plain["skipped"] ^ perf["skipped"])

    plain_cases = parse_junit(os.path.join(args.out, "plain.xml"))
    perf_cases = parse_junit(os.path.join(args.out, "perf.xml"))
    case_only = sorted(name for name, state in perf_cases.items()
                       if state == "failed"
                       and plain_cases.get(name) == "ok")

    print()
    print("failing in both passes (not caused by perf): %s"
          % (" ".join(both) or "none"))
    print("failing only without perf: %s" % (" ".join(plain_only) or "none"))
    print("environment altered only with perf: %s"
          % (" ".join(env_only) or "none"))
    print("skipped in one pass only: %s" % (" ".join(skip_diff) or "none"))
    print()
    print("TEST FILES THAT PASS WITHOUT PERF AND FAIL WITH IT: %d"
          % len(perf_only))
    for test in perf_only:
        print("    " + test)
    print("TEST METHODS THAT PASS WITHOUT PERF AND FAIL WITH IT: %d"
          % len(case_only))
    for name in case_only:
        print("    " + name)

    # Test files whose perf-only failures are all known differences.
    excused = []
    for test in perf_only:
        failing = [name for name in case_only
                   if name.startswith("test.%s." % test)]
        if failing and all(name in KNOWN_DIFFERENCES for name in failing):
            excused.append(test)
            for name in failing:
                print("known difference, not a bug: %s: %s"
                      % (name, KNOWN_DIFFERENCES[name]))

    confirmed = []
    for test in perf_only:
        if test in excused:
            continue
        perf_results = [rerun(args, test, True, i) for i in range(RERUNS)]
        plain_results = [rerun(args, test, False, i) for i in range(RERUNS)]
        perf_fails = sum(not ok for ok, _ in perf_results)
        plain_fails = sum(not ok for ok, _ in plain_results)
        verdict = ("REPRODUCED" if perf_fails and not plain_fails
                   else "flaky (fails without perf too)" if plain_fails
                   else "not reproduced on its own")
        print("rerun %s: with perf %d/%d failed, without %d/%d failed: %s"
              % (test, perf_fails, RERUNS, plain_fails, RERUNS, verdict))
        print("    logs: " + " ".join(log for _, log in
                                      perf_results + plain_results))
        if verdict == "REPRODUCED":
            confirmed.append(test)
    print()
    if confirmed:
        print("regrtest-perf: FAILED: perf-only failures that reproduce: %s"
              % " ".join(confirmed))
        return 1
    unexplained = [test for test in perf_only if test not in excused]
    if unexplained:
        print("regrtest-perf: WARNING: perf-only failures in the full pass "
              "did not reproduce on their own: %s" % " ".join(unexplained))
    elif excused:
        print("regrtest-perf: OK: no test fails only with perf, apart from "
              "the known differences above")
    else:
        print("regrtest-perf: OK: no test fails only with perf")
    return 0


if __name__ == "__main__":
    sys.exit(main())
