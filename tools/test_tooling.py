"""Tests of the tree tooling: fetch, assemble, export, dist and install.

They work on throwaway trees (TREE=<tmp>) so the developer's build/ is
never touched, and never write to the repository: the throwaway tree is
assembled from the repository itself, so exporting it must change nothing.
"""

import base64
import glob
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import unittest
import zipfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.path.join(ROOT, "tools")


def run(tool, *args, env=None):
    return subprocess.run([os.path.join(TOOLS, tool), *args],
                          capture_output=True, text=True,
                          env={**os.environ, **(env or {})})


def lib_sh(command, *args):
    """The output of the bash `command` run with tools/lib.sh sourced
    (its arguments: `args`)."""
    return subprocess.run(
        ["bash", "-c", f'. "$0" && {command}', os.path.join(TOOLS, "lib.sh"),
         *args], capture_output=True, text=True, check=True).stdout


def flamegraph_template_md5(path):
    """(MD5 of the file at `path`, the one lib.sh expects)."""
    with open(path, "rb") as f:
        have = hashlib.md5(f.read()).hexdigest()
    return have, lib_sh('echo "$FLAMEGRAPH_MD5"').strip()


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

    def test_flame_graph_template_fetched_again_when_wrong(self):
        with tempfile.TemporaryDirectory() as cache:
            env = {"PERF_TRAMPOLINE_CACHE": cache}
            cached = os.path.join(cache, "d3-flamegraph-base-"
                                  + lib_sh('echo "$FLAMEGRAPH_VERSION"')
                                  .strip() + ".html")
            with open(cached, "w") as f:
                f.write("<html>not the template</html>")
            proc = run("fetch-flamegraph.sh", env=env)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertEqual(proc.stdout, cached + "\n")
            self.assertIn("wrong checksum; fetching again", proc.stderr)
            have, want = flamegraph_template_md5(cached)
            self.assertEqual(have, want)


class BuildTests(unittest.TestCase):
    """tools/build.sh on a configured stand-in tree: its Makefile logs
    what make runs."""

    MAKEFILE = textwrap.dedent("""\
        all: python
        python: source.c
        \tprintf '#!/bin/sh\\necho 3.11.2\\n' >python; chmod +x python
        \techo build >>log
        clean:
        \trm -f profile-run-stamp; echo clean >>log
        """)

    def setUp(self):
        self.tree = tempfile.mkdtemp(prefix="perf-build-")
        self.addCleanup(shutil.rmtree, self.tree)
        for name, text in (("Makefile", self.MAKEFILE), ("source.c", ""),
                           (".configure-args", "")):
            with open(os.path.join(self.tree, name), "w") as f:
                f.write(text)

    def build(self):
        must_succeed(run("build.sh", self.tree))
        log = os.path.join(self.tree, "log")
        if not os.path.exists(log):
            return []
        with open(log) as f:
            lines = f.read().split()
        os.unlink(log)
        return lines

    def touch_source(self):
        # One second later than the executable: make sees it changed.
        path = os.path.join(self.tree, "source.c")
        built = os.stat(os.path.join(self.tree, "python")).st_mtime
        os.utime(path, (built + 1, built + 1))

    def test_changed_source_is_rebuilt(self):
        self.assertEqual(self.build(), ["build"])
        self.assertEqual(self.build(), [])
        self.touch_source()
        self.assertEqual(self.build(), ["build"])

    def test_changed_source_of_a_pgo_build_trains_again(self):
        self.assertEqual(self.build(), ["build"])
        open(os.path.join(self.tree, "profile-run-stamp"), "w").close()
        self.assertEqual(self.build(), [])
        self.touch_source()
        self.assertEqual(self.build(), ["clean", "build"])


def must_succeed(proc):
    """Fail, with its stderr, if a tool's run failed."""
    if proc.returncode != 0:
        raise AssertionError(f"{proc.args[0]} failed: {proc.stderr}")


