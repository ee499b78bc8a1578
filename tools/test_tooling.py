"""Tests of the tree tooling: fetch, assemble, export, dist and install.

They work on throwaway trees (TREE=<tmp>) so the developer's build/ is
never touched, and never write to the repository: the throwaway tree is
assembled from the repository itself, so exporting it must change nothing.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


def run(tool, *args, env=None):
    return subprocess.run([os.path.join(TOOLS, tool), *args],
                          capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def repo_state():
    """The repository's overlay and patches, as git sees the work tree."""
    return subprocess.run(["git", "-C", ROOT, "status", "--porcelain",
                           "--untracked-files=all"],
                          capture_output=True, text=True).stdout


class FetchTests(unittest.TestCase):

    def test_checksum_mismatch_is_refused(self):
        with tempfile.NamedTemporaryFile(suffix=".tgz") as bad:
            bad.write(b"not the CPython release")
            bad.flush()
            proc = run("fetch-source.sh", env={"CPYTHON_TARBALL": bad.name})
        self.assertEqual(proc.returncode, 1)
        self.assertIn("sha256", proc.stderr)
        self.assertEqual(proc.stdout, "")

    def test_verified_tarball_is_found(self):
        proc = run("fetch-source.sh")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertTrue(os.path.isfile(proc.stdout.strip()))


