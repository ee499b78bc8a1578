"""Upstream CPython's own perf tests, run unchanged against ours.

CPython 3.12 and 3.13 ship Lib/test/test_perf_profiler.py and
Lib/test/test_perfmaps.py.  A drop-in for their perf support passes them
as they are, so each is copied at run time from pyenv's install of that
release into an empty directory and run there by our interpreter
(sys.executable), in a subprocess of its own.  Every upstream test case
is reported as a subtest of ours: a failure or error fails it; a skip is
accepted only where this machine lacks what the upstream test needs
(skip_environment() says which, and fails instead where tests are
required).  Upstream runs "perf" from PATH: where $PERF names a perf
(tools/run-tests.sh: the newer one tools/install-deps.sh jit unpacks),
that one.  Nothing of upstream's is stored in this repository.

Where pyenv has no copy of a release, its tests are skipped naming the
missing path (a failure where tests are required).
"""

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import unittest

from test import support
from test.test_perf_profiler.util import (
    ProfilerFiles, clean_env, needs_host, pyenv_root, skip_environment,
    tmp_files_lock)

# The releases, and the directory of each one's tests under pyenv's root.
RELEASES = {
    "3.12.1": os.path.join("versions", "3.12.1", "lib", "python3.12",
                           "test"),
    "3.13.0": os.path.join("versions", "3.13.0", "lib", "python3.13",
                           "test"),
}

# Seconds one upstream file may take: test_perf_profiler records several
# perf sessions of a loop of ten million iterations.
UPSTREAM_TIMEOUT = support.LONG_TIMEOUT * 2

# Upstream's skip reasons (their text) that say this machine lacks
# something: what it lacks, and whether that is a failure where tests are
# required.  Any other skip is our build's doing, and a failure: a
# drop-in must not make upstream's tests skip themselves.
MACHINE_SKIPS = {
    "perf command doesn't work":
        ("perf is missing here or may not record this user's processes "
         "(kernel.perf_event_paranoid)", True),
    "test module requires subprocess":
        ("this platform cannot start subprocesses", True),
    "perf command may not work due to a perf bug":
        ("upstream runs -X perf_jit under perf only from perf 6.6 on, and "
         "the perf found is older (Debian 12 ships 6.1; tools/install-deps.sh "
         "jit installs a newer one, which $PERF names)", True),
    "test crash randomly on ASAN/MSAN/UBSAN build":
        ("upstream never runs these tests in a sanitizer build "
         "(gh-109580)", False),
}

# Upstream's perf tests look for -fno-omit-frame-pointer in PY_CORE_CFLAGS.
# A build --with-frame-pointers=python (make release) keeps frame records
# on the Python call chain by other flags, one --without-frame-pointers
# has none: either way upstream declines, and only there may it.
UNWINDING_SKIPS = ("Unwinding is unreliable",
                   "Unwinding is unreliable with frame pointers")
FRAME_POINTERS = sysconfig.get_config_var("FRAME_POINTERS")

# Runs in the child: loads one upstream module by name from the directory
# it was copied to, runs it with unittest, and writes each test case's
# outcome as JSON.  unittest's own report goes to stderr, for a failure
# message.
DRIVER = textwrap.dedent("""\
    import json, sys, traceback, unittest
    directory, name, out = sys.argv[1:4]
    sys.path.insert(0, directory)
    outcomes = []

    def record(test, outcome, why=""):
        outcomes.append({"id": test.id(), "outcome": outcome, "why": why})

    class Result(unittest.TextTestResult):
        def addSuccess(self, test):
            super().addSuccess(test)
            record(test, "ok")
        def addFailure(self, test, err):
            super().addFailure(test, err)
            record(test, "failed", self.failures[-1][1])
        def addError(self, test, err):
            super().addError(test, err)
            record(test, "error", self.errors[-1][1])
        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            record(test, "skipped", reason)
        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            record(test, "ok")
        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            record(test, "failed", "unexpected success")
        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                failed = issubclass(err[0], test.failureException)
                record(subtest, "failed" if failed else "error",
                       "".join(traceback.format_exception(*err)))

    try:
        suite = unittest.defaultTestLoader.loadTestsFromName(name)
    except unittest.SkipTest as exc:
        outcomes.append({"id": name, "outcome": "skipped", "why": str(exc)})
    except BaseException:
        outcomes.append({"id": name, "outcome": "error",
                         "why": traceback.format_exc()})
    else:
        unittest.TextTestRunner(stream=sys.stderr, verbosity=2,
                                resultclass=Result).run(suite)
    with open(out, "w", encoding="utf-8") as f:
        json.dump(outcomes, f)
    """)