class ScratchTestCase(unittest.TestCase):
    """Tests sharing one temporary directory, cls.tmp, which the class's
    prepare() fills; removed after the last test, or at once when
    prepare() fails."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = os.path.realpath(tempfile.mkdtemp(prefix="perf-tooling-"))
        try:
            cls.prepare()
        except BaseException:
            shutil.rmtree(cls.tmp)
            raise

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.tmp)


class TreeTests(ScratchTestCase):

    @classmethod
    def prepare(cls):
        cls.env = {"TREE": os.path.join(cls.tmp, "cpython")}
        must_succeed(run("assemble.sh", env=cls.env))
        cls.tree = cls.env["TREE"]

    def git(self, *args):
        return subprocess.run(["git", "-C", self.tree, *args],
                              capture_output=True, text=True, check=True).stdout

    def test_tree_has_pristine_and_overlay_commits(self):
        log = self.git("log", "--format=%s").splitlines()
        self.assertEqual(log, ["Overlay and patches", "Pristine CPython 3.11.2"])
        self.assertEqual(self.git("status", "--porcelain"), "")

    def test_flame_graph_template_is_copied_in_not_exported(self):
        path = os.path.join(self.tree, "Lib", "perf_trampoline",
                            "d3-flamegraph-base.html")
        have, want = flamegraph_template_md5(path)
        self.assertEqual(have, want)
        self.assertEqual(self.git("status", "--porcelain", "--ignored",
                                  "Lib/perf_trampoline/"),
                         "!! Lib/perf_trampoline/d3-flamegraph-base.html\n")

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

    def test_tree_matching_the_repository_is_reassembled(self):
        # The tree moved on from its overlay commit, and its stamp is
        # stale, but what it holds is what the repository holds.
        stamp = os.path.join(self.tree, ".git", "overlay-inputs")
        self.git("commit", "-q", "--allow-empty", "-m", "no change")
        with open(stamp, "w") as f:
            f.write("0" * 64 + "\n")
        proc = run("assemble.sh", "--force", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(self.git("log", "-1", "--format=%s"),
                         "Overlay and patches\n")

    def test_perf_off_variants_apply(self):
        # make bench builds the tree with each perf-off change undone
        # (tools/bench-perf-off.sh): each undo still applies, as it is.
        patches = sorted(glob.glob(os.path.join(ROOT, "bench", "perf_off",
                                                "*.patch")))
        self.assertTrue(patches)
        for path in patches:
            with self.subTest(os.path.basename(path)):
                self.git("apply", "--check", path)

    def test_reassemble_keeps_unchanged_files(self):
        path = os.path.join(self.tree, "Objects", "listobject.c")
        mtime = os.stat(path).st_mtime_ns
        proc = run("assemble.sh", "--force", env=self.env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(os.stat(path).st_mtime_ns, mtime)


class ProbeMixin:
    """Runs PROBE with an interpreter built by the tools."""

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

    def probe_names(self, python, *options, activate=False, jit=False,
                    env=None):
        """Run `python <options> PROBE [activate]` with the changes `env`
        to the environment; return the names its perf map (`jit`: its
        jitdump) gives to the probe's functions."""
        from test.test_perf_profiler.jitlib import CodeLoad, read_jitdump
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
                                    env=clean_env(**(env or {})))
            files.add_pid(proc.pid)
            try:
                _, stderr = proc.communicate(timeout=TIMEOUT)
                self.assertEqual(proc.returncode, 0, stderr)
                if not jit:
                    return [entry.qualname for entry in read_map(proc.pid)
                            if entry.filename == script]
                # A jitdump's names are "py::QUALNAME:FILENAME".
                suffix = ":" + script
                return [record.name[4:-len(suffix)]
                        for record in read_jitdump(proc.pid)[1]
                        if isinstance(record, CodeLoad)
                        and record.name.endswith(suffix)]
            finally:
                files.cleanup()


class DistInstallTests(ProbeMixin, ScratchTestCase):
    """make dist and make install, checked by one build: the dist patch
    applied to the pristine source (as make install does), configured for a
    temporary prefix, built and installed under DESTDIR as a packager
    would, then moved to its prefix and run there and from a venv."""

    @classmethod
    def prepare(cls):
        cls.patch = os.path.join(cls.tmp, "dist", "perf.patch")
        cls.prefix = os.path.join(cls.tmp, "prefix")
        stage = os.path.join(cls.tmp, "stage")
        must_succeed(run("dist.sh", cls.patch,
                         env={"TREE": os.path.join(cls.tmp, "cpython-dist")}))
        must_succeed(run("install.sh", cls.patch, cls.prefix, stage,
                         env={"TREE": os.path.join(cls.tmp, "cpython-install")}))
        cls.prefix_written = os.path.exists(cls.prefix)
        os.rename(stage + cls.prefix, cls.prefix)
        cls.python = os.path.join(cls.prefix, "bin", "python3.11")

    def test_patch_holds_the_whole_project(self):
        listing = lib_sh('overlay_files && patch_files && '
                         'printf "%s\\n" "${GENERATED[@]}"').split()
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

    def test_flame_graph_template_is_installed(self):
        # Not in the patch (test_patch_holds_the_whole_project), copied
        # into the tree by install.sh.
        have, want = flamegraph_template_md5(os.path.join(
            self.prefix, "lib", "python3.11", "perf_trampoline",
            "d3-flamegraph-base.html"))
        self.assertEqual(have, want)

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


