"""The C API of perf maps and trampolines (Include/cpython/sysmodule.h):
PyUnstable_PerfMapState_Init, PyUnstable_WritePerfMapEntry,
PyUnstable_PerfMapState_Fini, PyUnstable_CopyPerfMapFile,
PyUnstable_PerfTrampoline_CompileCode and
PyUnstable_PerfTrampoline_SetPersistAfterFork, called through _testcapi.

The perf map functions report (result, errno) there.  Entries written
through the API share /tmp/perf-<pid>.map with the trampolines' and must
stay whole lines, whichever thread writes them, with or without the GIL.
"""

import errno
import os
import signal
import textwrap
import unittest

from test.support import import_helper
from test.test_perf_profiler.util import (
    TIMEOUT, MapEntry, PerfTestCase, before_and_later, clean_env, map_path,
    needs_host)

PERF = ("-X", "perf")

# Every script starts with this: the API through _testcapi, and the path
# of its own map.
PRELUDE = """\
import os, sys, _testcapi
from _testcapi import (
    perf_map_state_init as init, write_perf_map_entry as write,
    perf_map_state_fini as fini, copy_perf_map_file as copy,
    perf_trampoline_compile_code as compile_code,
    perf_trampoline_set_persist_after_fork as persist)
MAP = f"/tmp/perf-{os.getpid()}.map"

def fresh_map():
    # Maps are never removed: one left by an earlier process with our
    # pid may be here, or a directory or link a test planted.
    if os.path.isdir(MAP) and not os.path.islink(MAP):
        os.rmdir(MAP)
    elif os.path.lexists(MAP):
        os.unlink(MAP)

def map_text():
    with open(MAP) as f:
        return f.read()

def map_descriptors():
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == MAP:
                found.append(int(fd))
        except OSError:
            pass
    return found
"""

# Where the test entries go: far from any mapping of the process, so that
# they can never be mistaken for trampolines.
JIT_BASE = 0x10000000