def upstream_file(release, name):
    """The path of upstream `release`'s test file `name`; skips (fails
    where tests are required) if pyenv has no copy of it."""
    path = os.path.join(pyenv_root(), RELEASES[release], name)
    if not os.path.isfile(path):
        skip_environment(f"no upstream {release} test file {path} (pyenv "
                         f"install {release} provides it)")
    return path


class UpstreamTests(unittest.TestCase):
    """One test per upstream release and file."""

    def run_upstream(self, release, name):
        source = upstream_file(release, name)
        module = os.path.splitext(name)[0]
        with tempfile.TemporaryDirectory(prefix="perf-upstream-") as tmp:
            tmp = os.path.realpath(tmp)
            # The file alone in a directory of its own, beside nothing
            # of ours.
            directory = os.path.join(tmp, "tests")
            os.mkdir(directory)
            shutil.copyfile(source, os.path.join(directory, name))
            out = os.path.join(tmp, "outcomes.json")
            env = clean_env()
            perf = os.environ.get("PERF")
            if perf and os.sep in perf:
                # Upstream runs "perf" from PATH: make it the perf our
                # tests use (test_jit's $PERF, a newer one than Debian's).
                bin_dir = os.path.join(tmp, "bin")
                os.mkdir(bin_dir)
                os.symlink(os.path.abspath(perf),
                           os.path.join(bin_dir, "perf"))
                env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
            files = ProfilerFiles(markers=[tmp])
            # Upstream's tearDown removes every perf map that appeared
            # while it ran, anyone's: our other tests wait meanwhile.
            with tmp_files_lock(exclusive=True):
                proc = subprocess.Popen(
                    [sys.executable, "-c", DRIVER, directory, module, out],
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    cwd=tmp, env=env)
                files.add_pid(proc.pid)    # test_perfmaps writes its own
                try:
                    log, _ = proc.communicate(timeout=UPSTREAM_TIMEOUT)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.communicate()
                    raise
                files.cleanup()
            log = log.decode("utf-8", "backslashreplace")
            try:
                with open(out, encoding="utf-8") as f:
                    outcomes = json.load(f)
            except (OSError, ValueError):
                self.fail(f"upstream {release} {name} exited "
                          f"{proc.returncode} without outcomes:\n{log}")
        self.assertEqual(proc.returncode, 0, log)
        self.assertTrue(outcomes, f"no test ran:\n{log}")
        for case in outcomes:
            with self.subTest(upstream=f"{release} {case['id']}"):
                self.check_outcome(case, log)

    def check_outcome(self, case, log):
        outcome, why = case["outcome"], case["why"]
        if outcome == "skipped":
            if why in UNWINDING_SKIPS and FRAME_POINTERS in ("python", "no"):
                self.skipTest(f"upstream skips it ({why}): this build is "
                              f"--with-frame-pointers={FRAME_POINTERS}, "
                              "and upstream trusts only frame pointers in "
                              "every function")
            if why not in MACHINE_SKIPS:
                self.fail(f"skipped for a reason that is not this "
                          f"machine's: {why}")
            lacking, required = MACHINE_SKIPS[why]
            reason = f"upstream skips it ({why}): {lacking}"
            if required:
                skip_environment(reason)
            self.skipTest(reason)
        elif outcome != "ok":
            self.fail(f"{outcome}:\n{why}\nupstream's run:\n{log}")

    @needs_host("perf")
    def test_312_perf_profiler(self):
        self.run_upstream("3.12.1", "test_perf_profiler.py")

    def test_312_perfmaps(self):
        self.run_upstream("3.12.1", "test_perfmaps.py")

    @needs_host("perf")
    def test_313_perf_profiler(self):
        self.run_upstream("3.13.0", "test_perf_profiler.py")

    def test_313_perfmaps(self):
        self.run_upstream("3.13.0", "test_perfmaps.py")


if __name__ == "__main__":
    unittest.main()