class PyenvTests(ProbeMixin, ScratchTestCase):
    """The README's pyenv line, `pyenv install --patch 3.11.2 < PATCH`,
    with pyenv's own 3.11.2 recipe, offline: pyenv's download cache holds
    the verified Python-3.11.2.tgz (under the name pyenv gives it), the
    recipe's tarball where tar has no xz; the recipe checks its checksum."""

    @classmethod
    def prepare(cls):
        pyenv = pyenv_command()
        root = subprocess.run([pyenv, "root"], capture_output=True,
                              text=True, check=True).stdout.strip()
        tarball = run("fetch-source.sh")
        must_succeed(tarball)
        patch = os.path.join(cls.tmp, "perf.patch")
        must_succeed(run("dist.sh", patch,
                         env={"TREE": os.path.join(cls.tmp, "cpython-dist")}))
        cache = os.path.join(cls.tmp, "cache")
        os.mkdir(cache)
        os.symlink(tarball.stdout.strip(),
                   os.path.join(cache, "Python-3.11.2.tar.gz"))
        # Installed under a PYENV_ROOT of its own; the commands are those
        # of the user's pyenv.
        env = {"PYENV_ROOT": os.path.join(cls.tmp, "pyenv"),
               "PATH": os.pathsep.join(
                   [os.path.join(root, "plugins", "python-build", "bin"),
                    os.environ["PATH"]]),
               "PYTHON_BUILD_CACHE_PATH": cache,
               "_PYTHON_BUILD_FORCE_SKIP_XZ": "1"}
        with open(patch) as f:
            proc = subprocess.run([pyenv, "install", "--patch", "3.11.2"],
                                  stdin=f, capture_output=True, text=True,
                                  env={**os.environ, **env})
        must_succeed(proc)
        cls.python = os.path.join(cls.tmp, "pyenv", "versions", "3.11.2",
                                  "bin", "python3.11")

    def test_pyenv_python_names_python_functions(self):
        self.assertIn("probe", self.probe_names(self.python, "-X", "perf"))
        self.assertIn("probe", self.probe_names(self.python, activate=True))


def pyenv_command():
    """pyenv: on PATH, else in its root (where a shell that has not run
    pyenv's init, as CI's clean root's, would not find it); skipped (a
    failure where tests are required) if it is in neither."""
    from test.test_perf_profiler.util import pyenv_root, skip_environment
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        pyenv = os.path.join(pyenv_root(), "bin", "pyenv")
        if not os.access(pyenv, os.X_OK):
            skip_environment(f"pyenv is not installed (not on PATH, nor "
                             f"{pyenv})")
    return pyenv


def stock_pythons():
    """(name, path) of the stock 3.11 interpreters make ext builds for:
    Debian's python3.11, and pyenv's 3.11.x where pyenv has one."""
    from test.test_perf_profiler.util import pyenv_root
    pythons = [("debian", "/usr/bin/python3.11")]
    for path in sorted(glob.glob(os.path.join(
            pyenv_root(), "versions", "3.11.*", "bin", "python3.11"))):
        pythons.append(("pyenv-" + path.split(os.sep)[-3], path))
    return pythons


