"""Tests of perftramp311 with the stock interpreter running them.

Run with the interpreter of a venv that has the package installed
(tools/run_tests.py: every venv made by make ext):

    build/ext/venv-debian/bin/python -m unittest test_perftramp311

Every program under test is a subprocess.  Where tests are required
(CI=true or PERF_TESTS_REQUIRED=1), a missing tool is a failure, not a
skip.
"""

import glob
import json
import os
import re
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import perftramp311

# The repository: README.md, and ext/, which pip installs.
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))

REQUIRED = (os.environ.get("CI") == "true"
            or os.environ.get("PERF_TESTS_REQUIRED") == "1")

# leaf <- middle <- top, busy enough for cpu-clock samples.
PROGRAM = """\
def leaf(n):
    x = 0
    while n:
        x ^= n * n
        n -= 1
    return x
def middle(n): return leaf(n)
def top():
    for _ in range(150): middle(20000)
top()
"""


def skip_or_fail(why):
    if REQUIRED:
        raise AssertionError(why + " (required here: CI=true or "
                             "PERF_TESTS_REQUIRED=1)")
    raise unittest.SkipTest(why)


def scratch(test):
    """A directory removed when `test` ends."""
    tmp = tempfile.TemporaryDirectory()
    test.addCleanup(tmp.cleanup)
    return tmp.name


