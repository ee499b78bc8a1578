"""Run the project's tests and print one closing line of counts.

All of them run with the interpreter of each --tree given (make test:
our build, then the Debian build; by default $TREE), and our package
again, under qemu-user, with the interpreter of each --qemu tree (make
test: the aarch64 build); the counts of all trees add up in the closing
line.  Under qemu, the tests that run host tools on the interpreter
(perf, gdb, bpftrace: marked needs_host in test_perf_profiler/util.py)
are left out: those tools cannot follow an emulated process.  The
native runs hold them.  So are the modules that test only Python code
of the operators' tools (SAME_ON_EVERY_ARCH): they pass or fail alike
on every architecture, and qemu runs each of their processes several
times slower.

CPython's own tests run on the trees given with --tree; a tree given
with --package-tree runs only our package (make test: our build, whose
code the Debian build shares; the Debian build, what the packages ship,
runs CPython's tests too).

Our own package (Lib/test/test_perf_profiler) and the tooling tests
(tools/test_tooling.py) run through tools/unit_counts.py, which accounts
for every test case with unittest's own result: each failing subTest,
each class- or module-level skip or error, with its reason.  The package
being skipped as a whole (a build without the feature) is a failure,
unless the build was configured --disable-perf-trampoline on purpose.

perftramp311, the extension for stock 3.11.x (ext/), is tested with
--ext: ext/tests with the interpreter of every venv make ext built
(build/ext/venv-*: Debian's python3.11, pyenv's 3.11.x where present),
counted the same way.  A missing Debian venv is a failure.

CPython's own tests run with its runner (python -m test), which reports
modules, not cases, so we ask it for a JUnit XML file and count the cases
in it.  A test module that crashed or failed to load shows up as a
regrtest failure without a failing case; it is counted as one failed case
so it cannot go unnoticed.
"""

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import tempfile
import time

import tooling

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TREE = os.path.abspath(os.environ.get("TREE",
                                      os.path.join(ROOT, "build", "cpython")))

# The upstream tests covering what we patch.
REGRTESTS = ["test_sys", "test_cmd_line", "test_embed",
             "test_capi", "test_sysconfig", "test_threading", "test_os",
             "test_generators", "test_yield_from", "test_coroutines",
             "test_asyncgen", "test_types", "test_exceptions",
             "test_sys_settrace", "test_subprocess",
             "test_multiprocessing_fork"]

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
    "test_yield_from", "test_types",
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


# (part, seconds) in the order the parts ended, for the closing table.
TIMES = []


def timed(part, started):
    seconds = time.monotonic() - started
    TIMES.append((part, seconds))
    return seconds


# Modules of our package that test the operators' tools alone (command
# line, output directory, reports, container maps, import layers): no
# code in them differs between architectures, so the run under qemu-user
# leaves them out.
SAME_ON_EVERY_ARCH = {"test_cli", "test_layers", "test_namespaces",
                      "test_record", "test_reports"}
# Modules all of whose cases need host tools (needs_host): under qemu,
# importing one takes minutes only for unit_counts.py to leave each out.
HOST_ONLY = {"test_attach", "test_extensions", "test_oracle",
             "test_perf_record"}


def count_outcomes(cases):
    outcomes = [outcome for _, outcome in cases]
    return (outcomes.count("ok"), outcomes.count("failed"),
            outcomes.count("skipped"))