class ExtInstallTests(ProbeMixin, ScratchTestCase):
    """perftramp311 (ext/) installed as the README says, `pip install
    ./ext`: with the interpreter's own pip alone and offline (--no-index),
    into fresh venvs of every stock 3.11 here, with and without
    --system-site-packages; its wheel; its sdist, built standalone."""

    @classmethod
    def prepare(cls):
        cls.pythons = stock_pythons()
        if not os.access(cls.pythons[0][1], os.X_OK):
            raise AssertionError(f"{cls.pythons[0][1]} is missing "
                                 f"(make deps-test installs it)")

    def venv(self, python, name, *options):
        """A fresh venv of `python`, its interpreter's path."""
        path = os.path.join(self.tmp, name)
        must_succeed(subprocess.run([python, "-m", "venv", *options, path],
                                    capture_output=True, text=True))
        return os.path.join(path, "bin", "python")

    def pip(self, python, *args, **extra):
        """pip, run in the repository, offline, no PIP_* settings of
        ours, the variables `extra` added."""
        env = {name: value for name, value in os.environ.items()
               if not name.startswith(("PIP_", "PYTHON"))}
        return subprocess.run([python, "-m", "pip", *args, "--no-index"],
                              cwd=ROOT, capture_output=True, text=True,
                              env={**env, **extra})

    def assert_names_probe(self, python):
        """The installed package names the probe: in a jitdump with
        PYTHONPERFSUPPORT=1, in a perf map with --backend perf."""
        self.assertIn("probe", self.probe_names(
            python, jit=True, env={"PYTHONPERFSUPPORT": "1"}))
        self.assertIn("probe", self.probe_names(
            python, "-m", "perftramp311", "--backend", "perf"))

    def test_pip_install_offline_in_fresh_venvs(self):
        from test.test_perf_profiler.util import pyenv_root, skip_environment
        for name, python in self.pythons:
            for options in ((), ("--system-site-packages",)):
                with self.subTest(python=name, options=options):
                    venv = self.venv(python, f"{name}{len(options)}",
                                     *options)
                    proc = self.pip(venv, "install", "./ext")
                    self.assertEqual(proc.returncode, 0, proc.stderr)
                    self.assert_names_probe(venv)
        if len(self.pythons) == 1:
            with self.subTest(python="pyenv"):
                skip_environment(f"pyenv has no 3.11.x in "
                                 f"{pyenv_root()}/versions")

    def test_wheel_contents(self):
        python = self.venv(self.pythons[0][1], "wheel")
        dist = os.path.join(self.tmp, "dist")
        must_succeed(self.pip(python, "wheel", "--no-deps", "-w", dist,
                              "./ext"))
        suffix, tag = subprocess.run(
            [python, "-c", "import sys, sysconfig; print(sysconfig."
             "get_config_var('EXT_SUFFIX'), sysconfig.get_platform())"],
            capture_output=True, text=True, check=True).stdout.split()
        tag = "cp311-cp311-" + tag.replace("-", "_")
        [wheel] = os.listdir(dist)
        self.assertRegex(wheel, rf"^perftramp311-[\d.]+-{tag}\.whl$")
        info = "-".join(wheel.split("-")[:2]) + ".dist-info"
        tools = os.path.join(ROOT, "Lib", "perf_trampoline")
        expected = {"perftramp311.pth", "perftramp311/__init__.py",
                    "perftramp311/__main__.py", f"_perftramp311{suffix}",
                    *(f"perf_trampoline/{name}" for name in os.listdir(tools)
                      if name.endswith(".py")),
                    # What its reports fill in.
                    "perf_trampoline/d3-flamegraph-base.html",
                    *(f"{info}/{name}" for name in (
                        "METADATA", "WHEEL", "RECORD", "top_level.txt",
                        "LICENSE"))}
        with zipfile.ZipFile(os.path.join(dist, wheel)) as z:
            self.assertEqual(set(z.namelist()), expected)
            files = {name: z.read(name) for name in expected}
        with open(os.path.join(ROOT, "ext", "perftramp311.pth"), "rb") as f:
            self.assertEqual(files["perftramp311.pth"], f.read())
        # Not pure: the package goes to platlib, the .pth to its root.
        self.assertIn(f"Root-Is-Purelib: false\nTag: {tag}\n",
                      files[f"{info}/WHEEL"].decode())
        # RECORD: every other file, with its hash and size.
        record = {}
        for line in files[f"{info}/RECORD"].decode().splitlines():
            name, digest, size = line.rsplit(",", 2)
            record[name] = (digest, size)
        self.assertEqual(record.pop(f"{info}/RECORD"), ("", ""))
        self.assertEqual(set(record), expected - {f"{info}/RECORD"})
        for name, (digest, size) in record.items():
            data = files[name]
            want = base64.urlsafe_b64encode(
                hashlib.sha256(data).digest()).decode().rstrip("=")
            self.assertEqual((digest, size), (f"sha256={want}",
                                              str(len(data))), name)

    def test_wheel_needs_the_template(self):
        # Not in the repository: without a copy the build stops, saying
        # where to get one, instead of a wheel whose record draws no
        # flame graph.
        python = self.venv(self.pythons[0][1], "no-template")
        cache = os.path.join(self.tmp, "empty-cache")
        os.mkdir(cache)
        proc = self.pip(python, "wheel", "--no-deps", "-w",
                        os.path.join(self.tmp, "none"), "./ext",
                        PERF_TRAMPOLINE_CACHE=cache)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn(f"perftramp311: the flame graph template is not in "
                      f"{cache}: fetch it once with tools/fetch-flamegraph.sh "
                      f"(npm), or make ext", proc.stdout + proc.stderr)

    def test_sdist_installs_standalone(self):
        name, python = self.pythons[-1]
        dist = os.path.join(self.tmp, "sdist")
        os.mkdir(dist)
        # The hook pip would call; pip itself makes no sdists.
        proc = subprocess.run(
            [python, "-I", "-c", "import sys; sys.path.insert(0, 'ext'); "
             "import perftramp311_build as b; print(b.build_sdist("
             "sys.argv[1]))", dist], cwd=ROOT, capture_output=True,
            text=True)
        must_succeed(proc)
        sdist = os.path.join(dist, proc.stdout.strip())
        with tarfile.open(sdist) as tar:
            names = {member.name.split("/", 1)[1] for member in tar}
        for staged in ("shared/perf_trampoline.c", "shared/asm_trampoline.S",
                       "shared/pycore_perf.h", "perf_trampoline/_record.py",
                       "perf_trampoline/d3-flamegraph-base.html",
                       "_perftramp311.c", "PKG-INFO"):
            self.assertIn(staged, names)
        venv = self.venv(python, "from-sdist")
        proc = self.pip(venv, "install", sdist)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assert_names_probe(venv)