def environment(**extra):
    """os.environ without PYTHON* variables, plus `extra`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env.update(extra)
    return env


def run(args, env=None, **kwargs):
    return subprocess.run([sys.executable, *args], capture_output=True,
                          text=True, env=env or environment(),
                          timeout=300, **kwargs)


def map_lines(pid):
    """(start address, name) of each line of /tmp/perf-PID.map."""
    with open(f"/tmp/perf-{pid}.map", encoding="utf-8") as f:
        return [(int(start, 16), name) for start, _, name in
                (line.rstrip("\n").split(" ", 2) for line in f)]


def map_names(pid):
    return [name for _, name in map_lines(pid)]


def jitdump_names(pid):
    """The names of the code loads in /tmp/jit-PID.dump, in order."""
    with open(f"/tmp/jit-{pid}.dump", "rb") as f:
        data = f.read()
    magic, version, header_size = struct.unpack_from("=III", data, 0)
    if magic != 0x4A695444 or version != 1:
        raise AssertionError(f"not a jitdump: {magic:#x} {version}")
    names = []
    pos = header_size
    while pos + 16 <= len(data):
        kind, size = struct.unpack_from("=II", data, pos)
        if size < 16 or pos + size > len(data):
            raise AssertionError(f"record at {pos} runs past the file")
        if kind == 0:           # JIT_CODE_LOAD: 16-byte prefix, 40 bytes
            start = pos + 16 + 40
            names.append(data[start:data.index(b"\0", start)].decode())
        pos += size
    if pos != len(data):
        raise AssertionError(f"{len(data) - pos} bytes of a torn record")
    return names


def profiler_files():
    """The perf maps and jitdumps in /tmp, and the ELF files perf inject
    --jit wrote beside them."""
    return set(glob.glob("/tmp/perf-*.map") + glob.glob("/tmp/jit-*.dump")
               + glob.glob("/tmp/jitted-*-*.so"))


# The real /tmp (a descriptor) and the directory in it that is this
# process's /tmp, or None (setUpModule).
_real_tmp = _private_tmp = None


def setUpModule():
    """Give this process and its children a /tmp of their own: a mount
    namespace (root only) with a fresh directory bound on /tmp.  The
    profiler files new in it are then the tests' processes' alone, and
    FilesMixin removes them whatever else runs on the machine."""
    global _real_tmp, _private_tmp
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    clone_newns, ms_bind, ms_rec, ms_private = 0x20000, 0x1000, 0x4000, 1 << 18
    real_tmp = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
    private = tempfile.mkdtemp(prefix="test_perftramp311-", dir="/tmp")
    os.chmod(private, 0o1777)   # as /tmp
    if (libc.unshare(clone_newns) != 0
            or libc.mount(b"none", b"/", None, ms_rec | ms_private,
                          None) != 0
            or libc.mount(private.encode(), b"/tmp", None, ms_bind,
                          None) != 0):
        error = os.strerror(ctypes.get_errno())
        os.rmdir(private)
        os.close(real_tmp)
        print(f"test_perftramp311: no /tmp of its own ({error}): the "
              f"profiler files of its processes stay in /tmp",
              file=sys.stderr)
        return
    _real_tmp, _private_tmp = real_tmp, os.path.basename(private)


def tearDownModule():
    if _private_tmp is not None:
        shutil.rmtree(_private_tmp, dir_fd=_real_tmp)
        os.close(_real_tmp)


class FilesMixin:
    """Remove the profiler files of the processes the test started (where
    this process has a /tmp of its own: setUpModule)."""

    def setUp(self):
        self.before = profiler_files()

    def tearDown(self):
        if _private_tmp is None:
            return
        for path in profiler_files() - self.before:
            try:
                os.unlink(path)
            except OSError:
                pass

    def run_program(self, code, env=None, args=()):
        """Run `code`, which prints its pid on the first line; return the
        pid and the rest of its output."""
        proc = run(["-c", "import os; print(os.getpid(), flush=True)\n"
                    + textwrap.dedent(code), *args], env=env)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        first, _, rest = proc.stdout.partition("\n")
        return int(first), rest


class TestStockInterpreter(FilesMixin, unittest.TestCase):

    def test_loaded_on_stock_3_11(self):
        self.assertEqual(sys.version_info[:2], (3, 11))
        self.assertFalse(perftramp311.BUILT_IN)
        self.assertIsNone(perftramp311.REFUSED)
        self.assertFalse(perftramp311.is_active())
        self.assertEqual(perftramp311.status(), "inactive")

    def test_names_in_map_and_jitdump(self):
        code = """
            import perftramp311, sys
            perftramp311.activate(sys.argv[1])
            def leaf(): return 1
            class K:
                def method(self): return leaf()
            K().method()
            perftramp311.deactivate()
        """
        map_pid, _ = self.run_program(code, args=["perf"])
        start = time.time_ns()
        dump_pid, _ = self.run_program(code, args=["perf_jit"])
        in_map = map_names(map_pid)
        in_dump = jitdump_names(dump_pid)
        for name in ("py::leaf:<string>", "py::K.method:<string>"):
            self.assertIn(name, in_map)
            self.assertIn(name, in_dump)
        self.assertEqual(in_map, in_dump)
        # No map from the perf_jit run; one an earlier process with the
        # same pid left (pids are reused) is older than the run.
        path = f"/tmp/perf-{dump_pid}.map"
        self.assertFalse(os.path.exists(path)
                         and os.stat(path).st_mtime_ns >= start, path)

    def test_fork_child_has_its_own_file(self):
        pid, out = self.run_program("""
            import os, perftramp311
            perftramp311.activate()
            def before_fork(): pass
            before_fork()
            child = os.fork()
            if child == 0:
                def in_child(): pass
                in_child()
                os._exit(0)
            _, status = os.waitpid(child, 0)
            print(child, status)
        """)
        child, status = map(int, out.split())
        self.assertEqual(status, 0)
        parent_names = jitdump_names(pid)
        child_names = jitdump_names(child)
        self.assertIn("py::before_fork:<string>", parent_names)
        self.assertNotIn("py::in_child:<string>", parent_names)
        # Inherited trampolines keep their names in the child's file.
        self.assertIn("py::before_fork:<string>", child_names)
        self.assertIn("py::in_child:<string>", child_names)

    def test_fork_child_new_code_in_its_own_memory(self):
        # perf names what a child inherited from the parent's map, where
        # the parent names the free slots it goes on handing out: what the
        # child makes lies at none of the parent's addresses.
        pid, out = self.run_program("""
            import os, perftramp311
            perftramp311.activate("perf")
            def make(name):
                exec(f"def {name}(): pass\\n{name}()")
            make("before_fork")
            child = os.fork()
            if child == 0:
                make("in_child")
                os._exit(0)
            os.waitpid(child, 0)
            make("in_parent")
            print(child)
        """)
        child = int(out)
        parent_starts = {start for start, _ in map_lines(pid)}
        made = [start for start, name in map_lines(child)
                if name == "py::in_child:<string>"]
        self.assertEqual(len(made), 1)
        self.assertNotIn(made[0], parent_starts)

    def test_threads(self):
        pid, out = self.run_program("""
            import threading, perftramp311
            perftramp311.activate()
            results = []
            def work(i):
                def inner(j): return j * i
                results.append(sum(inner(j) for j in range(2000)))
            threads = [threading.Thread(target=work, args=(i,))
                       for i in range(8)]
            for t in threads: t.start()
            for t in threads: t.join()
            print(sorted(results) == [sum(j * i for j in range(2000))
                                      for i in range(8)])
        """)
        self.assertEqual(out.strip(), "True")
        names = jitdump_names(pid)
        self.assertIn("py::work.<locals>.inner:<string>", names)
        # One trampoline per code object, not per thread.
        self.assertEqual(names.count("py::work.<locals>.inner:<string>"), 1)

    def test_toggle(self):
        pid, out = self.run_program("""
            import perftramp311
            seen = []
            def f(): return 1
            for i in range(50):
                perftramp311.activate()
                seen.append(perftramp311.is_active())
                f()
                perftramp311.deactivate()
                seen.append(perftramp311.is_active())
                f()
            def after_off(): pass
            after_off()
            print(seen == [True, False] * 50, perftramp311.status())
        """)
        self.assertEqual(out.strip(), "True inactive")
        names = jitdump_names(pid)
        self.assertEqual(names.count("py::f:<string>"), 1)
        self.assertNotIn("py::after_off:<string>", names)

    def test_c_stack_guard(self):
        # Every Python call is a C call while the hook is installed: a
        # small thread, or a raised recursion limit, would run out of C
        # stack.  RecursionError instead, and the program goes on.
        proc = run(["-c", textwrap.dedent("""
            import sys, threading, perftramp311
            perftramp311.activate()
            def down(n): return down(n + 1)
            def probe(name):
                try:
                    down(0)
                except RecursionError:
                    print(name, "RecursionError")
            threading.stack_size(256 * 1024)
            t = threading.Thread(target=probe, args=("thread",))
            t.start(); t.join()
            sys.setrecursionlimit(10 ** 6)
            probe("main")
            print("active", perftramp311.is_active())
        """)])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout.split("\n"),
                         ["thread RecursionError", "main RecursionError",
                          "active True", ""])

    def test_environment_reaches_child(self):
        code = textwrap.dedent("""
            import os, subprocess, sys, perftramp311
            print(os.getpid(), perftramp311.is_active(), flush=True)
            subprocess.run([sys.executable, "-c",
                "import os, perftramp311; "
                "print(os.getpid(), perftramp311.is_active())"])
        """)
        proc = run(["-c", code], env=environment(PYTHONPERFSUPPORT="1"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        lines = [line.split() for line in proc.stdout.splitlines()]
        self.assertEqual([active for _, active in lines], ["True", "True"])
        for pid, _ in lines:
            self.assertIn("py::<module>:<string>", jitdump_names(int(pid)))
        off = run(["-c", "import perftramp311; print(perftramp311."
                   "is_active())"], env=environment(PYTHONPERFSUPPORT="0"))
        self.assertEqual(off.stdout, "False\n")

    def test_environment_rule(self):
        # As the interpreter reads them: a nonzero integer switches on,
        # anything else off (with a warning unless empty); under the
        # extension both variables mean the jitdump.
        code = ("import os, perftramp311; print(os.getpid(), "
                "perftramp311.status())")
        for variables, status, warning in (
                ({"PYTHON_PERF_JIT_SUPPORT": "1"}, "active (perf_jit)", ""),
                ({"PYTHONPERFSUPPORT": "2"}, "active (perf_jit)", ""),
                ({"PYTHONPERFSUPPORT": "1",
                  "PYTHON_PERF_JIT_SUPPORT": "0"}, "active (perf_jit)", ""),
                ({"PYTHONPERFSUPPORT": "0"}, "inactive", ""),
                ({"PYTHON_PERF_JIT_SUPPORT": ""}, "inactive", ""),
                ({"PYTHONPERFSUPPORT": "yes"}, "inactive",
                 "perftramp311: PYTHONPERFSUPPORT is not an integer; "
                 "taken as 0\n"),
                ({"PYTHON_PERF_JIT_SUPPORT": "1 "}, "inactive",
                 "perftramp311: PYTHON_PERF_JIT_SUPPORT is not an integer; "
                 "taken as 0\n"),
                # Beyond a C int, as the interpreter's own reading.
                ({"PYTHONPERFSUPPORT": "4294967296"}, "inactive",
                 "perftramp311: PYTHONPERFSUPPORT is not an integer; "
                 "taken as 0\n"),
                ({"PYTHONPERFSUPPORT": " -1"}, "active (perf_jit)", "")):
            with self.subTest(variables=variables):
                proc = run(["-c", code], env=environment(**variables))
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stderr, warning)
                pid, got = proc.stdout.rstrip("\n").split(" ", 1)
                self.assertEqual(got, status)
                if status != "inactive":
                    self.assertIn("py::<module>:<string>",
                                  jitdump_names(int(pid)))
        # -E: the interpreter ignores PYTHON* variables, and so do we.
        proc = run(["-E", "-c", code],
                   env=environment(PYTHON_PERF_JIT_SUPPORT="1"))
        self.assertEqual(proc.stdout.split(" ", 1)[1], "inactive\n")

    def test_environment_switches_on_without_the_package(self):
        # The .pth imports the C module alone (start-up cost); the
        # package, imported later, sees what it switched on.
        code = ("import os, sys; print(os.getpid(), 'perftramp311' in "
                "sys.modules, flush=True); import perftramp311; "
                "print(perftramp311.status())")
        proc = run(["-c", code], env=environment(PYTHONPERFSUPPORT="1"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        pid, imported, status = proc.stdout.split(None, 2)
        self.assertEqual((imported, status), ("False", "active (perf_jit)\n"))
        self.assertIn("py::<module>:<string>", jitdump_names(int(pid)))

    def test_runner_script_and_module(self):
        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "app.py"), "w") as f:
                f.write("import os, sys, perftramp311\n"
                        "print(os.getpid(), __name__, sys.argv[1:], "
                        "perftramp311.is_active())\n")
            script = run(["-m", "perftramp311", "app.py", "a", "-b"],
                         cwd=tmp)
            module = run(["-m", "perftramp311", "-m", "app", "c"], cwd=tmp)
            command = run(["-m", "perftramp311", "-c", "import app", "d"],
                          cwd=tmp)
        for proc, argv, name in ((script, "['a', '-b']", "__main__"),
                                 (module, "['c']", "__main__"),
                                 (command, "['d']", "app")):
            self.assertEqual(proc.returncode, 0, proc.stderr)
            pid, rest = proc.stdout.split(" ", 1)
            self.assertEqual(rest, f"{name} {argv} True\n")
            self.assertIn("py::<module>:" + os.path.join(tmp, "app.py"),
                          jitdump_names(int(pid)))

    def test_refuses_other_version(self):
        # A Python other than 3.11 that finds the package: one line.
        pyenv_root = os.path.expanduser("~/.pyenv/versions")
        others = sorted(glob.glob(pyenv_root + "/3.1[02]*/bin/python3")
                        + glob.glob("/usr/bin/python3.1[02]"))
        package = os.path.dirname(os.path.dirname(perftramp311.__file__))
        if others:
            cmd = [others[0], "-m", "perftramp311", "x.py"]
            env = environment(PYTHONPATH=package)
        else:
            # None installed here: this interpreter, claiming another
            # version before the package is imported.
            cmd = [sys.executable, "-c",
                   "import sys, runpy; sys.version_info = (3, 12, 1, "
                   "'final', 0); sys.argv = ['perftramp311', 'x.py']; "
                   "runpy.run_module('perftramp311', run_name='__main__')"]
            env = environment()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env,
                              timeout=60)
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertRegex(proc.stderr,
                         r"^perftramp311: needs CPython 3\.11, this is "
                         r"cpython 3\.1[02]\.\d+\n$")

    OTHER_EVALUATOR = textwrap.dedent("""
        import ctypes, perftramp311
        api = ctypes.pythonapi
        api.PyInterpreterState_Get.restype = ctypes.c_void_p
        api._PyInterpreterState_SetEvalFrameFunc.argtypes = [
            ctypes.c_void_p, ctypes.c_void_p]
        def install_other():
            api._PyInterpreterState_SetEvalFrameFunc(
                api.PyInterpreterState_Get(),
                perftramp311._ext._probe_address())
        def named(): pass
    """)

    def test_other_evaluator_before_is_chained(self):
        pid, out = self.run_program(self.OTHER_EVALUATOR + textwrap.dedent("""
            install_other()
            perftramp311.activate()
            named()
            print(perftramp311.is_active())
            print(perftramp311.status())
        """))
        active, status = out.splitlines()
        self.assertEqual(active, "True")
        self.assertRegex(status, r"^active \(perf_jit\); chained: \S+$")
        self.assertIn("py::named:<string>", jitdump_names(pid))

    def test_other_evaluator_after_is_reported(self):
        pid, out = self.run_program(self.OTHER_EVALUATOR + textwrap.dedent("""
            perftramp311.activate()
            install_other()
            named()
            print(perftramp311.is_active())
            print(perftramp311.status())
        """))
        active, status = out.splitlines()
        self.assertEqual(active, "False")
        self.assertRegex(status, r"^replaced: another frame evaluator was "
                         r"installed after activate\('perf_jit'\)")
        self.assertNotIn("py::named:<string>", jitdump_names(pid))

    def test_patched_interpreter_keeps_its_own(self):
        patched = os.environ.get("PERFTRAMP311_PATCHED_PYTHON")
        if not patched:
            skip_or_fail("PERFTRAMP311_PATCHED_PYTHON (our patched "
                         "interpreter) is not set")
        package = os.path.dirname(os.path.dirname(perftramp311.__file__))
        proc = subprocess.run(
            [patched, "-c", "import perftramp311, sys; "
             "perftramp311.activate('perf'); "
             "print(sys.is_stack_trampoline_active(), "
             "perftramp311.status())"],
            capture_output=True, text=True, timeout=60,
            env=environment(PYTHONPATH=package))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, "True built in: active\n")
        self.assertIn("perf trampolines built in", proc.stderr)


class TestCommandLine(unittest.TestCase):
    """python3.11 -m perftramp311 and -m perf_trampoline: help, versions
    and every mistake said in a line or two, never a traceback; record
    stops before perf."""

    def setUp(self):
        self.tmp = scratch(self)
        # A perf that says its version and logs what it was asked.
        self.perf_log = os.path.join(self.tmp, "perf.log")
        self.perf = os.path.join(self.tmp, "perf")
        with open(self.perf, "w") as f:
            f.write(f'#!/bin/sh\necho "$1" >> {self.perf_log}\n'
                    f'echo "perf version 6.12.0"\n')
        os.chmod(self.perf, 0o755)

    def main(self, *args, module="perftramp311"):
        return run(["-m", module, *args], cwd=self.tmp,
                   env=environment(PERF=self.perf))

    def tools(self, *args):
        return self.main(*args, module="perf_trampoline")

    def perf_asked(self):
        try:
            with open(self.perf_log) as f:
                return f.read().split()
        except FileNotFoundError:
            return []

    def assert_error(self, proc, line, usage=None):
        """Exit status 2, `line` the last line of stderr, after the usage
        of `usage` (a program and command) if given, nothing on
        stdout."""
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(proc.stdout, "")
        lines = proc.stderr.splitlines()
        self.assertEqual(lines[-1], line)
        if usage is None:
            self.assertEqual(len(lines), 1, proc.stderr)
        else:
            self.assertTrue(lines[0].startswith(f"usage: {usage} "),
                            proc.stderr)
            self.assertNotIn("Traceback", proc.stderr)

    def test_help(self):
        for args, start in (
                (["--help"], "usage: python3.11 -m perftramp311 [options] "
                             "PROGRAM"),
                (["record", "--help"],
                 "python3.11 -m perftramp311 record [options] PROGRAM "
                 "[ARG...] is\npython3.11 -m perf_trampoline record "
                 "[options] -- python3.11 PROGRAM [ARG...]:\n\nusage: "
                 "python3.11 -I -m perf_trampoline record [options]")):
            with self.subTest(args=args):
                proc = self.main(*args)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stderr, "")
                self.assertTrue(proc.stdout.startswith(start), proc.stdout)
        proc = self.tools("record", "--help")
        self.assertEqual((proc.returncode, proc.stderr), (0, ""))
        self.assertTrue(proc.stdout.startswith(
            "usage: python3.11 -I -m perf_trampoline record "), proc.stdout)
        self.assertEqual(self.perf_asked(), [])

    def test_version(self):
        proc = self.main("--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, "perftramp311 %s on Python %s\n" % (
            perftramp311.__version__, sys.version.split()[0]))

    def test_tools_installed_beside(self):
        # perf_trampoline, the operators' tools, comes with the package,
        # and the template of its flame graphs with it.
        proc = self.tools("--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, "perf trampolines perftramp311 %s on "
                         "Python %s\n" % (perftramp311.__version__,
                                          sys.version.split()[0]))
        proc = self.tools("--help")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("record", proc.stdout)
        from perf_trampoline import _reports
        self.assertIn(_reports.STACKS_PLACEHOLDER, _reports.read_template())

    def test_usage_errors(self):
        prog = "python3.11 -m perftramp311"
        record = "python3.11 -I -m perf_trampoline record"
        for args, error, usage in (
                (["--bakend", "perf", "app.py"],
                 f"{prog}: error: unrecognized arguments: --bakend", prog),
                (["--backend", "perfmap", "app.py"],
                 f"{prog}: error: argument --backend: invalid choice: "
                 f"'perfmap' (choose from 'perf_jit', 'perf')", prog),
                (["-m"], f"{prog}: error: argument -m: expected one "
                         f"argument", prog),
                ([], f"{prog}: error: give the program to run: app.py, "
                     f"-m MODULE or -c COMMAND", prog),
                (["record", "-F", "0", "app.py"],
                 "perf_trampoline: -F HZ must be a positive number", None),
                (["record", "--ouput", "x", "app.py"],
                 f"{record}: error: unrecognized arguments: --ouput",
                 record),
                (["record", "--call-graph", "fp", "app.py"],
                 "perf_trampoline: --call-graph fp: a stock 3.11 keeps no "
                 "frame pointers, and perftramp311 describes its frames "
                 "for DWARF: give --call-graph dwarf[,BYTES] or leave it "
                 "out", None)):
            with self.subTest(args=args):
                with open(os.path.join(self.tmp, "app.py"), "w"):
                    pass
                self.assert_error(self.main(*args), error, usage)
        for args, error in (
                (["record", "--bakend", "x", "--", "true"],
                 f"{record}: error: unrecognized arguments: --bakend"),
                (["attach"], "python3.11 -I -m perf_trampoline attach: "
                             "error: the following arguments are required: "
                             "pid")):
            with self.subTest(args=args):
                proc = self.tools(*args)
                self.assert_error(proc, error, error.partition(":")[0])
        self.assertEqual(self.perf_asked(), [])

    def test_missing_program(self):
        missing = os.path.join(self.tmp, "nosuch.py")
        for args, error in (
                (["nosuch.py"], f"can't open file {missing!r}: No such "
                                f"file or directory"),
                (["-m", "nosuch_module"], "no module named 'nosuch_module'"),
                (["record", "-o", "out", "nosuch.py"],
                 f"can't open file {missing!r}: No such file or "
                 f"directory"),
                (["record", "-o", "out", "-m", "nosuch_module"],
                 "no module named 'nosuch_module'")):
            with self.subTest(args=args):
                self.assert_error(self.main(*args), "perftramp311: " + error)
        # A command that is not found: 127, as env(1) says it.
        proc = self.tools("record", "-o", "out", "--", "no-such-command")
        self.assertEqual((proc.returncode, proc.stderr),
                         (127, "perf_trampoline: command not found: "
                               "no-such-command: check its name, or give "
                               "its path\n"))
        # Before perf, and before the output directory.
        self.assertEqual(self.perf_asked(), [])
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out")))

    def test_record_output_cannot_be_made(self):
        with open(os.path.join(self.tmp, "file"), "w"):
            pass
        out = os.path.join(self.tmp, "file", "out")
        for args, error in (
                (["-o", out], f"cannot create {out}: {os.path.dirname(out)}:"
                              f" Not a directory"),
                # Not even root may make a directory there.
                (["-o", "/sys/out"], "cannot create /sys/out: Operation "
                                     "not permitted")):
            for main in (self.main, self.tools):
                with self.subTest(args=args, main=main):
                    self.assert_error(
                        main("record", *args, "--", sys.executable, "-c",
                             "pass"),
                        f"perf_trampoline: {error}; name another directory "
                        f"with -o DIR")
        self.assertEqual(self.perf_asked(), ["version"] * 4)

    def test_record_keeps_earlier_recording(self):
        out = os.path.join(self.tmp, "out")
        os.mkdir(out)
        data = os.path.join(out, "perf.data")
        with open(data, "w") as f:
            f.write("an earlier recording")
        for main in (self.main, self.tools):
            with self.subTest(main=main):
                self.assert_error(
                    main("record", "-o", out, "--", sys.executable, "-c",
                         "pass"),
                    f"perf_trampoline: {out} holds a perf.data already: "
                    f"name another directory with -o, or overwrite it "
                    f"with --force")
        with open(data) as f:
            self.assertEqual(f.read(), "an earlier recording")
        self.assertEqual(os.listdir(out), ["perf.data"])

    def test_running_process_is_refused(self):
        # A stock 3.11 acts on no request from outside: perftramp311 is
        # switched on when the program starts, or not at all.
        proc = subprocess.Popen(
            [sys.executable, "-c", "import sys; print('ready', flush=True);"
             " sys.stdin.read()"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=environment())
        self.addCleanup(proc.wait)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.stdin.close)
        self.assertEqual(proc.stdout.readline(), "ready\n")
        line = (f"perf_trampoline: process {proc.pid} runs "
                f"{os.path.realpath(sys.executable)}, which has no perf "
                f"trampolines to switch from outside: start it with -X perf "
                f"on this interpreter, or, on a stock 3.11, with "
                f"perftramp311 installed and PYTHONPERFSUPPORT=1")
        for args in (["attach", str(proc.pid)], ["status", str(proc.pid)],
                     ["detach", str(proc.pid)],
                     ["record", "-o", "out", "-p", str(proc.pid)]):
            with self.subTest(args=args):
                self.assert_error(self.tools(*args), line)
        self.assertIsNone(proc.poll())
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out")))


def find_perf():
    """PERF, else perf on PATH; a skip (a failure where required) if it
    is missing or cannot name jitdump frames (perf_trampoline._record
    .PERF_JIT_MIN)."""
    from perf_trampoline import _record
    perf = os.environ.get("PERF") or shutil.which("perf")
    if not perf or not os.access(perf, os.X_OK):
        skip_or_fail("no perf (Debian: linux-perf)")
    version = subprocess.run([perf, "version"], capture_output=True,
                             text=True).stdout
    found = re.search(r"(\d+)\.(\d+)", version)
    if not found or tuple(map(int, found.groups())) < _record.PERF_JIT_MIN:
        skip_or_fail(f"{perf} is too old ({version.strip()}): make deps-jit")
    return perf


def report_stacks(path):
    """Each stack the report `path` shows, as its frames' names, root
    first: a line of folded stacks (the process first), or a root-to-leaf
    path of the tree a flame graph draws."""
    with open(path, encoding="utf-8") as f:
        text = f.read()
    if path.endswith(".folded"):
        return [line.rpartition(" ")[0].split(";")
                for line in text.splitlines()]
    found = re.search(r"const stacks = \[(.*?)\];\n", text, re.S)
    paths = []

    def walk(node, above):
        here = above + [node["n"]]
        if node["v"]:
            paths.append(here)
        for child in node["c"]:
            walk(child, here)
    walk(json.loads(found.group(1)), [])
    return paths


def readme_lines():
    """The commands of the README's block for a stock 3.11 (in "Use the
    Python you already have"), each split into words as a shell would."""
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        section = f.read().split("\n## Use the Python you already have\n")[1]
    block = re.search(r"\n\n((?:    .*\n)+)", section).group(1)
    return [shlex.split(line, comments=True) for line in block.splitlines()]