class CapiTestCase(PerfTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        testcapi = import_helper.import_module("_testcapi")
        # Part of this build: a _testcapi without it was not rebuilt.
        for name in ("write_perf_map_entry", "perf_map_state_init",
                     "perf_map_state_fini", "copy_perf_map_file",
                     "perf_trampoline_compile_code",
                     "perf_trampoline_set_persist_after_fork",
                     "write_perf_map_entries_from_threads"):
            if not hasattr(testcapi, name):
                raise AssertionError(f"_testcapi lacks {name}")

    def run_capi(self, source, **kwargs):
        """run_script() of PRELUDE, then `source` (dedented)."""
        return self.run_script(PRELUDE + textwrap.dedent(source), **kwargs)

    def assertWholeLines(self, pid):
        """The map of `pid` in bytes, split in lines, each of them
        "START SIZE NAME"; the file ends with a newline."""
        with open(map_path(pid), "rb") as f:
            data = f.read()
        self.assertNotIn(b"\0", data)
        if data:
            self.assertTrue(data.endswith(b"\n"), data[-100:])
        lines = data.split(b"\n")[:-1]
        for line in lines:
            self.assertRegex(line, rb"^[0-9a-f]{1,16} [0-9a-f]{1,8} ")
        return lines


class WriteEntryTests(CapiTestCase):

    def test_entries_join_the_trampolines_map(self):
        result = self.run_capi(before_and_later(f"""
            print(write({JIT_BASE:#x}, 0x40, "py::jitted_one:<jit>"))
            later()
            print(write({JIT_BASE + 0x1000:#x}, 0x80, "py::jitted_two:<jit>"))
            """), python_args=PERF)
        self.assertEqual(result.stdout, "(0, 0)\n(0, 0)\n")
        entries = self.assertMapWellFormed(result.pid)
        one = MapEntry(JIT_BASE, 0x40, "py::jitted_one:<jit>")
        two = MapEntry(JIT_BASE + 0x1000, 0x80, "py::jitted_two:<jit>")
        symbols = [e.symbol for e in entries]
        before = symbols.index(f"py::before:{result.path}")
        after = symbols.index(f"py::later.<locals>.after:{result.path}")
        # In the order they were made, each once.
        self.assertLess(before, entries.index(one))
        self.assertLess(entries.index(one), after)
        self.assertLess(after, entries.index(two))
        self.assertEqual(entries.count(one), 1)
        self.assertEqual(entries.count(two), 1)

    def test_without_trampolines_then_with_them(self):
        # A JIT's entries need no trampolines; activating them later adds
        # to the same file.
        result = self.run_capi(f"""
            fresh_map()
            with open(MAP, "w") as f:
                f.write("stale line of a dead process\\n")
            os.utime(MAP, (1, 1))   # older than this process
            print(write({JIT_BASE:#x}, 0x10, "py::jitted:<jit>"))
            print(map_text(), end="")
            sys.activate_stack_trampoline("perf")
            def traced():
                return 1
            traced()
            """)
        self.assertEqual(result.stdout,
                         f"(0, 0)\n{JIT_BASE:x} 10 py::jitted:<jit>\n")
        entries = self.assertMapWellFormed(result.pid)
        self.assertEqual(entries[0], MapEntry(JIT_BASE, 0x10,
                                              "py::jitted:<jit>"))
        self.assertEqual(result.script_names(), ["traced"])

    def test_threads_without_the_gil(self):
        # Eight threads that never hold the GIL write 2000 entries each,
        # while the main thread makes trampolines for 1000 new functions.
        result = self.run_capi(f"""
            import threading
            failures = []
            writers = threading.Thread(target=lambda: failures.append(
                _testcapi.write_perf_map_entries_from_threads(
                    8, 2000, {JIT_BASE:#x}, "py::capi_")))
            writers.start()
            source = "".join(f"def f_{{i}}():\\n    return {{i}}\\n"
                             for i in range(1000))
            ns = {{}}
            exec(compile(source, __file__, "exec"), ns)
            total = sum(ns[f"f_{{i}}"]() for i in range(1000))
            writers.join()
            print(failures, total)
            """, python_args=PERF)
        self.assertEqual(result.stdout, "[0] 499500\n")
        entries = self.assertMapWellFormed(result.pid)
        api = [e for e in entries if e.symbol.startswith("py::capi_")]
        expected = {MapEntry(JIT_BASE + (t * 2000 + i) * 16, 16,
                             f"py::capi_{t}_{i}")
                    for t in range(8) for i in range(2000)}
        self.assertEqual(len(api), len(expected))
        self.assertEqual(set(api), expected)
        functions = [name for name in result.script_names()
                     if name.startswith("f_")]
        self.assertEqual(sorted(functions),
                         sorted(f"f_{i}" for i in range(1000)))

    def test_names_stay_one_line(self):
        # Written whole, however long: perf reads a line to its end.
        long_name = "py::" + "x" * 9000
        exact = "py::" + "y" * 3196
        result = self.run_capi(f"""
            names = ["py::a\\nb", "py::tab\\there", "py::del\\x7f",
                     "py::caf\\u00e9", "not-py", {long_name!r}, {exact!r}]
            for i, name in enumerate(names):
                print(write({JIT_BASE:#x} + i * 16, 16, name))
            print(write({JIT_BASE:#x}, 16, None))
            """)
        self.assertEqual(result.stdout.splitlines(),
                         ["(0, 0)"] * 7 + [f"(-1, {errno.EINVAL})"])
        lines = self.assertWholeLines(result.pid)
        names = [line.split(b" ", 2)[2] for line in lines]
        self.assertEqual(names, [
            b"py::a\\x0ab", b"py::tab\\x09here", b"py::del\\x7f",
            "py::caf\u00e9".encode(), b"not-py", long_name.encode(),
            exact.encode()])

    # qemu-user reports a new start time after an exec (its own), which
    # makes the map look older than the process.
    @needs_host("the kernel's process start time across exec")
    def test_long_line_whole_after_exec(self):
        long_name = "py::" + "z" * 9000 + ":<jit>"
        code = "def after_exec(): pass\nafter_exec()\nprint('ran')"
        result = self.run_capi(f"""
            write({JIT_BASE:#x}, 16, {long_name!r})
            os.execv(sys.executable,
                     [sys.executable, "-X", "perf", "-c", {code!r}])
            """)
        self.assertEqual(result.stdout, "ran\n")
        symbols = [e.symbol for e in self.assertMapWellFormed(result.pid)]
        self.assertLess(symbols.index(long_name),
                        symbols.index("py::after_exec:<string>"))

    def test_init_and_fini(self):
        result = self.run_capi("""
            fresh_map()
            with open(MAP, "w") as f:
                f.write("stale line of a dead process\\n")
            os.utime(MAP, (1, 1))   # older than this process
            print("init", init(), os.path.getsize(MAP))
            [fd] = map_descriptors()
            print("descriptor above 2", fd > 2,
                  "close-on-exec", not os.get_inheritable(fd))
            print("init again", init(), len(map_descriptors()))
            print("write", write(0x1000, 0x10, "py::one:<jit>"))
            inode = os.stat(MAP).st_ino
            fini()
            print("after fini", map_descriptors())
            fini()
            print("write", write(0x2000, 0x10, "py::two:<jit>"))
            print("same file", os.stat(MAP).st_ino == inode,
                  len(map_descriptors()))
            print(map_text(), end="")
            # Removed after Fini: Init starts a new file.
            fini()
            os.unlink(MAP)
            print("init", init(), os.path.getsize(MAP))
            print("write", write(0x3000, 0x10, "py::three:<jit>"))
            """)
        self.assertEqual(result.stdout.splitlines(), [
            "init (0, 0) 0",
            "descriptor above 2 True close-on-exec True",
            "init again (0, 0) 1",
            "write (0, 0)",
            "after fini []",
            "write (0, 0)",
            "same file True 1",
            "1000 10 py::one:<jit>",
            "2000 10 py::two:<jit>",
            "init (0, 0) 0",
            "write (0, 0)",
        ])
        self.assertEqual(self.assertMapWellFormed(result.pid),
                         [MapEntry(0x3000, 0x10, "py::three:<jit>")])

    def test_fini_then_new_trampolines(self):
        # After Fini, a new trampoline opens the same file again.
        result = self.run_capi(before_and_later("""
            inode = os.stat(MAP).st_ino
            fini()
            print(map_descriptors())
            later()
            print(os.stat(MAP).st_ino == inode, len(map_descriptors()))
            """), python_args=PERF)
        self.assertEqual(result.stdout, "[]\nTrue 1\n")
        self.assertEqual(result.stderr, "")
        # The module's first run named what it defines (the prelude's
        # functions too).
        self.assertEqual(result.script_names(),
                         ["<module>", "fresh_map", "map_text",
                          "map_descriptors", "before", "later",
                          "later.<locals>.after"])

    def test_unusable_path(self):
        result = self.run_capi("""
            fresh_map()
            os.mkdir(MAP)
            print(init())
            print(write(0x1000, 0x10, "py::lost:<jit>"))
            os.rmdir(MAP)
            os.symlink("/nonexistent/target", MAP)
            print(init())
            os.unlink(MAP)
            print(write(0x2000, 0x10, "py::kept:<jit>"))
            """)
        self.assertEqual(result.stdout.splitlines(), [
            f"(-1, {errno.EISDIR})", f"(-1, {errno.EISDIR})",
            f"(-1, {errno.ELOOP})", "(0, 0)"])
        self.assertEqual(self.assertMapWellFormed(result.pid),
                         [MapEntry(0x2000, 0x10, "py::kept:<jit>")])

    @unittest.skipUnless(hasattr(signal, "SIGXFSZ"), "needs RLIMIT_FSIZE")
    def test_write_cut_short(self):
        # The map cannot grow (RLIMIT_FSIZE: the write past the limit is
        # cut short, the ones after it fail): errors, the lines already
        # there stay whole, and once the file can grow the line cut short
        # is finished, never cut back, before the next one.
        result = self.run_capi(f"""
            import resource, signal
            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            print(write(0x1000, 0x10, "py::first:<jit>"))
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            resource.setrlimit(resource.RLIMIT_FSIZE,
                               (os.path.getsize(MAP) + 10, hard))
            results = [write(0x2000 + i, 0x10, f"py::cut_{{i}}:<jit>")
                       for i in range(20)]
            print(sorted(set(results)), os.path.getsize(MAP))
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            print(write(0x3000, 0x10, "py::third:<jit>"))
            """)
        first = b"1000 10 py::first:<jit>\n"
        self.assertEqual(result.stdout.splitlines(), [
            "(0, 0)",
            f"[(-1, {errno.EFBIG})] {len(first) + 10}",
            "(0, 0)"])
        self.assertEqual(self.assertMapWellFormed(result.pid), [
            MapEntry(0x1000, 0x10, "py::first:<jit>"),
            MapEntry(0x2000, 0x10, "py::cut_0:<jit>"),
            MapEntry(0x3000, 0x10, "py::third:<jit>")])

    def test_written_at_once_during_startup(self):
        # sitecustomize runs during startup: an API entry joins the
        # trampolines' lines, after those made before it.
        with open(os.path.join(self.tmpdir, "sitecustomize.py"), "w") as f:
            f.write(PRELUDE + f"""
def in_site():
    return 1
in_site()
print("site", write({JIT_BASE:#x}, 0x10, "py::from_site:<jit>"))
text = map_text()
print("site", text.index("py::in_site:") < text.index("py::from_site:"),
      text.endswith("\\n"))
""")
        result = self.run_capi("""
            def after_startup():
                return 1
            after_startup()
            """, python_args=PERF, env=clean_env(PYTHONPATH=self.tmpdir))
        self.assertEqual(result.stdout, "site (0, 0)\nsite True True\n")
        entries = self.assertMapWellFormed(result.pid)
        symbols = [e.symbol for e in entries]
        self.assertEqual(symbols.count("py::from_site:<jit>"), 1)
        site = os.path.join(self.tmpdir, "sitecustomize.py")
        self.assertEqual(symbols.count(f"py::in_site:{site}"), 1)
        self.assertIn("after_startup", result.script_names())


class CompileCodeTests(CapiTestCase):

    def test_trampoline_before_the_first_call(self):
        result = self.run_capi("""
            def f():
                return 1
            def g():
                return 2
            print(compile_code(f.__code__), compile_code(f.__code__))
            with open(MAP) as f_:
                print(f"py::f:{__file__}" in f_.read())
            f(); f()
            print(compile_code(g.__code__))
            """, python_args=PERF)
        self.assertEqual(result.stdout, "0 0\nTrue\n0\n")
        names = result.script_names()
        self.assertEqual(names.count("f"), 1)
        self.assertEqual(names.count("g"), 1)
        self.assertLess(names.index("f"), names.index("g"))

    def test_nothing_when_inactive(self):
        result = self.run_capi("""
            def f():
                return 1
            fresh_map()
            print(compile_code(f.__code__), os.path.exists(MAP))
            sys.activate_stack_trampoline("perf")
            sys.deactivate_stack_trampoline()
            def g():
                return 2
            print(compile_code(g.__code__))
            g()
            """)
        self.assertEqual(result.stdout, "0 False\n0\n")
        self.assertEqual(result.script_names(), [])

    def test_not_a_code_object(self):
        for args in ((), PERF):
            with self.subTest(args=args):
                result = self.run_capi("""
                    for bad in (None, 42, "code", compile_code):
                        try:
                            compile_code(bad)
                        except SystemError:
                            print("SystemError")
                    """, python_args=args)
                self.assertEqual(result.stdout, "SystemError\n" * 4)


class ForkTests(CapiTestCase):

    # argv[1]: the SetPersistAfterFork argument, or "-" not to call it.
    # f and g are made from code that never ran (the module's first run
    # would have named them): compile_code() names them.  child_only is
    # named on its first call, in the child.
    SCRIPT = """
        import types
        fresh = compile("def f():\\n    return 1\\n"
                        "def g():\\n    return 2\\n", __file__, "exec")
        f, g = (types.FunctionType(code, globals())
                for code in fresh.co_consts if isinstance(code, types.CodeType))
        def child():
            def child_only():
                return 3
            child_only()
        if sys.argv[1] != "-":
            print(persist(int(sys.argv[1])))
        print(compile_code(f.__code__), compile_code(g.__code__))
        pid = os.fork()
        if pid == 0:
            f(); g()
            child()
            os._exit(0)
        _, status = os.waitpid(pid, 0)
        print(pid, os.waitstatus_to_exitcode(status))
        """
    CHILD_ONLY = "child.<locals>.child_only"

    def run_fork(self, persist="-", python_args=PERF):
        result = self.run_capi(self.SCRIPT, python_args=python_args,
                               script_args=(persist,))
        child, status = map(int, result.stdout.split()[-2:])
        self.files.add_pid(child)
        self.assertEqual(status, 0)
        return result, child

    def assertChildKeptTrampolines(self, result, child):
        parent = self.assertMapWellFormed(result.pid)
        in_child = self.assertMapWellFormed(child)
        # The child's map is the parent's as it was at the fork, then the
        # one function new in the child: nothing was written again for f
        # and g, which kept their addresses.  (The parent may have written
        # more lines after the fork.)
        self.assertEqual(in_child[-1].symbol,
                         f"py::{self.CHILD_ONLY}:{result.path}")
        inherited = in_child[:-1]
        self.assertEqual(parent[:len(inherited)], inherited)
        for name in ("f", "g"):
            symbol = f"py::{name}:{result.path}"
            self.assertEqual([e.symbol for e in in_child].count(symbol), 1)
            self.assertIn(symbol, [e.symbol for e in inherited])

    def test_compiled_before_fork(self):
        result, child = self.run_fork()
        self.assertChildKeptTrampolines(result, child)

    def test_persist_after_fork_on(self):
        # Upstream's switch overrides -X perf_fork_copy=0.
        result, child = self.run_fork(
            "1", python_args=(*PERF, "-X", "perf_fork_copy=0"))
        self.assertEqual(result.stdout.splitlines()[0], "1")
        self.assertChildKeptTrampolines(result, child)

    def test_persist_after_fork_off(self):
        # The child's map starts empty; its functions get new trampolines
        # on their first call there.
        result, child = self.run_fork("0")
        self.assertEqual(result.stdout.splitlines()[0], "0")
        self.assertEqual(result.script_names(child),
                         ["f", "g", "child", self.CHILD_ONLY])
        parent = {e.qualname: e for e in result.script_entries()}
        for entry in result.script_entries(child):
            if entry.qualname in ("f", "g"):
                self.assertNotEqual(entry.start, parent[entry.qualname].start)
        self.assertNotIn(self.CHILD_ONLY, parent)

    def test_persist_after_fork_values(self):
        result = self.run_capi("""
            print(persist(5), persist(0), persist(-1), persist(1))
            """)
        self.assertEqual(result.stdout, "1 0 1 1\n")

    def test_copy_parent_map_in_child(self):
        # A JIT without trampolines: the child's map starts empty (no
        # trampolines are active), and copying adds the parent's lines.
        result = self.run_capi(f"""
            print(write({JIT_BASE:#x}, 0x10, "py::parent_jit:<jit>"))
            pid = os.fork()
            if pid == 0:
                ok = (write({JIT_BASE + 0x100:#x}, 0x10,
                            "py::child_jit:<jit>") == (0, 0)
                      and copy(f"/tmp/perf-{{os.getppid()}}.map") == (0, 0))
                os._exit(0 if ok else 1)
            _, status = os.waitpid(pid, 0)
            print(pid, os.waitstatus_to_exitcode(status))
            """)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[0], "(0, 0)")
        child, status = map(int, lines[1].split())
        self.files.add_pid(child)
        self.assertEqual(status, 0)
        parent_jit = MapEntry(JIT_BASE, 0x10, "py::parent_jit:<jit>")
        child_jit = MapEntry(JIT_BASE + 0x100, 0x10, "py::child_jit:<jit>")
        self.assertEqual(self.assertMapWellFormed(result.pid), [parent_jit])
        self.assertEqual(self.assertMapWellFormed(child),
                         [child_jit, parent_jit])

    def test_fork_while_threads_write(self):
        # Threads without the GIL write all the time while the main thread
        # forks: the map's lock is never inherited held (the children would
        # hang), and each child's map is whole lines.
        result = self.run_capi(f"""
            import signal, threading
            children = []
            # A child that hangs holds our stdout open: end them all, so
            # that the test fails instead of waiting for them forever.
            def give_up(signum, frame):
                for pid in children:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass            # reaped already
                print("children hung", flush=True)
                os._exit(1)
            signal.signal(signal.SIGALRM, give_up)
            signal.alarm({int(TIMEOUT) // 2})
            failures = []
            writers = threading.Thread(target=lambda: failures.append(
                _testcapi.write_perf_map_entries_from_threads(
                    4, 20000, {JIT_BASE:#x}, "py::bg_")))
            writers.start()
            # Fork while they write.
            while True:
                with open(MAP, "rb") as f:
                    if b" py::bg_" in f.read():
                        break
            def child_work():
                def in_child():         # named on its first call
                    return 1
                in_child()
            for i in range(20):
                pid = os.fork()
                if pid == 0:
                    rc = write(0x1000 + i, 1, f"py::child_{{i}}:<jit>")
                    child_work()
                    os._exit(0 if rc == (0, 0) else 1)
                children.append(pid)
            statuses = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
                        for pid in children]
            writers.join()
            print(failures, statuses)
            print(*children)
            """, python_args=PERF)
        lines = result.stdout.splitlines()
        children = [int(pid) for pid in lines[1].split()]
        for child in children:
            self.files.add_pid(child)
        self.assertEqual(lines[0], f"[0] {[0] * 20}")
        parent = self.assertMapWellFormed(result.pid)
        self.assertEqual(
            sum(e.symbol.startswith("py::bg_") for e in parent), 80000)
        parent_set = set(parent)
        for i, child in enumerate(children):
            in_child = self.assertMapWellFormed(child)
            # (The child also runs threading's after-fork hooks.)
            own = [e for e in in_child if e not in parent_set
                   and e.filename in ("<jit>", result.path)]
            self.assertEqual(
                [e.symbol for e in own],
                [f"py::child_{i}:<jit>",
                 f"py::child_work.<locals>.in_child:{result.path}"])