def dpkg_newer(a, b):
    """True if Debian version a is newer than b (dpkg's own ordering)."""
    return subprocess.run(["dpkg", "--compare-versions", a, "gt", b]).returncode == 0


class DebianTests(ScratchTestCase):
    """make debian's inputs, in a temporary DEBIAN_WORK and TREE: the
    Debian tarball fetch-debian.sh picks from the source index, and the
    tree assembled from it with our patch on top of Debian's series
    (make test-debian builds and tests such a tree)."""

    PACKAGE = "python3.11"

    @classmethod
    def prepare(cls):
        cls.work = os.path.join(cls.tmp, "debian")
        cls.tree = os.path.join(cls.tmp, "cpython-debian")
        patch = os.path.join(cls.tmp, "perf.patch")
        env = {"DEBIAN_WORK": cls.work}
        fetch = run("fetch-debian.sh", env=env)
        must_succeed(fetch)
        must_succeed(run("dist.sh", patch,
                         env={"TREE": os.path.join(cls.tmp, "cpython-dist")}))
        assemble = run("debian.sh", "--tree", patch, "/usr/local",
                       env={**env, "TREE": cls.tree})
        must_succeed(assemble)
        cls.tarball = fetch.stdout.strip()
        cls.fetch_log = fetch.stderr
        cls.configure_args = assemble.stdout.splitlines()

    def index(self):
        """{revision: sha256 of its .debian.tar.xz} in the source index
        that fetch-debian.sh read (through its private apt lists)."""
        out = lib_sh('private_apt "$1" apt-cache showsrc "$2"',
                     os.path.join(self.work, "apt"), self.PACKAGE)
        revisions = {}
        for paragraph in out.split("\n\n"):
            package = re.search(r"^Package: (\S+)$", paragraph, re.M)
            version = re.search(r"^Version: (3\.11\.2-\S+)$", paragraph, re.M)
            tarball = re.search(r"^ ([0-9a-f]{64}) \d+ \S+\.debian\.tar\.xz$",
                                paragraph, re.M)
            if package and package[1] == self.PACKAGE and version and tarball:
                revisions[version[1]] = tarball[1]
        return revisions

    def revision(self):
        name = os.path.basename(self.tarball)
        match = re.fullmatch(r"python3\.11_(3\.11\.2-.+)\.debian\.tar\.xz",
                             name)
        self.assertIsNotNone(match, name)
        return match[1]

    def sha256(self, path):
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()

    def test_flame_graph_template_is_in_the_tree(self):
        have, want = flamegraph_template_md5(os.path.join(
            self.tree, "Lib", "perf_trampoline", "d3-flamegraph-base.html"))
        self.assertEqual(have, want)

    def test_newest_revision_that_downloads(self):
        index = self.index()
        chosen = self.revision()
        self.assertEqual(self.sha256(self.tarball), index.get(chosen))
        # Each newer revision was tried and said to be unavailable.
        for newer in (r for r in index if dpkg_newer(r, chosen)):
            self.assertRegex(self.fetch_log,
                             rf"{re.escape(newer)}: .* could not be downloaded")

    def test_tarball_that_does_not_match_is_fetched_again(self):
        good = self.sha256(self.tarball)
        with open(self.tarball, "r+b") as f:
            f.write(b"tampered")
        proc = run("fetch-debian.sh", env={"DEBIAN_WORK": self.work})
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.strip(), self.tarball)
        self.assertIn("does not match the index", proc.stderr)
        self.assertEqual(self.sha256(self.tarball), good)

    def test_our_patch_on_debians_series(self):
        def read(path):
            with open(os.path.join(self.tree, path)) as f:
                return f.read()
        # Debian's install schemes (sysconfig-debian-schemes.diff) ...
        self.assertIn("'deb_system'", read("Lib/sysconfig.py"))
        # ... our files and changes, and configure made from both
        # configure.acs (Debian's link-opt.diff is in it).
        self.assertIn("_PyPerf_", read("Python/ceval.c"))
        configure = read("configure")
        self.assertIn("PY_HAVE_PERF_TRAMPOLINE", configure)
        self.assertIn("-Wl,-Bsymbolic-functions", configure)

    def test_configured_as_debian_configures(self):
        rules = os.path.join(self.tree, "debian", "rules")
        with open(rules) as f:
            text = f.read()
        # common_configure_args: continued lines up to the first blank one.
        args = []
        for line in text.split("common_configure_args = \\\n", 1)[1].splitlines():
            if not line.strip():
                break
            args += shlex.split(line.rstrip(" \t\\"))
        order = re.search(r"^\s*dbmliborder\s*=\s*(\S+)", text, re.M)[1]
        debian = {arg.replace("$(dbmliborder)", order) for arg in args
                  if not arg.startswith(("--prefix=", "--libdir="))}
        # The shared build's, and libffi's on every architecture we build.
        debian |= {"--enable-shared", "--with-system-ffi"}
        self.assertIn("--with-system-ffi", text)
        ours = {arg for arg in self.configure_args
                if not arg.startswith(("--prefix=", "CFLAGS=", "CPPFLAGS=",
                                       "LDFLAGS=", "LDFLAGS_NODIST="))}
        self.assertEqual(ours, debian)
        flags = dict(arg.split("=", 1) for arg in self.configure_args
                     if arg.split("=", 1)[0] in ("CFLAGS", "CPPFLAGS"))
        self.assertIn("-fstack-protector", flags["CFLAGS"].split())
        self.assertNotRegex(flags["CFLAGS"], r"(^| )-O")
        self.assertIn("-D_FORTIFY_SOURCE=2", flags["CPPFLAGS"].split())

    def test_minimal_extensions_are_built_in(self):
        with open(os.path.join(self.tree, "Modules", "Setup.local")) as f:
            modules = {line.split()[0] for line in f if line.strip()}
        # Two that python3.11-minimal lists, one of them ours to patch.
        self.assertLessEqual({"_posixsubprocess", "math"}, modules)


