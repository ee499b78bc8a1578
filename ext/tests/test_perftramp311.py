"""Tests of perftramp311 with the stock interpreter running them.

Run with the interpreter of a venv that has the package installed
(tools/run_tests.py: every venv made by make ext):

    build/ext/venv-debian/bin/python -m unittest test_perftramp311

Every program under test is a subprocess.  Where tests are required
(CI=true or PERF_TESTS_REQUIRED=1), a missing tool is a failure, not a
skip.
"""

import glob
import os
import re
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


class FilesMixin:
    """Remove the profiler files of the processes the test started."""

    def setUp(self):
        self.before = set(glob.glob("/tmp/perf-*.map")
                          + glob.glob("/tmp/jit-*.dump"))

    def tearDown(self):
        for path in set(glob.glob("/tmp/perf-*.map")
                        + glob.glob("/tmp/jit-*.dump")) - self.before:
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
    """python3.11 -m perftramp311: help, versions and every mistake said
    in a line or two, never a traceback; record stops before perf."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        # A perf that says its version and logs what it was asked.
        self.perf_log = os.path.join(self.tmp, "perf.log")
        self.perf = os.path.join(self.tmp, "perf")
        with open(self.perf, "w") as f:
            f.write(f'#!/bin/sh\necho "$1" >> {self.perf_log}\n'
                    f'echo "perf version 6.12.0"\n')
        os.chmod(self.perf, 0o755)

    def main(self, *args):
        return run(["-m", "perftramp311", *args], cwd=self.tmp,
                   env=environment(PERF=self.perf))

    def perf_asked(self):
        try:
            with open(self.perf_log) as f:
                return f.read().split()
        except FileNotFoundError:
            return []

    def assert_error(self, proc, line, usage=False):
        """Exit status 2, `line` the last line of stderr (after a usage
        line if `usage`), nothing on stdout."""
        self.assertEqual(proc.returncode, 2, proc.stderr)
        self.assertEqual(proc.stdout, "")
        lines = proc.stderr.splitlines()
        self.assertEqual(lines[-1], line)
        self.assertEqual(len(lines), 2 if usage else 1, proc.stderr)
        if usage:
            self.assertRegex(lines[0], r"^usage: python3\.11 -m perftramp311 ")

    def test_help(self):
        for args, usage in ((["--help"], "[options] PROGRAM"),
                            (["record", "--help"], "record [options]")):
            with self.subTest(args=args):
                proc = self.main(*args)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stderr, "")
                self.assertTrue(proc.stdout.startswith(
                    "usage: python3.11 -m perftramp311 " + usage),
                    proc.stdout)

    def test_version(self):
        proc = self.main("--version")
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, "perftramp311 %s on Python %s\n" % (
            perftramp311.__version__, sys.version.split()[0]))

    def test_tools_installed_beside(self):
        # perf_trampoline, the operators' tools, comes with the package.
        proc = run(["-m", "perf_trampoline", "--version"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stdout, "perf trampolines perftramp311 %s on "
                         "Python %s\n" % (perftramp311.__version__,
                                          sys.version.split()[0]))
        proc = run(["-m", "perf_trampoline", "--help"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("record", proc.stdout)

    def test_usage_errors(self):
        prog = "python3.11 -m perftramp311"
        for args, error in (
                (["--bakend", "perf", "app.py"],
                 f"{prog}: error: unrecognized arguments: --bakend"),
                (["--backend", "perfmap", "app.py"],
                 f"{prog}: error: argument --backend: invalid choice: "
                 f"'perfmap' (choose from 'perf_jit', 'perf')"),
                (["-m"], f"{prog}: error: argument -m: expected one "
                         f"argument"),
                ([], f"{prog}: error: give the program to run: app.py, "
                     f"-m MODULE or -c COMMAND"),
                (["record", "-F", "0", "app.py"],
                 f"{prog} record: error: -F HZ must be a positive number"),
                (["record", "--ouput", "x", "app.py"],
                 f"{prog} record: error: unrecognized arguments: --ouput")):
            with self.subTest(args=args):
                self.assert_error(self.main(*args), error, usage=True)
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
        # Before perf, and before the output directory.
        self.assertEqual(self.perf_asked(), [])
        self.assertFalse(os.path.exists(os.path.join(self.tmp, "out")))

    def test_record_output_not_a_directory(self):
        with open(os.path.join(self.tmp, "file"), "w"):
            pass
        out = os.path.join(self.tmp, "file", "out")
        self.assert_error(
            self.main("record", "-o", out, "-c", "pass"),
            f"perftramp311: cannot create {out}: {os.path.dirname(out)}: "
            f"Not a directory; name another directory with -o DIR")
        self.assertEqual(self.perf_asked(), ["version"])

    def test_record_keeps_earlier_recording(self):
        out = os.path.join(self.tmp, "out")
        os.mkdir(out)
        data = os.path.join(out, "perf.data")
        with open(data, "w") as f:
            f.write("an earlier recording")
        self.assert_error(
            self.main("record", "-o", out, "-c", "pass"),
            f"perftramp311: {out} holds a perf.data already: name another "
            f"directory with -o, or overwrite it with --force")
        with open(data) as f:
            self.assertEqual(f.read(), "an earlier recording")
        self.assertEqual(self.perf_asked(), ["version"])


class TestPerfDwarf(FilesMixin, unittest.TestCase):
    """perf names leaf <- middle <- top, PYTHONPERFSUPPORT=1 the only
    change: perf record --call-graph dwarf, perf inject --jit."""

    def setUp(self):
        super().setUp()
        perf = os.environ.get("PERF") or shutil.which("perf")
        if not perf or not os.access(perf, os.X_OK):
            skip_or_fail("no perf (make deps-jit installs perf >= 6.8)")
        version = subprocess.run([perf, "version"], capture_output=True,
                                 text=True).stdout
        found = re.search(r"(\d+)\.(\d+)", version)
        if not found or tuple(map(int, found.groups())) < (6, 8):
            skip_or_fail(f"{perf} is older than 6.8 ({version.strip()}): "
                         "make deps-jit")
        self.perf = perf

    def assert_chains(self, injected, cwd):
        """perf script on `injected` shows leaf <- middle <- top."""
        script = subprocess.run(
            [self.perf, "script", "-F", "ip,sym", "-i", injected],
            capture_output=True, text=True, timeout=300, cwd=cwd)
        self.assertEqual(script.returncode, 0, script.stderr)
        chains = 0
        for sample in script.stdout.split("\n\n"):
            names = [m.group(1) for m in
                     re.finditer(r"py::([^:\s]+):", sample)]
            if names[:3] == ["leaf", "middle", "top"]:
                chains += 1
        self.assertGreater(chains, 10, script.stdout[-3000:])

    def assert_recorded(self, out, stdout, stderr):
        """record wrote out/perf.data, named it on stderr alone, and
        left stdout to the program (whose own prints nothing)."""
        injected = os.path.join(out, "perf.data")
        self.assertEqual(stdout, "")
        self.assertIn(f"perftramp311: perf report -i {injected}\n", stderr)
        self.assert_chains(injected, out)

    def test_record_command(self):
        with tempfile.TemporaryDirectory() as tmp:
            app = os.path.join(tmp, "app.py")
            with open(app, "w") as f:
                f.write(PROGRAM)
            out = os.path.join(tmp, "out")
            # The program as a module: its -m is the program's, not ours.
            proc = run(["-m", "perftramp311", "record", "-o", out,
                        "-m", "app"], env=environment(PERF=self.perf),
                       cwd=tmp)
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assert_recorded(out, proc.stdout, proc.stderr)

    def test_record_killed_program(self):
        # Killed by signal N: 128+N, as a shell and perf_trampoline
        # record say it; the recording is kept.
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            proc = run(["-m", "perftramp311", "record", "-o", out, "-c",
                        "import os, signal\n" + PROGRAM
                        + "os.kill(os.getpid(), signal.SIGKILL)"],
                       env=environment(PERF=self.perf))
            self.assertEqual(proc.returncode, 128 + signal.SIGKILL,
                             proc.stderr)
            self.assertIn("perftramp311: the program was killed by "
                          "SIGKILL\n", proc.stderr)
            self.assert_recorded(out, proc.stdout, proc.stderr)

    def test_record_interrupted(self):
        # Ctrl-C: SIGINT to the terminal's foreground process group.  The
        # program ends by it, or by the SIGTERM perf sends it once perf
        # has stopped; perf writes what it recorded all the same.
        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "out")
            proc = subprocess.Popen(
                [sys.executable, "-m", "perftramp311", "record", "-o", out,
                 "-c", PROGRAM.replace("top()\n", "")
                 + "print('ready', flush=True)\nwhile True: top()"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=environment(PERF=self.perf), start_new_session=True)
            try:
                self.assertEqual(proc.stdout.readline(), "ready\n")
                time.sleep(1)   # samples of the loop, not a timing test
                os.killpg(proc.pid, signal.SIGINT)
                stdout, stderr = proc.communicate(timeout=300)
            finally:
                if proc.returncode is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
            self.assertIn(proc.returncode, (128 + signal.SIGINT,
                                            128 + signal.SIGTERM), stderr)
            self.assert_recorded(out, stdout, stderr)

    def test_leaf_middle_top(self):
        perf = self.perf
        with tempfile.TemporaryDirectory() as tmp:
            app = os.path.join(tmp, "app.py")
            with open(app, "w") as f:
                f.write(PROGRAM)
            data = os.path.join(tmp, "perf.data")
            rec = subprocess.run(
                [perf, "record", "-q", "-k", "1", "-e", "cpu-clock",
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
                [perf, "inject", "--jit", "-i", data, "-o", injected],
                capture_output=True, text=True, timeout=300, cwd=tmp)
            self.assertEqual(inject.returncode, 0, inject.stderr)
            self.assert_chains(injected, tmp)


if __name__ == "__main__":
    unittest.main()