def python_frames(names):
    """(index, function name) of the Python frames among `names`."""
    return [(i, m.group(1)) for i, name in enumerate(names)
            for m in [re.match(r"py::([^:]+):", name)] if m]


class TestRecord(FilesMixin, unittest.TestCase):
    """python3.11 -m perf_trampoline record on this stock interpreter:
    the jitdump, perf record --call-graph dwarf and perf inject --jit,
    the reports of the patched interpreter, nothing left outside -o."""

    def setUp(self):
        super().setUp()
        self.perf = find_perf()
        self.tmp = scratch(self)
        self.out = os.path.join(self.tmp, "out")
        self.app = os.path.join(self.tmp, "app.py")
        with open(self.app, "w") as f:
            f.write(PROGRAM)
        # perf's build-id cache would be $HOME/.debug: a home of its own
        # shows whether anything is put there.
        self.home = os.path.join(self.tmp, "home")
        os.mkdir(self.home)

    def record(self, *args, module="perf_trampoline", **kwargs):
        return run(["-m", module, "record", "-o", self.out, *args],
                   env=environment(PERF=self.perf, HOME=self.home),
                   cwd=self.tmp, **kwargs)

    def assert_recorded(self, proc, chain=("top", "middle", "leaf")):
        """record wrote the reports and named them on stderr alone, the
        program's stdout being empty; both flame graphs show `chain`
        (outermost first); perf report, as printed, names its frames;
        nothing is left outside the output directory."""
        self.assertEqual(proc.stdout, "")
        lines = proc.stderr.splitlines()
        ours = [line for line in lines if line.startswith("perf_trampoline")]
        # What record says follows the program's output.
        self.assertTrue(ours, proc.stderr)
        self.assertNotIn("Traceback",
                         "\n".join(lines[lines.index(ours[0]):]))
        paths = lines[lines.index(os.path.join(self.out, "perf.data")):]
        self.assertEqual(paths[:5], [
            os.path.join(self.out, name) for name in (
                "perf.data", "flamegraph.html", "flamegraph-python.html",
                "stacks.folded", "stacks-python.folded")])
        # The Python views: the chain's frames next to each other; every
        # frame: the interpreter's between them.
        chain = list(chain)
        for view, apart in ((2, False), (1, True), (4, False), (3, True)):
            found = []
            for names in report_stacks(paths[view]):
                python = python_frames(names)[-3:]
                if [name for _, name in python] == chain:
                    found.append(python[-1][0] - python[0][0] > 2)
            self.assertIn(apart, found, paths[view])
        # The perf report line, run in the output directory.
        [command] = [line.split(": ", 2)[2] for line in lines
                     if line.startswith("perf_trampoline: perf report: ")]
        report = subprocess.run(
            [*shlex.split(command), "--stdio", "--no-children"],
            capture_output=True, text=True, cwd=self.out, timeout=300,
            env=environment(HOME=self.home))
        self.assertEqual(report.returncode, 0, report.stderr)
        self.assertIn("py::leaf:", report.stdout)
        self.assert_nothing_left(paths[3])

    def assert_nothing_left(self, folded):
        """No file of the recorded processes in /tmp, nothing in
        ~/.debug."""
        with open(folded) as f:
            pids = set(re.findall(r"^[^;]* \((\d+)\);", f.read(), re.M))
        self.assertTrue(pids)
        left = [path for path in profiler_files() - self.before
                if re.search(r"-(\d+)[.-]", path).group(1) in pids]
        self.assertEqual(left, [])
        self.assertEqual(os.listdir(self.home), [])

    def test_command(self):
        proc = self.record("--", sys.executable, self.app)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assert_recorded(proc)

    def test_readme_lines(self):
        # The README's lines for a stock 3.11, as they stand, python3.11
        # being this venv's interpreter and ~/venv a fresh venv of it: its
        # own pip installs the package offline, then app.py is recorded
        # where it lies, into the default output directory.
        venv = os.path.join(self.tmp, "venv")
        commands = [[sys._base_executable if word == "python3.11"
                     else re.sub(r"^~/venv(?=/|$)", lambda _: venv, word)
                     for word in words] for words in readme_lines()]
        self.assertEqual(len(commands), 3, commands)
        for args in commands[:2]:
            proc = subprocess.run(args, cwd=ROOT, capture_output=True,
                                  text=True, timeout=300,
                                  env=environment(PIP_NO_INDEX="1"))
            self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = subprocess.run(commands[2], cwd=self.tmp, capture_output=True,
                              text=True, timeout=300, env=environment(
                                  PERF=self.perf, HOME=self.home))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        [made] = set(os.listdir(self.tmp)) - {"app.py", "home", "venv"}
        self.assertRegex(made, r"^perf-record-\d{8}-\d{6}$")
        self.out = os.path.join(self.tmp, made)
        self.assert_recorded(proc)

    def test_perf_of_the_release(self):
        # Debian 12's perf 6.1 names the frames too (test_oracle's
        # ExtensionOracleTests with PERF=/usr/bin/perf).
        if not os.access("/usr/bin/perf", os.X_OK):
            skip_or_fail("/usr/bin/perf is missing (Debian: linux-perf)")
        self.perf = "/usr/bin/perf"
        proc = self.record("--", sys.executable, self.app)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assert_recorded(proc)

    def test_front_door(self):
        # -m perftramp311 record: the program as python3.11 takes it, its
        # -m its own.
        proc = self.record("-m", "app", module="perftramp311")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assert_recorded(proc)

    def test_python_without_the_package(self):
        # The venv's base interpreter, which does not have it: said.
        proc = self.record("--", sys._base_executable, self.app)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn(f"\nperf_trampoline: no Python function was named: a "
                      f"Python program must run on a Python with perf "
                      f"trampolines, such as "
                      f"{os.path.normpath(sys.executable)}\n",
                      "\n" + proc.stderr)

    def test_missing_script(self):
        # The interpreter says so, and exits 2; so does record, after it.
        proc = self.record("--", sys.executable, "nosuch.py")
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertNotIn("Traceback", proc.stderr)
        self.assertIn("can't open file", proc.stderr)
        self.assertIn("perf_trampoline: the command exited with status 2\n",
                      proc.stderr)

    def test_killed_program(self):
        # Killed by signal N: 128+N, as a shell says it; the recording is
        # kept.
        proc = self.record("--", sys.executable, "-c",
                           "import os, signal\n" + PROGRAM
                           + "os.kill(os.getpid(), signal.SIGKILL)")
        self.assertEqual(proc.returncode, 128 + signal.SIGKILL, proc.stderr)
        self.assertIn("perf_trampoline: the command was killed by "
                      "SIGKILL\n", proc.stderr)
        self.assert_recorded(proc)

    def test_interrupted(self):
        # Ctrl-C: SIGINT to the terminal's foreground process group, which
        # the program is in; perf writes what it recorded all the same.
        proc = subprocess.Popen(
            [sys.executable, "-m", "perftramp311", "record", "-o", self.out,
             "-c", PROGRAM.replace("top()\n", "")
             + "print('ready', flush=True)\nwhile True: top()"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=environment(PERF=self.perf, HOME=self.home),
            start_new_session=True)
        try:
            self.assertEqual(proc.stdout.readline(), "ready\n")
            time.sleep(1)   # samples of the loop, not a timing test
            os.killpg(proc.pid, signal.SIGINT)
            stdout, stderr = proc.communicate(timeout=300)
        finally:
            if proc.returncode is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.assertEqual(proc.returncode, 128 + signal.SIGINT, stderr)
        self.assert_recorded(subprocess.CompletedProcess(
            proc.args, proc.returncode, "", stderr))

    def test_cut_short(self):
        # Too few bytes of stack for the program's: the share cut short,
        # and the size to try.
        proc = self.record("--call-graph", "dwarf,1024", "--",
                           sys.executable, self.app)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertRegex(proc.stderr, r"\nperf_trampoline: \d+% of the "
                         r"samples were cut short \(1024 bytes of stack "
                         r"copied per sample\): try --call-graph "
                         r"dwarf,2048\n")


class TestPerfDwarf(FilesMixin, unittest.TestCase):
    """perf names leaf <- middle <- top, PYTHONPERFSUPPORT=1 the only
    change: the README's perf record --call-graph dwarf, perf inject
    --jit."""

    def test_leaf_middle_top(self):
        perf = find_perf()
        with tempfile.TemporaryDirectory() as tmp:
            app = os.path.join(tmp, "app.py")
            with open(app, "w") as f:
                f.write(PROGRAM)
            # Its build-id cache here, not in ~/.debug.
            perf = [perf, "--buildid-dir", os.path.join(tmp, "debug")]
            data = os.path.join(tmp, "perf.data")
            rec = subprocess.run(
                [*perf, "record", "-q", "-k", "1", "-e", "cpu-clock",
                 "-F", "999", "--call-graph", "dwarf", "-o", data,
                 sys.executable, app],
                capture_output=True, text=True, timeout=300,
                env=environment(PYTHONPERFSUPPORT="1"))
            if rec.returncode != 0 and "Permission" in rec.stderr:
                skip_or_fail("perf cannot record here: "
                             + rec.stderr.strip()[:200])
            self.assertEqual(rec.returncode, 0, rec.stderr)
            injected = os.path.join(tmp, "perf.jit.data")
            inject = subprocess.run(
                [*perf, "inject", "--jit", "-i", data, "-o", injected],
                capture_output=True, text=True, timeout=300, cwd=tmp)
            self.assertEqual(inject.returncode, 0, inject.stderr)
            script = subprocess.run(
                [*perf, "script", "-F", "ip,sym", "-i", injected],
                capture_output=True, text=True, timeout=300, cwd=tmp)
            self.assertEqual(script.returncode, 0, script.stderr)
            chains = 0
            for sample in script.stdout.split("\n\n"):
                names = [m.group(1) for m in
                         re.finditer(r"py::([^:\s]+):", sample)]
                if names[:3] == ["leaf", "middle", "top"]:
                    chains += 1
            self.assertGreater(chains, 10, script.stdout[-3000:])


if __name__ == "__main__":
    unittest.main()