class DebTests(ScratchTestCase):
    """make deb's inputs (CI cannot afford the build): the source package
    tools/deb.sh --source writes, unpacked with dpkg-source -x as
    dpkg-buildpackage would build it."""

    @classmethod
    def prepare(cls):
        patch = os.path.join(cls.tmp, "perf.patch")
        must_succeed(run("dist.sh", patch,
                         env={"TREE": os.path.join(cls.tmp, "cpython-dist")}))
        source = run("deb.sh", "--source", patch,
                     env={"DEB_WORK": os.path.join(cls.tmp, "deb"),
                          "DEBIAN_WORK": os.path.join(cls.tmp, "debian")})
        must_succeed(source)
        cls.dsc = source.stdout.strip()
        cls.tree = os.path.join(cls.tmp, "unpacked")
        # dpkg-source applies the quilt series as quilt does: no fuzz.
        cls.unpack = subprocess.run(["dpkg-source", "-x", cls.dsc, cls.tree],
                                    capture_output=True, text=True)
        must_succeed(cls.unpack)
        with open(cls.dsc) as f:
            cls.version = re.search(r"^Version: (\S+)$", f.read(), re.M)[1]

    def read(self, path):
        with open(os.path.join(self.tree, path)) as f:
            return f.read()

    def test_our_patch_applies_last_in_the_series(self):
        series = [line for line in self.read("debian/patches/series").split("\n")
                  if line and not line.startswith("#")]
        self.assertEqual(series[-1], "perf-trampolines.diff")
        self.assertIn("applying perf-trampolines.diff", self.unpack.stdout)
        self.assertIn("_PyPerf_", self.read("Python/ceval.c"))
        self.assertTrue(os.path.isfile(os.path.join(
            self.tree, "Lib", "perf_trampoline", "__init__.py")))
        with open(os.path.join(self.tree, "Lib", "perf_trampoline",
                               "d3-flamegraph-base.html"), "rb") as f:
            template = f.read()
        self.assertEqual(hashlib.md5(template).hexdigest(),
                         "143e0d06ba69b8370b9848dcd6ae3f36")

    def test_configure_is_left_to_debian_rules(self):
        # debian/rules runs autoconf; it runs no autoheader.
        patch = self.read("debian/patches/perf-trampolines.diff")
        files = re.findall(r"^diff --git a/(\S+) ", patch, re.M)
        self.assertNotIn("configure", files)
        self.assertIn("configure.ac", files)
        self.assertIn("pyconfig.h.in", files)
        rules = self.read("debian/rules")
        self.assertRegex(rules, r"(?m)^\s*autoconf$")
        self.assertNotIn("autoheader", rules)

    def test_every_build_has_frame_records_on_the_python_chain(self):
        rules = self.read("debian/rules")
        args = rules.split("common_configure_args = \\\n", 1)[1].split("\n\n")[0]
        self.assertIn("--with-frame-pointers=python", args.split())
        self.assertIn("--with-frame-pointers=python", self.read("debian/changelog"))

    def test_version_sorts_between_debians_and_the_next(self):
        base, _, ours = self.version.partition("+perf")
        self.assertEqual(ours, "1")
        self.assertEqual(os.path.basename(self.dsc),
                         f"python3.11_{self.version}.dsc")
        self.assertRegex(base, r"^3\.11\.2-6\+deb12u\d+$")
        following = re.sub(r"\d+$", lambda m: str(int(m[0]) + 1), base)
        self.assertTrue(dpkg_newer(self.version, base))
        self.assertTrue(dpkg_newer(following, self.version))
        changelog = self.read("debian/changelog")
        self.assertTrue(changelog.startswith(f"python3.11 ({self.version}) "))
        # Debian's own entries follow ours unchanged.
        self.assertIn(f"python3.11 ({base}) ", changelog)


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
        # perf_needs_host is what test_perf_profiler.util.needs_host sets.
        "sample_host": """\
            import unittest
            class Native(unittest.TestCase):
                perf_needs_host = ("perf",)
                def test_h(self):
                    pass
            class Mixed(unittest.TestCase):
                def test_i(self):
                    pass
                def test_j(self):
                    pass
                test_j.perf_needs_host = ("gdb",)
            """,
    }

    def count(self, module, status=0, *options, left_out=None):
        with tempfile.TemporaryDirectory() as tmp:
            for name, source in self.MODULES.items():
                with open(os.path.join(tmp, name + ".py"), "w") as f:
                    f.write(textwrap.dedent(source))
            out = os.path.join(tmp, "out.json")
            proc = subprocess.run(
                [sys.executable, os.path.join(TOOLS, "unit_counts.py"),
                 *options, out, module], capture_output=True, text=True,
                env={**os.environ, "PYTHONPATH": tmp})
            self.assertEqual(proc.returncode, status, proc.stderr)
            with open(out) as f:
                counts = json.load(f)
        if left_out is not None:
            left_out.update({i.rsplit(".", 1)[-1]: why
                             for i, why in counts["left_out"]})
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


    def test_host_tests_left_out_only_when_asked(self):
        left_out = {}
        passed, failed, skipped = self.count("sample_host",
                                             left_out=left_out)
        self.assertEqual(passed, {"test_h", "test_i", "test_j"})
        self.assertEqual(left_out, {})
        passed, failed, skipped = self.count(
            "sample_host", 0, "--without-host-tools", left_out=left_out)
        self.assertEqual((passed, failed, skipped), ({"test_i"}, {}, {}))
        self.assertEqual(left_out, {"test_h": "perf", "test_j": "gdb"})


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
            # Both flame graphs, named in the output, drawn offline
            # (test_reports opens them in a browser).
            for name in ("flamegraph.html", "flamegraph-python.html"):
                path = os.path.join(out, name)
                self.assertIn(f": {path}\n", proc.stdout)
                with open(path, encoding="utf-8") as f:
                    self.assertIn("py::handle_request:", f.read())
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