class TreeTests(unittest.TestCase):

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp(prefix="perf-tree-test-")
        cls.env = {"TREE": os.path.join(cls.tmp, "cpython")}
        proc = run("assemble.sh", env=cls.env)
        if proc.returncode != 0:
            shutil.rmtree(cls.tmp)
            raise AssertionError("assemble failed: " + proc.stderr)
        cls.tree = cls.env["TREE"]

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def git(self, *args):
        return subprocess.run(["git", "-C", self.tree, *args],
                              capture_output=True, text=True, check=True).stdout

    def test_tree_has_pristine_and_overlay_commits(self):
        log = self.git("log", "--format=%s").splitlines()
        self.assertEqual(log, ["Overlay and patches", "Pristine CPython 3.11.2"])
        self.assertEqual(self.git("status", "--porcelain"), "")

    def test_export_of_unchanged_tree_is_a_no_op(self):
        before = repo_state()
        proc = run("export.sh", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("nothing to export", proc.stderr)
        self.assertEqual(repo_state(), before)
        self.assertEqual(run("export.sh", "--check", env=self.env).returncode, 0)

    def test_export_is_deterministic(self):
        first = run("export.sh", "--hash", env=self.env).stdout
        second = run("export.sh", "--hash", env=self.env).stdout
        self.assertEqual(first, second)
        self.assertRegex(first, r"^[0-9a-f]{64}\n$")

    def test_assemble_refuses_to_clobber_edits(self):
        path = os.path.join(self.tree, "Python", "ceval.c")
        with open(path, "a") as f:
            f.write("/* an edit that was never exported */\n")
        try:
            self.assertEqual(run("export.sh", "--check", env=self.env).returncode, 1)
            proc = run("assemble.sh", "--force", env=self.env)
            self.assertEqual(proc.returncode, 1)
            self.assertIn("not exported", proc.stderr)
            with open(path) as f:
                self.assertIn("never exported", f.read())
        finally:
            self.git("checkout", "--", "Python/ceval.c")

    def test_reassemble_keeps_unchanged_files(self):
        path = os.path.join(self.tree, "Objects", "listobject.c")
        mtime = os.stat(path).st_mtime_ns
        proc = run("assemble.sh", "--force", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(os.stat(path).st_mtime_ns, mtime)


class DistInstallTests(unittest.TestCase):
    """make dist and make install, checked by one build: the dist patch
    applied to the pristine source (as make install does), configured for a
    temporary prefix, built and installed under DESTDIR as a packager
    would, then moved to its prefix and run there and from a venv."""

    # Run as `python PROBE [activate]`: with "activate" it switches
    # trampolines on itself, before probe() first runs.
    PROBE = """\
        import sys

        def probe():
            return sum(range(100))

        if sys.argv[1:] == ["activate"]:
            sys.activate_stack_trampoline("perf")
        probe()
        """

    @classmethod
    def setUpClass(cls):
        cls.tmp = os.path.realpath(tempfile.mkdtemp(prefix="perf-install-"))
        try:
            cls.dist_and_install()
        except BaseException:
            shutil.rmtree(cls.tmp)
            raise

    @classmethod
    def dist_and_install(cls):
        cls.patch = os.path.join(cls.tmp, "dist", "perf.patch")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        stage = os.path.join(cls.tmp, "stage")
        for proc in (
                run("dist.sh", cls.patch,
                    env={"TREE": os.path.join(cls.tmp, "cpython-dist")}),
                run("install.sh", cls.patch, cls.prefix, stage,
                    env={"TREE": os.path.join(cls.tmp, "cpython-install")})):
            if proc.returncode != 0:
                raise AssertionError(f"{proc.args[0]} failed: {proc.stderr}")
        cls.prefix_written = os.path.exists(cls.prefix)
        os.rename(stage + cls.prefix, cls.prefix)
        cls.python = os.path.join(cls.prefix, "bin", "python3.11")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)

    def probe_names(self, python, *options, activate=False):
        """Run `python <options> PROBE [activate]`; return the names its
        perf map gives to the probe's functions."""
        from test.test_perf_profiler.util import (
            TIMEOUT, ProfilerFiles, clean_env, read_map, write_script)
        with tempfile.TemporaryDirectory() as tmp:
            script = write_script(tmp, self.PROBE, "probe.py")
            args = [python, *options, script]
            if activate:
                args.append("activate")
            files = ProfilerFiles(markers=[tmp])
            proc = subprocess.Popen(args, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True,
                                    env=clean_env())
            files.add_pid(proc.pid)
            try:
                _, stderr = proc.communicate(timeout=TIMEOUT)
                self.assertEqual(proc.returncode, 0, stderr)
                return [entry.qualname for entry in read_map(proc.pid)
                        if entry.filename == script]
            finally:
                files.cleanup()

    def test_patch_holds_the_whole_project(self):
        listing = subprocess.run(
            ["bash", "-c", '. "$1" && overlay_files && patch_files && '
             'printf "%s\\n" "${GENERATED[@]}"', "-",
             os.path.join(TOOLS, "lib.sh")],
            capture_output=True, text=True, check=True).stdout.split()
        expected = {path[len("patches/"):-len(".patch")]
                    if path.startswith("patches/") else path
                    for path in listing}
        with open(self.patch) as f:
            files = {line.split()[2][len("a/"):] for line in f
                     if line.startswith("diff --git ")}
        self.assertEqual(files, expected)

    def test_patch_is_deterministic(self):
        # Another tree, assembled later at another path: the same bytes.
        again = os.path.join(self.tmp, "again.patch")
        proc = run("dist.sh", again,
                   env={"TREE": os.path.join(self.tmp, "cpython-dist2")})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(self.patch, "rb") as first, open(again, "rb") as second:
            self.assertEqual(first.read(), second.read())

    def test_only_versioned_names_are_installed(self):
        # altinstall: python3.11, pip3.11, ...; never python3 or python.
        names = os.listdir(os.path.join(self.prefix, "bin"))
        self.assertIn("python3.11", names)
        self.assertIn("pip3.11", names)
        self.assertEqual([n for n in names if "3.11" not in n], [])

    def test_destdir_is_honoured(self):
        self.assertFalse(self.prefix_written,
                         "make altinstall wrote to PREFIX, not DESTDIR")

    def test_installed_python_names_python_functions(self):
        self.assertIn("probe", self.probe_names(self.python, "-X", "perf"))

    def test_venv_with_pip_names_python_functions(self):
        venv = os.path.join(self.tmp, "venv")
        # ensurepip installs pip from the wheels the source bundles.
        proc = subprocess.run([self.python, "-m", "venv", venv],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        python = os.path.join(venv, "bin", "python")
        bundled = subprocess.run(
            [python, "-c", "import ensurepip; print(ensurepip.version())"],
            capture_output=True, text=True, check=True).stdout.strip()
        proc = subprocess.run([python, "-m", "pip", "--version"],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        site_packages = os.path.join(venv, "lib", "python3.11",
                                     "site-packages")
        self.assertTrue(proc.stdout.startswith(
            f"pip {bundled} from {site_packages}"), proc.stdout)
        self.assertIn("probe", self.probe_names(python, "-X", "perf"))
        self.assertIn("probe", self.probe_names(python, activate=True))

    def test_relative_prefix_is_refused(self):
        proc = run("install.sh", self.patch, "relative/prefix", "",
                   env={"TREE": os.path.join(self.tmp, "unused")})
        self.assertEqual(proc.returncode, 1)
        self.assertIn("absolute", proc.stderr)


class CountTests(unittest.TestCase):
    """tools/unit_counts.py gives every test case exactly one outcome."""

    MODULES = {
        "sample_cases": """\
            import unittest

            class Plain(unittest.TestCase):
                def test_pass(self):
                    pass
                def test_fail(self):
                    self.fail("plain failure")
                def test_skip(self):
                    self.skipTest("plain skip")
                def test_subtests(self):
                    for i in range(4):
                        with self.subTest(i=i):
                            self.assertLess(i, 2)
                def test_subtest_skips(self):
                    for i in range(2):
                        with self.subTest(i=i):
                            self.skipTest("skipped in a subtest")

            class SkippedClass(unittest.TestCase):
                @classmethod
                def setUpClass(cls):
                    raise unittest.SkipTest("class skip")
                def test_a(self):
                    pass
                def test_b(self):
                    pass

            class BrokenClass(unittest.TestCase):
                @classmethod
                def setUpClass(cls):
                    raise RuntimeError("class error")
                def test_c(self):
                    pass

            class BrokenTeardown(unittest.TestCase):
                @classmethod
                def tearDownClass(cls):
                    raise RuntimeError("teardown error")
                def test_d(self):
                    pass
            """,
        # The same class under two names: its test runs twice, and the
        # second run fails.
        "sample_twice": """\
            import unittest
            RUNS = []
            class Once(unittest.TestCase):
                def test_g(self):
                    RUNS.append(1)
                    self.assertEqual(len(RUNS), 1, "second run")
            Twice = Once
            """,
        "sample_module_skip": """\
            import unittest
            def setUpModule():
                raise unittest.SkipTest("module skip")
            class T(unittest.TestCase):
                def test_e(self):
                    pass
                def test_f(self):
                    pass
            """,
    }

    def count(self, module, status=0):
        with tempfile.TemporaryDirectory() as tmp:
            for name, source in self.MODULES.items():
                with open(os.path.join(tmp, name + ".py"), "w") as f:
                    f.write(textwrap.dedent(source))
            out = os.path.join(tmp, "out.json")
            proc = subprocess.run(
                [sys.executable, os.path.join(TOOLS, "unit_counts.py"), out,
                 module], capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": tmp})
            self.assertEqual(proc.returncode, status, proc.stderr)
            with open(out) as f:
                counts = json.load(f)
        return ({i.rsplit(".", 1)[-1] for i in counts["passed"]},
                {i.rsplit(".", 1)[-1]: why for i, why in counts["failed"]},
                {i.rsplit(".", 1)[-1]: why for i, why in counts["skipped"]})

    def test_every_case_has_one_outcome(self):
        passed, failed, skipped = self.count("sample_cases", status=1)
        self.assertEqual(passed, {"test_pass", "test_d"})
        self.assertEqual(skipped, {"test_skip": "plain skip",
                                   "test_subtest_skips": "skipped in a subtest",
                                   "test_a": "setUpClass: class skip",
                                   "test_b": "setUpClass: class skip"})
        self.assertEqual(set(failed), {
            "test_fail", "test_c", "test_subtests (i=2)",
            "test_subtests (i=3)", "BrokenTeardown)"})
        self.assertIn("plain failure", failed["test_fail"])
        self.assertIn("class error", failed["test_c"])
        self.assertIn("teardown error", failed["BrokenTeardown)"])

    def test_each_run_of_a_test_counts(self):
        passed, failed, skipped = self.count("sample_twice", status=1)
        self.assertEqual(passed, {"test_g"})
        self.assertEqual(set(failed), {"test_g"})
        self.assertIn("second run", failed["test_g"])

    def test_module_level_skip_covers_its_cases(self):
        passed, failed, skipped = self.count("sample_module_skip")
        self.assertEqual((passed, failed), (set(), {}))
        self.assertEqual(skipped, {"test_e": "setUpModule: module skip",
                                   "test_f": "setUpModule: module skip"})


class CPythonChecksTests(unittest.TestCase):
    """CPython's own checks pass on the patched tree under test."""

    tree = os.path.dirname(sys.executable)

    def setUp(self):
        if not os.path.isdir(os.path.join(self.tree, ".git")):
            self.skipTest(f"{self.tree} is not an assembled tree")

    def git(self, *args):
        return subprocess.run(["git", "-C", self.tree, *args],
                              capture_output=True, text=True)

    def test_exported_symbols_have_python_prefixes(self):
        proc = subprocess.run(["make", "-C", self.tree, "smelly"],
                              capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertIn("OK: all exported symbols of all libraries",
                      proc.stdout)

    def test_argument_clinic_output_is_current(self):
        before = self.git("status", "--porcelain").stdout
        proc = subprocess.run(
            [sys.executable, "Tools/clinic/clinic.py", "--make",
             "--srcdir", "."], cwd=self.tree, capture_output=True, text=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.git("status", "--porcelain").stdout, before)

    def test_no_whitespace_errors(self):
        # What patchcheck checks: trailing white space, space before tabs,
        # blank lines at the end, in everything we changed or added.
        proc = self.git("diff", "--check", "pristine")
        self.assertEqual((proc.returncode, proc.stdout), (0, ""))


class DemoTests(unittest.TestCase):
    """make demo: exit status 0 and the demo's Python frames."""

    def test_demo_shows_python_frames(self):
        from test.test_perf_profiler.util import (
            perf_record_works, skip_environment)
        reason = perf_record_works()
        if reason:
            skip_environment(reason)
        with tempfile.TemporaryDirectory() as out:
            proc = run("demo.sh", env={
                "DEMO_OUT": out, "TREE": os.path.dirname(sys.executable)})
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        hottest, _, stack = proc.stdout.partition("== One sampled call stack")
        for name in ("parse", "price", "render", "handle_request"):
            self.assertIn(f"py::{name}:", hottest)
        frames = [line.split()[0] for line in stack.splitlines()
                  if line.startswith("    ")]
        demo = [f.split(":")[2] for f in frames
                if f.startswith("py::") and f.endswith("examples/demo.py")]
        # Innermost first, as the demo calls them.
        self.assertEqual(demo[:3], ["parse", "handle_request",
                                    "serve.<locals>.<listcomp>"], stack)


if __name__ == "__main__":
    unittest.main()