class CopyPerfMapFileTests(CapiTestCase):

    def test_errors(self):
        result = self.run_capi("""
            fresh_map()
            os.mkdir("directory")
            os.mkfifo("fifo")
            for name in (None, "missing", "directory", "fifo", "/dev/null",
                         MAP):
                print(copy(name))
            print(os.path.getsize(MAP))
            """)
        self.assertEqual(result.stdout.splitlines(), [
            f"(-1, {errno.EINVAL})", f"(-1, {errno.ENOENT})",
            f"(-1, {errno.EISDIR})", f"(-1, {errno.EINVAL})",
            f"(-1, {errno.EINVAL})", f"(-1, {errno.EINVAL})", "0"])

    def test_whole_lines_only(self):
        # 6000 lines (more than one read's worth), a last line without
        # its newline, then a file with a line too long to copy.
        result = self.run_capi("""
            with open("many", "w") as f:
                for i in range(6000):
                    f.write(f"{0x1000 + i * 16:x} 10 py::line_{i}:<jit>\\n")
                f.write("9999 10 py::unfinished")
            print(copy("many"))
            with open("long", "w") as f:
                f.write("8888 10 py::fits:<jit>\\n")
                f.write("7777 10 py::" + "z" * 70000 + "\\n")
            print(copy("long"))
            """)
        self.assertEqual(result.stdout.splitlines(),
                         ["(0, 0)", f"(-1, {errno.EINVAL})"])
        expected = [MapEntry(0x1000 + i * 16, 0x10, f"py::line_{i}:<jit>")
                    for i in range(6000)]
        expected.append(MapEntry(0x8888, 0x10, "py::fits:<jit>"))
        self.assertEqual(self.assertMapWellFormed(result.pid), expected)


if __name__ == "__main__":
    unittest.main()