class FiguresTests(unittest.TestCase):
    """The documents' measured figures are bench/results.json's: the
    tables make bench writes (bench/figures.py) match the file."""

    def setUp(self):
        sys.path.insert(0, os.path.join(ROOT, "bench"))
        self.addCleanup(sys.path.remove, os.path.join(ROOT, "bench"))
        import figures
        self.figures = figures

    def test_documents_match_the_results_file(self):
        stale = self.figures.stale(self.figures.load())
        self.assertEqual([os.path.relpath(p, ROOT) for p, _ in stale], [],
                         "run: python3 bench/figures.py update")

    def assert_collects_to(self, want):
        # A make bench run holding these figures collects to them.
        workloads = {}
        for name, r in want["ratios"].items():
            for w, value in r["workloads"].items():
                entry = workloads.setdefault(w, {
                    "category": "call-heavy" if w in want["call_heavy"]
                    else "other", "ratios": {}})
                entry["ratios"][name] = {"min": value, "paired": value}
        workloads["codeobjects"]["perf_cost_per_unit_us"] = \
            want["per_code_object_us"]
        if "ext_pth_startup" in want:
            workloads["startup"]["ratios"]["ext .pth on/off"] = {
                "min": want["ext_pth_startup"]}
        cpus, _, cpu = want["machine"].removesuffix(")").partition(
            " vCPUs (")
        run = {"date": want["date"] + "T01:02:03", "runs": want["runs"],
               "metric": want["metric"], "errors": [],
               "machine": {"cpus": int(cpus), "cpu": cpu},
               "workloads": workloads,
               "geomeans": {name: {"all": {"min": r["geomean"]},
                                   "call-heavy":
                                       {"min": r["geomean call-heavy"]}}
                            for name, r in want["ratios"].items()}}
        memory = {"-X perf": 1000 + want["memory_per_code_object_bytes"]
                  ["perf"], "-X perf_jit": 1000 +
                  want["memory_per_code_object_bytes"]["perf_jit"]}
        side = {"attach_ms": want["attach_ms"],
                "rows": {name: {"memory": memory.get(name, 1000),
                                "fork_ms": r["fork_ms"],
                                "tmp": r["tmp_kib"] * 1024}
                         for name, r in want["fork"].items()}}
        self.assertEqual(self.figures.collect(run, side,
                                              want["perf_off"]), want)

    def test_collect_keeps_what_the_documents_quote(self):
        self.assert_collects_to(self.figures.load())

    def test_extension_figures_reach_the_readme(self):
        # perftramp311's start-up through its .pth, its map and its
        # jitdump beside upstream's, and the empty PEP 523 hook.
        want = self.figures.load()
        ext = want["ratios"]["ext on/off"]
        want["ratios"]["pep523 on/off"] = dict(ext, workloads={
            w: 1.111 for w in ext["workloads"] if w != "startup"})
        want["per_code_object_us"].update(
            {"ext": 0.91, "ext map": 0.33, "3.13 perf_jit": 1.04})
        want["ext_pth_startup"] = 1.077
        self.assert_collects_to(want)
        table = "\n".join(self.figures.readme_ext(want))
        for row in ("| recursive calls (`fib`) | %.2f | 1.11 | %.2f |"
                    % (ext["workloads"]["fib"],
                       want["ratios"]["3.12 on/off"]["workloads"]["fib"]),
                    "through the `.pth` | 1.08 |  |",
                    "`-X perf`) | +0.91 / +0.33 µs |  | +1.04 / +%.2f µs |"
                    % want["per_code_object_us"]["3.12"]):
            self.assertIn(row, table)

    def test_a_changed_figure_is_found(self):
        figures = self.figures.load()
        figures["attach_ms"] += 1
        figures["ratios"]["3.12 on/off"]["workloads"]["fib"] += 0.5
        figures["perf_off"]["instructions"]["full"]["fib"] += 10 ** 7
        stale = self.figures.stale(figures)
        self.assertEqual(sorted(os.path.relpath(p, ROOT) for p, _ in stale),
                         ["DESIGN.md", "README.md", "bench/README.md"])