def known_differences():
    """Tests that legitimately differ under perf, with the reason
    (tools/regrtest_compare.py)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    from regrtest_compare import KNOWN_DIFFERENCES
    return KNOWN_DIFFERENCES


def run_regrtests(tree, tests, extra_args, env_extra=None, part=None):
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as tmp:
        xml = os.path.join(tmp, "junit.xml")
        # -w: a failing test runs again, alone; its second outcome counts
        # (timing tests such as lock_tests' barrier timeouts fail now and
        # then on a loaded 2-core machine), and it is named as flaky.
        cmd = [os.path.join(tree, "python"), "-m", "test",
               "-j", str(os.cpu_count() or 2), "--timeout", "1200", "-w",
               "--junit-xml", xml, *extra_args, *tests]
        print("run-tests:", " ".join(cmd), flush=True)
        proc = subprocess.run(cmd, cwd=tree,
                              env=tooling.clean_environment(env_extra))
        cases = tooling.junit_cases(xml)
        for name in tooling.rerun_cases(xml):
            print(f"run-tests: flaky, failed and then passed alone: {name}",
                  flush=True)
    passed, failed, skipped = count_outcomes(cases or [])
    if proc.returncode != 0 and failed == 0:
        print(f"run-tests: regrtest exited {proc.returncode} without a "
              "failing case: counting one failure", flush=True)
        failed = 1
    elif cases is None:
        print("run-tests: regrtest wrote no complete JUnit file: counting "
              "one failure", flush=True)
        failed = 1
    seconds = timed(part or "regrtest", started)
    print(f"run-tests: {part or 'regrtest'}: {passed} passed, {failed} "
          f"failed, {skipped} skipped in {seconds:.0f} s", flush=True)
    return passed, failed, skipped


def feature_disabled_on_purpose(tree):
    args = subprocess.run(
        [os.path.join(tree, "python"), "-c",
         "import sysconfig; print(sysconfig.get_config_var('CONFIG_ARGS'))"],
        capture_output=True, text=True, env=tooling.clean_environment())
    return "--disable-perf-trampoline" in args.stdout


def run_unit_module(python, module, log_dir, qemu, env_extra=None,
                    label=None, first_tree=True):
    """Run one test module with the interpreter under test through
    unit_counts.py; return (label, outcomes, log path, exit status).
    `label` (default: the module) names the logs.  After the first tree,
    the cases marked once_per_run are left out."""
    label = label or module
    out = os.path.join(log_dir, label + ".json")
    log = os.path.join(log_dir, label + ".log")
    try:
        os.unlink(out)          # never read an earlier run's counts
    except FileNotFoundError:
        pass
    started = time.monotonic()
    env = tooling.clean_environment(env_extra)
    if qemu:
        env["PERF_TESTS_QEMU"] = os.path.join(os.path.dirname(python),
                                              "run-qemu")
        # A native interpreter: the tests' second build is their own.
        env.pop("PERF_NOFP_PYTHON", None)
    with open(log, "w") as f:
        proc = subprocess.run(
            [python, os.path.join(ROOT, "tools", "unit_counts.py"),
             *(["--without-host-tools"] if qemu else []),
             *([] if first_tree else ["--after-first-tree"]), out, module],
            stdout=f, stderr=subprocess.STDOUT, cwd=log_dir, env=env)
    outcomes_seconds = time.monotonic() - started
    try:
        with open(out, encoding="utf-8") as f:
            outcomes = json.load(f)
    except (OSError, ValueError):
        outcomes = {"passed": [], "skipped": [],
                    "failed": [[module, f"runner exited {proc.returncode} "
                                f"without counts (log: {log})"]]}
    outcomes["seconds"] = outcomes_seconds
    return label, outcomes, log, proc.returncode


def our_modules(tree):
    package = os.path.join(tree, "Lib", "test", "test_perf_profiler")
    names = sorted(name[:-3] for name in os.listdir(package)
                   if name.startswith("test_") and name.endswith(".py"))
    return [f"test.test_perf_profiler.{name}" for name in names]


# The units that take longest (natively, then under qemu), started first
# so that the two running at a time end together: in alphabetical order
# test_tooling (17 minutes on a busy machine) started last and ran alone
# at the end.
LONGEST_FIRST = ["test_tooling", "test_upstream", "test_oracle", "test_stress",
                 "test_faults", "test_semantics", "test_perf", "test_capi",
                 "test_record", "test_map_writes"]


def longest_first(unit):
    name = unit.rsplit(".", 1)[-1]
    return (LONGEST_FIRST.index(name) if name in LONGEST_FIRST
            else len(LONGEST_FIRST))


def run_unit_tests(tree, modules, log_dir, qemu=False, first_tree=True):
    """Our package's modules (and the tooling tests), two at a time, the
    longest first."""
    modules = sorted(modules, key=longest_first)
    python = os.path.join(tree, "python-qemu" if qemu else "python")
    os.makedirs(log_dir, exist_ok=True)
    totals = [0, 0, 0]
    jobs = min(len(modules), os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
        for module, outcomes, log, status in pool.map(
                lambda m: run_unit_module(python, m, log_dir, qemu,
                                          first_tree=first_tree),
                modules):
            if (outcomes.get("module_skipped")
                    and not feature_disabled_on_purpose(tree)):
                outcomes["failed"], outcomes["skipped"] = (
                    outcomes["skipped"], [])
            elif outcomes.get("module_skipped"):
                print(f"run-tests: {module} skipped: this build was "
                      "configured --disable-perf-trampoline")
            counts = report_unit(module, outcomes, log, status)
            totals = [a + b for a, b in zip(totals, counts)]
    return totals


def report_unit(label, outcomes, log, status):
    """Print one module's outcomes (its log too if it failed); return its
    counts."""
    passed = outcomes["passed"]
    failed = outcomes["failed"]
    skipped = outcomes["skipped"]
    left_out = outcomes.get("left_out", [])
    print(f"run-tests: {label}: {len(passed)} passed, "
          f"{len(failed)} failed, {len(skipped)} skipped"
          f"{f', {len(left_out)} left out' if left_out else ''} "
          f"in {outcomes.get('seconds', 0):.0f} s (log: {log})", flush=True)
    for test_id, why in skipped:
        print(f"run-tests:   skipped {test_id}: {why}")
    for test_id, why in failed:
        print(f"run-tests:   FAILED {test_id}: {why}")
    if failed or status != 0:
        with open(log, errors="backslashreplace") as f:
            sys.stdout.write(f.read())
    if status != 0 and not failed:
        failed = [[label, f"exited {status}"]]
    return len(passed), len(failed), len(skipped)


def run_ext_tests(patched_tree):
    """ext/tests with every venv of build/ext (tools/ext.sh); return the
    counts.  The patched interpreter of `patched_tree` is the one on
    which the package must leave the built-in feature in charge."""
    ext_dir = os.path.join(ROOT, "build", "ext")
    venvs = sorted(name for name in (os.listdir(ext_dir)
                                     if os.path.isdir(ext_dir) else [])
                   if name.startswith("venv-"))
    totals = [0, 0, 0]
    if "venv-debian" not in venvs:
        print("run-tests: FAILED perftramp311: not built for Debian's "
              "python3.11 (make ext)", flush=True)
        totals[1] += 1
    log_dir = os.path.join(ROOT, "build", "test-logs", "ext")
    os.makedirs(log_dir, exist_ok=True)
    env_extra = {
        "PYTHONPATH": os.path.join(ROOT, "ext", "tests"),
        "PERFTRAMP311_PATCHED_PYTHON": os.path.join(patched_tree, "python")}
    for venv in venvs:
        python = os.path.join(ext_dir, venv, "bin", "python")
        counts = report_unit(*run_unit_module(
            python, "test_perftramp311", log_dir, False, env_extra,
            label=f"perftramp311-{venv}"))
        totals = [a + b for a, b in zip(totals, counts)]
    return totals


def run_tree(tree, regrtest_args, ignored, tooling_tests, regrtests=True,
             first_tree=True):
    """Our package (and the tooling tests), then (with `regrtests`) the
    regression tests, with the interpreter of `tree`, the second pass
    without the tests `ignored` (regrtest's -i options); return the
    counts.  After the first tree, our package leaves out what runs once
    (util.once_per_run)."""
    tests = [t for t in REGRTESTS
             if os.path.exists(os.path.join(tree, "Lib", "test", t))
             or os.path.exists(os.path.join(tree, "Lib", "test", t + ".py"))]
    under_perf = list(dict.fromkeys(REGRTESTS_UNDER_PERF))
    # One directory of logs per tree.
    log_dir = os.path.join(ROOT, "build", "test-logs", os.path.basename(tree))
    then = (", then CPython's, then CPython's again with "
            "PYTHONPERFSUPPORT=1" if regrtests else "")
    print(f"run-tests: {tree}: our tests"
          f"{' and the tooling tests' if tooling_tests else ''}{then} "
          f"(logs in {log_dir})", flush=True)
    units = our_modules(tree) + (["test_tooling"] if tooling_tests else [])
    name = os.path.basename(tree)
    started = time.monotonic()
    totals = run_unit_tests(tree, units, log_dir, first_tree=first_tree)
    timed(f"{name}: our package"
          f"{' and the tooling tests' if tooling_tests else ''}", started)
    if regrtests:
        for counts in (run_regrtests(tree, tests, regrtest_args,
                                     part=f"{name}: CPython's tests"),
                       run_regrtests(tree, under_perf,
                                     [*ignored, *regrtest_args],
                                     {"PYTHONPERFSUPPORT": "1"},
                                     part=f"{name}: CPython's tests "
                                     "under perf")):
            totals = [a + b for a, b in zip(totals, counts)]
    print(f"run-tests: {tree}: {totals[0]} passed, {totals[1]} failed, "
          f"{totals[2]} skipped", flush=True)
    return totals


def run_qemu_tree(tree):
    """Our package with the interpreter of `tree` under qemu-user
    (tools/build-aarch64.sh); return the counts."""
    log_dir = os.path.join(ROOT, "build", "test-logs", os.path.basename(tree))
    print(f"run-tests: {tree}: our tests under qemu-user, less those that "
          f"run host tools on the interpreter (logs in {log_dir})",
          flush=True)
    modules = [m for m in our_modules(tree)
               if m.rsplit(".", 1)[-1] not in SAME_ON_EVERY_ARCH | HOST_ONLY]
    print("run-tests: left out under qemu-user, as they test no code that "
          "differs between architectures:", *sorted(SAME_ON_EVERY_ARCH))
    print("run-tests: ... and as every case of theirs needs host tools:",
          *sorted(HOST_ONLY))
    started = time.monotonic()
    totals = run_unit_tests(tree, modules, log_dir, qemu=True)
    timed(f"{os.path.basename(tree)}: our package under qemu-user", started)
    print(f"run-tests: {tree} (qemu): {totals[0]} passed, {totals[1]} "
          f"failed, {totals[2]} skipped", flush=True)
    return totals



def main():
    parser = argparse.ArgumentParser(
        description="Run our tests and CPython's with the interpreter of "
        "each --tree (default: $TREE), and ours under qemu-user with that "
        "of each --qemu tree; other arguments go to regrtest.")
    parser.add_argument("--tree", action="append", default=[],
                        help="a built tree to test")
    parser.add_argument("--package-tree", action="append", default=[],
                        metavar="TREE", help="a built tree to run our "
                        "package with, not CPython's tests")
    parser.add_argument("--qemu", action="append", default=[],
                        metavar="TREE", help="a tree built by "
                        "tools/build-aarch64.sh, to test under qemu-user")
    parser.add_argument("--no-tooling", action="store_true",
                        help="leave out the tooling tests (they check the "
                        "repository's tools, not an interpreter)")
    parser.add_argument("--ext", action="store_true",
                        help="also test perftramp311 with every venv of "
                        "build/ext (make ext)")
    options, regrtest_args = parser.parse_known_args()
    package_trees = [os.path.abspath(t) for t in options.package_tree]
    trees = package_trees + [os.path.abspath(t) for t in options.tree]
    if not trees and not options.qemu:
        trees = [TREE]
    # The tests about KeyboardInterrupt need SIGINT's usual action even
    # when this runs in the background.
    tooling.restore_signals()
    # Every test process runs without the caller's PYTHON* variables:
    # CPython's tests expect the interpreter's defaults (test_cmd_line
    # fails under PYTHONUNBUFFERED), and a PYTHONPERFSUPPORT from outside
    # would change what our tests see.
    dropped = tooling.python_variables()
    if dropped:
        print("run-tests: running without", " ".join(dropped), flush=True)
    before = tooling.profiler_files()
    ignored = []
    for test_id, reason in known_differences().items() if trees else ():
        print(f"run-tests: under perf, not running {test_id}: {reason}")
        ignored += ["-i", test_id.rsplit(".", 1)[-1]]
    totals = [0, 0, 0]
    for i, tree in enumerate(trees):
        counts = run_tree(tree, regrtest_args, ignored,
                          tooling_tests=i == 0 and not options.no_tooling,
                          regrtests=tree not in package_trees,
                          first_tree=i == 0)
        totals = [a + b for a, b in zip(totals, counts)]
    for tree in options.qemu:
        counts = run_qemu_tree(os.path.abspath(tree))
        totals = [a + b for a, b in zip(totals, counts)]
    if options.ext:
        started = time.monotonic()
        counts = run_ext_tests(trees[0] if trees else TREE)
        timed("perftramp311 with each venv", started)
        totals = [a + b for a, b in zip(totals, counts)]
    removed = tooling.remove_new_profiler_files(before)
    print(f"run-tests: removed {removed} profiler files left in /tmp")
    print("run-tests: time per part (the builds before: build: lines)")
    for part, seconds in TIMES:
        print(f"run-tests: {seconds / 60:6.1f} min  {part}")
    passed, failed, skipped = totals
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