class HelpTests(unittest.TestCase):
    """`make help` lists every target of the Makefile, and the documents
    name no target it does not have."""

    DOCUMENTS = ["README.md", "BUILDING.md", "TESTING.md", "DESIGN.md",
                 "bench/README.md", "Doc/howto/perf_profiling.rst",
                 "Doc/c-api/perfmaps.rst"]
    # Targets of CPython's own Makefile, which the documents name as such.
    CPYTHON_TARGETS = {"altinstall", "smelly"}
    # `make` alone runs `all`; `help` prints the list.
    UNLISTED = {"all", "help"}

    def phony_targets(self):
        with open(os.path.join(ROOT, "Makefile")) as f:
            return {target for line in f if line.startswith(".PHONY:")
                    for target in line.split(":", 1)[1].split()}

    def help_targets(self):
        # Run as a user would, not as a sub-make of a make test.
        env = {name: value for name, value in os.environ.items()
               if name not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
        proc = subprocess.run(["make", "-s", "-C", ROOT, "help"],
                              capture_output=True, text=True, env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        # "make X   what it does" or "make, make X   ...".
        return {match.group(1) for line in proc.stdout.splitlines()
                for match in [re.match(r"make(?:, make)? ([a-z][\w.-]*)",
                                       line)] if match}

    def test_help_lists_every_target(self):
        phony = self.phony_targets()
        self.assertIn("deps-jit", phony)
        self.assertEqual(sorted(phony - self.UNLISTED - self.help_targets()),
                         [])

    def test_help_lists_only_targets(self):
        self.assertEqual(sorted(self.help_targets() - self.phony_targets()),
                         [])

    def test_documents_name_targets_help_lists(self):
        listed = self.help_targets() | self.UNLISTED
        named = {}
        for document in self.DOCUMENTS:
            with open(os.path.join(ROOT, document), encoding="utf-8") as f:
                for match in re.finditer(r"(?<![\w-])make\s+([a-z][\w.-]*)",
                                         f.read()):
                    named.setdefault(match.group(1), document)
        self.assertIn("deps-jit", named)
        self.assertEqual({target: document for target, document
                          in named.items() if target not in listed
                          and target not in self.CPYTHON_TARGETS}, {})


class JUnitTests(unittest.TestCase):
    """Regrtest's JUnit file: a case run again (-w) counts once, with the
    outcome of its last run, and one that failed first is named."""

    XML = """\
        <testsuites><testsuite>
        <testcase name="t.A.test_flaky" status="run"><failure/></testcase>
        <testcase name="t.A.test_ok" status="run"/>
        <testcase name="t.A.test_broken" status="run"><error/></testcase>
        </testsuite><testsuite>
        <testcase name="t.A.test_flaky" status="run"/>
        <testcase name="t.A.test_broken" status="run"><error/></testcase>
        </testsuite></testsuites>
        """

    def test_rerun_counts_once(self):
        import tooling
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "junit.xml")
            with open(path, "w") as f:
                f.write(textwrap.dedent(self.XML))
            self.assertEqual(sorted(tooling.junit_cases(path)),
                             [("t.A.test_broken", "failed"),
                              ("t.A.test_flaky", "ok"),
                              ("t.A.test_ok", "ok")])
            self.assertEqual(tooling.rerun_cases(path), ["t.A.test_flaky"])


if __name__ == "__main__":
    unittest.main()
