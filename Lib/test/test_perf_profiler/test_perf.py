"""Perf map backend: switches, the sys API, the map file, and what perf,
gdb and the program itself see with trampolines on.

Each test runs the interpreter in a subprocess and checks its output and
the /tmp/perf-<pid>.map it leaves behind.
"""

import json
import os
import re
import shutil
import signal
import stat
import struct
import subprocess
import sys
import sysconfig
import textwrap
import time
import unittest

from test import support
from test.test_perf_profiler.util import (
    GDB_FRAME_RE, GDB_OPTIONS, PYTHON_FRAME_RECORDS, TIMEOUT,
    PerfTestCase,
    clean_env, gdb_available, gdb_backtrace, map_path, needs_host,
    parse_map, perf_record_works, read_map, record_samples,
    skip_environment, target_command, write_script)

EVAL = "_PyEval_EvalFrameDefault"


class MapFormatTests(PerfTestCase):
    """Lines of the map and the names in them."""

    NAMES_SCRIPT = """\
        import asyncio

        def plain():
            return 1

        def outer():
            def inner():
                return 2
            return inner()

        class Klass:
            def method(self):
                return 3

            @classmethod
            def cmethod(cls):
                return 4

            @staticmethod
            def smethod():
                return 5

            class Nested:
                def deep(self):
                    return 6

        def gen():
            yield 7

        async def coro():
            return 8

        async def agen():
            yield 9

        async def drive():
            await coro()
            return [x async for x in agen()]

        def comprehensions():
            return ([x for x in range(2)], {x for x in range(2)},
                    {x: x for x in range(2)}, list(x for x in range(2)))

        plain()
        outer()
        k = Klass()
        k.method(); Klass.cmethod(); Klass.smethod(); Klass.Nested().deep()
        (lambda: 10)()
        list(gen())
        asyncio.run(drive())
        comprehensions()
        [y for y in range(3)]
        print("done")
        """

    def names(self):
        result = self.run_script(self.NAMES_SCRIPT, python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "done\n")
        return result, result.script_names()

    def test_every_line_well_formed(self):
        result = self.run_script(self.NAMES_SCRIPT, python_args=["-X", "perf"])
        with open(map_path(result.pid), encoding="utf-8") as f:
            text = f.read()
        lines = text.splitlines()
        self.assertGreater(len(lines), 10)
        self.assertTrue(text.endswith("\n"))
        for line in lines:
            self.assertRegex(line, r"^[0-9a-f]+ [0-9a-f]+ py::.+$")
            self.assertNotIn("0x", line.split(" py::")[0])
        entries = parse_map(text)
        # Each trampoline has a range of its own.
        spans = sorted((e.start, e.start + e.size) for e in entries)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            self.assertLessEqual(end, start)
        for entry in entries:
            self.assertGreater(entry.size, 0)
            self.assertNotEqual(entry.start, 0)

    def test_names_of_functions_and_methods(self):
        _, names = self.names()
        for name in ("plain", "outer", "outer.<locals>.inner", "Klass",
                     "Klass.method", "Klass.cmethod", "Klass.smethod",
                     "Klass.Nested", "Klass.Nested.deep"):
            self.assertIn(name, names)

    def test_names_of_lambdas_and_comprehensions(self):
        _, names = self.names()
        for name in ("<lambda>", "<listcomp>",
                     "comprehensions.<locals>.<listcomp>",
                     "comprehensions.<locals>.<setcomp>",
                     "comprehensions.<locals>.<dictcomp>",
                     "comprehensions.<locals>.<genexpr>",
                     "drive.<locals>.<listcomp>"):
            self.assertIn(name, names)

    def test_names_of_module_generators_and_coroutines(self):
        _, names = self.names()
        for name in ("<module>", "gen", "coro", "agen", "drive"):
            self.assertIn(name, names)

    def test_each_code_object_mapped_once(self):
        result = self.run_script("""\
            def f(x):
                return x + 1
            for i in range(1000):
                f(i)
            fs = [eval(compile("lambda: 0", "<lambdas>", "eval"))
                  for _ in range(3)]
            for g in fs:
                g(); g()
            """, python_args=["-X", "perf"])
        names = result.script_names()
        self.assertEqual(names.count("f"), 1)
        self.assertEqual(names.count("<module>"), 1)
        # Three distinct code objects with the same name: three entries.
        lambdas = [e for e in result.map_entries()
                   if e.symbol == "py::<lambda>:<lambdas>"]
        self.assertEqual(len(lambdas), 3)

    def test_filename_is_the_script_path(self):
        module_path = write_script(self.tmpdir, """\
            def helper():
                return 1
            """, "helpermod.py")
        result = self.run_script("""\
            import helpermod
            def main():
                return helpermod.helper()
            main()
            """, python_args=["-X", "perf"])
        entries = result.map_entries()
        by_symbol = {e.symbol for e in entries}
        self.assertIn(f"py::main:{result.path}", by_symbol)
        self.assertIn(f"py::<module>:{result.path}", by_symbol)
        self.assertIn(f"py::helper:{module_path}", by_symbol)
        self.assertTrue(os.path.isabs(result.path))

    def test_names_escaped(self):
        result = self.run_script("""\
            def f():
                return 1
            g = type(f)(f.__code__.replace(co_qualname="a\\nb\\tc"), {})
            h = type(f)(f.__code__.replace(co_qualname="s\\udc80t\\u00e9"),
                        {})
            g(); h()
            """, python_args=["-X", "perf"])
        names = result.script_names()
        self.assertIn("a\\x0ab\\x09c", names)
        self.assertIn("s\\udc80t\u00e9", names)

    def test_long_names_capped(self):
        result = self.run_script("""\
            def f():
                return 1
            g = type(f)(f.__code__.replace(co_qualname="q" * 5000,
                                           co_filename="/" + "d" * 5000),
                        {})
            g()
            """, python_args=["-X", "perf"])
        entries = [e for e in result.map_entries()
                   if e.qualname.startswith("q" * 100)]
        self.assertEqual(len(entries), 1)
        qualname, filename = entries[0].qualname, entries[0].filename
        self.assertTrue(qualname.endswith("..."), qualname[-20:])
        self.assertLessEqual(len(qualname.encode()), 1024)
        self.assertEqual(qualname.rstrip("."), "q" * (len(qualname) - 3))
        self.assertTrue(filename.startswith("/ddd"))
        self.assertTrue(filename.endswith("..."), filename[-20:])
        self.assertLessEqual(len(filename.encode()), 2048)


class SwitchTests(PerfTestCase):
    """-X perf, PYTHONPERFSUPPORT, and which one wins."""

    PROBE = """\
        import sys
        def probe():
            return 1
        probe()
        print(sys.is_stack_trampoline_active())
        """

    def probe(self, python_args=(), **env):
        """Run PROBE; return (active, was probe() mapped)."""
        result = self.run_script(self.PROBE, python_args=python_args,
                                 env=clean_env(**env))
        self.assertIn(result.stdout, ("True\n", "False\n"))
        active = result.stdout == "True\n"
        try:
            mapped = "probe" in result.script_names()
        except FileNotFoundError:
            mapped = False
        self.assertEqual(result.stderr, "")
        return active, mapped

    def test_off_by_default(self):
        result = self.run_script(self.PROBE)
        self.assertEqual(result.stdout, "False\n")
        self.assertFalse(result.wrote_map())

    def test_xoption(self):
        self.assertEqual(self.probe(["-X", "perf"]), (True, True))
        self.assertEqual(self.probe(["-X", "perf=1"]), (True, True))

    def test_env_var(self):
        self.assertEqual(self.probe(PYTHONPERFSUPPORT="1"), (True, True))
        # Any nonzero integer, as for the other PYTHON* switches.
        self.assertEqual(self.probe(PYTHONPERFSUPPORT="2"), (True, True))

    def test_env_var_zero(self):
        self.assertEqual(self.probe(PYTHONPERFSUPPORT="0"), (False, False))

    def test_xoption_zero_overrides_env_var(self):
        self.assertEqual(self.probe(["-X", "perf=0"], PYTHONPERFSUPPORT="1"),
                         (False, False))

    def test_xoption_overrides_env_var_zero(self):
        self.assertEqual(self.probe(["-X", "perf"], PYTHONPERFSUPPORT="0"),
                         (True, True))

    def test_last_xoption_wins(self):
        self.assertEqual(self.probe(["-X", "perf", "-X", "perf=0"]),
                         (False, False))
        self.assertEqual(self.probe(["-X", "perf=0", "-X", "perf"]),
                         (True, True))

    def test_env_var_ignored_under_E_and_I(self):
        self.assertEqual(self.probe(["-E"], PYTHONPERFSUPPORT="1"),
                         (False, False))
        self.assertEqual(self.probe(["-I"], PYTHONPERFSUPPORT="1"),
                         (False, False))
        # -X options still count in isolated mode.
        self.assertEqual(self.probe(["-I", "-X", "perf"]), (True, True))

    def probe_with_warning(self, python_args=(), **env):
        """Run PROBE with a switch value the interpreter does not
        understand: it starts all the same, warns once on stderr, and
        runs the program; return (active, was probe() mapped, the
        warning line)."""
        result = self.run_script(self.PROBE, python_args=python_args,
                                 env=clean_env(**env))
        self.assertIn(result.stdout, ("True\n", "False\n"))
        lines = result.stderr.splitlines()
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertTrue(lines[0].startswith("Python perf trampolines: "),
                        lines[0])
        try:
            mapped = "probe" in result.script_names()
        except FileNotFoundError:
            mapped = False
        return result.stdout == "True\n", mapped, lines[0]

    def test_unknown_xoption_value_switches_on_with_a_warning(self):
        # As upstream 3.12, which ignores the value: -X perf=<anything>
        # is on, with a warning that only 0 and 1 mean something.
        for value in ("2", "yes", ""):
            with self.subTest(value=value):
                active, mapped, warning = self.probe_with_warning(
                    ["-X", f"perf={value}"])
                self.assertEqual((active, mapped), (True, True))
                self.assertIn("-X perf", warning)

    def test_unknown_env_var_value_is_off_with_a_warning(self):
        # As upstream 3.12: not an integer means 0.  Stock 3.11 ignores the
        # variable, so a program run with it set must not stop.
        for name in ("PYTHONPERFSUPPORT", "PYTHON_PERF_JIT_SUPPORT"):
            for value in ("abc", "true", "yes", "on", "1.5", "0x1"):
                with self.subTest(name=name, value=value):
                    active, mapped, warning = self.probe_with_warning(
                        **{name: value})
                    self.assertEqual((active, mapped), (False, False))
                    self.assertIn(name, warning)
        # Empty means unset, as for every PYTHON* variable.
        self.assertEqual(self.probe(PYTHONPERFSUPPORT=""), (False, False))
        # Under -E the variable is not read at all: no warning either.
        self.assertEqual(self.probe(["-E"], PYTHONPERFSUPPORT="abc"),
                         (False, False))

    def test_sys_deactivate_overrides_xoption(self):
        result = self.run_script("""\
            import sys
            def before():
                return 1
            before()
            print(sys.is_stack_trampoline_active())
            sys.deactivate_stack_trampoline()
            print(sys.is_stack_trampoline_active())
            def after():
                return 2
            after()
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "True\nFalse\n")
        names = result.script_names()
        self.assertIn("before", names)
        self.assertNotIn("after", names)

    def test_sys_activate_under_xoption_zero(self):
        result = self.run_script("""\
            import sys
            print(sys.is_stack_trampoline_active())
            sys.activate_stack_trampoline("perf")
            def f():
                return 1
            f()
            print(sys.is_stack_trampoline_active())
            """, python_args=["-X", "perf=0"],
            env=clean_env(PYTHONPERFSUPPORT="1"))
        self.assertEqual(result.stdout, "False\nTrue\n")
        self.assertEqual(result.script_names(), ["f"])


class SysApiTests(PerfTestCase):
    """sys.activate_stack_trampoline() and friends."""

    def test_activate_deactivate_is_active(self):
        result = self.run_script("""\
            import sys
            print(sys.is_stack_trampoline_active())
            print(sys.activate_stack_trampoline("perf"))
            print(sys.is_stack_trampoline_active())
            print(sys.deactivate_stack_trampoline())
            print(sys.is_stack_trampoline_active())
            """)
        self.assertEqual(result.stdout, "False\nNone\nTrue\nNone\nFalse\n")

    def test_only_code_run_while_active_is_mapped(self):
        result = self.run_script("""\
            import sys
            def before_only():
                return 1
            def before_and_during():
                return 2
            def during():
                return before_and_during() + 1
            def after_only():
                return 4
            def generator():
                yield 1
                yield 2
            before_only()
            before_and_during()
            g = generator()
            next(g)
            sys.activate_stack_trampoline("perf")
            during()
            sys.deactivate_stack_trampoline()
            after_only()
            next(g)
            """)
        names = result.script_names()
        self.assertEqual(sorted(names), ["before_and_during", "during"])

    def test_reactivation(self):
        result = self.run_script("""\
            import sys
            def first():
                return 1
            def second():
                return 2
            sys.activate_stack_trampoline("perf")
            first()
            sys.deactivate_stack_trampoline()
            sys.activate_stack_trampoline("perf")
            first()
            second()
            print(sys.is_stack_trampoline_active())
            """)
        self.assertEqual(result.stdout, "True\n")
        self.assertEqual(result.script_names(), ["first", "second"])

    def test_unknown_backend(self):
        result = self.run_script("""\
            import sys
            for backend in ("nope", "", "PERF", "perf "):
                try:
                    sys.activate_stack_trampoline(backend)
                except ValueError as exc:
                    print("ValueError", exc)
            print(sys.is_stack_trampoline_active())
            """)
        lines = result.stdout.splitlines()
        self.assertEqual(len(lines), 5, result.stdout)
        for line, backend in zip(lines, ("nope", "", "PERF", "perf ")):
            self.assertTrue(line.startswith(
                f"ValueError invalid backend: {backend} "),
                line)
            self.assertIn("'perf'", line)
        self.assertEqual(lines[-1], "False")
        self.assertFalse(result.wrote_map())

    def test_non_str_backend(self):
        result = self.run_script("""\
            import sys
            for backend in (None, 1, b"perf", ["perf"]):
                try:
                    sys.activate_stack_trampoline(backend)
                except TypeError as exc:
                    print("TypeError")
            for call in (lambda: sys.activate_stack_trampoline(),
                         lambda: sys.activate_stack_trampoline("perf", "x"),
                         lambda: sys.activate_stack_trampoline(backend="perf"),
                         lambda: sys.deactivate_stack_trampoline(1),
                         lambda: sys.is_stack_trampoline_active(1)):
                try:
                    call()
                except TypeError as exc:
                    print("TypeError")
            print(sys.is_stack_trampoline_active())
            """)
        self.assertEqual(result.stdout, "TypeError\n" * 9 + "False\n")

    def test_activate_twice(self):
        result = self.run_script("""\
            import sys
            def f():
                return 1
            sys.activate_stack_trampoline("perf")
            f()
            sys.activate_stack_trampoline("perf")
            f()
            def g():
                return 2
            g()
            print(sys.is_stack_trampoline_active())
            """)
        self.assertEqual(result.stdout, "True\n")
        self.assertEqual(result.script_names(), ["f", "g"])

    def test_deactivate_when_inactive(self):
        result = self.run_script("""\
            import sys
            sys.deactivate_stack_trampoline()
            sys.deactivate_stack_trampoline()
            print(sys.is_stack_trampoline_active())
            sys.activate_stack_trampoline("perf")
            sys.deactivate_stack_trampoline()
            sys.deactivate_stack_trampoline()
            print(sys.is_stack_trampoline_active())
            """)
        self.assertEqual(result.stdout, "False\nFalse\n")

    def test_deactivate_and_activate_inside_running_frames(self):
        # Frames that entered through a trampoline return through it
        # after deactivation; frames that entered without one return
        # normally after activation.
        result = self.run_script("""\
            import sys
            def down(n, switch):
                if n == 0:
                    switch()
                    return 0
                return down(n - 1, switch) + 1
            def gen():
                yield sys.is_stack_trampoline_active()
                yield sys.is_stack_trampoline_active()
            g = gen()
            print(next(g), down(50, sys.deactivate_stack_trampoline))
            print(next(g), down(50, lambda: sys.activate_stack_trampoline(
                "perf")))
            print(down(50, sys.deactivate_stack_trampoline),
                  sys.is_stack_trampoline_active())
            try:
                down(20, lambda: [sys.activate_stack_trampoline("perf"),
                                  1 / 0])
            except ZeroDivisionError:
                print("unwound", sys.is_stack_trampoline_active())
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout,
                         "True 50\nFalse 50\n50 False\nunwound True\n")

class OtherEvalFrameTests(PerfTestCase):
    """Another PEP 523 function installed beside ours is chained behind
    the trampolines: it sees the frames it sees without perf, and perf
    still names them."""

    WORK = """\
        import sys, _testinternalcapi

        def leaf(n):
            return n + 1

        def middle(n):
            return leaf(n) * 2

        class C:
            def m(self, x):
                return middle(x)

        def gen(n):
            for i in range(n):
                yield middle(i)

        def work():
            out = [C().m(1), sum(gen(3)), [middle(i) for i in range(2)]]
            try:
                leaf(None)
            except TypeError:
                out.append("raised")
            return out

        def recorded(call):
            names = []
            _testinternalcapi.set_eval_frame_record(names)
            try:
                result = call()
            finally:
                _testinternalcapi.set_eval_frame_default()
            return result, names
        """

    def script(self, body):
        return textwrap.dedent(self.WORK) + textwrap.dedent(body)

    def test_same_frames_as_without_perf(self):
        source = self.script("""\
            print(recorded(work))
            print(sys.is_stack_trampoline_active())
            """)
        off = self.run_script(source, python_args=["-X", "perf=0"])
        self.assertIn("'gen', 'middle', 'leaf'", off.stdout)
        on = self.run_script(source, python_args=["-X", "perf"])
        self.assertEqual(on.stdout, off.stdout.replace("False", "True"))
        # First called while the other function was installed: named.
        names = on.script_names()
        for name in ("work", "C.m", "middle", "leaf", "gen"):
            self.assertIn(name, names)

    @unittest.skipUnless(
        sysconfig.get_config_var("PY_HAVE_PERF_JIT_TRAMPOLINE"),
        "built without perf_jit")
    def test_same_frames_as_without_perf_jit(self):
        source = self.script("""\
            print(recorded(work))
            print(sys.is_stack_trampoline_active())
            """)
        off = self.run_script(source, python_args=["-X", "perf=0"])
        on = self.run_script(source, python_args=["-X", "perf_jit"])
        self.assertEqual(on.stdout, off.stdout.replace("False", "True"))

    def test_switches_in_every_order(self):
        result = self.run_script(self.script("""\
            def step(label):
                print(label, sys.is_stack_trampoline_active(),
                      recorded(lambda: middle(1))[1])

            step("off")
            names = []
            _testinternalcapi.set_eval_frame_record(names)
            sys.activate_stack_trampoline("perf")      # wraps it
            middle(1)
            print("wrapped", sys.is_stack_trampoline_active(), names)
            _testinternalcapi.set_eval_frame_default()  # ours again
            step("default")
            names = []
            _testinternalcapi.set_eval_frame_record(names)
            sys.deactivate_stack_trampoline()          # it stays
            middle(1)
            print("deactivated", sys.is_stack_trampoline_active(), names)
            _testinternalcapi.set_eval_frame_default()
            middle(1)
            print("removed", sys.is_stack_trampoline_active(), names)
            sys.activate_stack_trampoline("perf")
            step("on")
            """), python_args=["-X", "perf=0"])
        calls = "['<lambda>', 'middle', 'leaf']"
        self.assertEqual(result.stdout.splitlines(), [
            f"off False {calls}",
            "wrapped True ['middle', 'leaf']",
            f"default True {calls}",
            "deactivated False ['middle', 'leaf']",
            "removed False ['middle', 'leaf']",
            f"on True {calls}",
        ])
        names = result.script_names()
        self.assertIn("middle", names)
        self.assertIn("leaf", names)


class MapFileTests(PerfTestCase):
    """Where the map is written, and what it refuses to write to."""

    def test_no_writable_and_executable_mapping(self):
        # 5000 trampolines need more than one arena.
        result = self.run_script("""\
            import sys
            source = "".join(f"def f{i}(): return {i}\\n"
                             for i in range(5000))
            namespace = {}
            exec(compile(source, __file__, "exec"), namespace)
            total = sum(namespace[f"f{i}"]() for i in range(5000))
            assert sys.is_stack_trampoline_active()
            with open("/proc/self/maps") as f:
                sys.stdout.write(f.read())
            """, python_args=["-X", "perf"])
        mappings = []
        for line in result.stdout.splitlines():
            addresses, perms = line.split()[:2]
            low, high = (int(a, 16) for a in addresses.split("-"))
            mappings.append((low, high, perms))
            self.assertFalse("w" in perms and "x" in perms, line)
        entries = [e for e in result.script_entries()
                   if re.fullmatch(r"f\d+", e.qualname)]
        self.assertEqual(len(entries), 5000)
        for entry in entries:
            end = entry.start + entry.size
            perms = [p for low, high, p in mappings
                     if low <= entry.start and end <= high]
            self.assertEqual(perms, ["r-xp"], entry)

    def test_map_mode_0600(self):
        result = self.run_script("""\
            import os, stat, sys
            os.umask(0)
            sys.activate_stack_trampoline("perf")
            st = os.stat(f"/tmp/perf-{os.getpid()}.map")
            print(oct(stat.S_IMODE(st.st_mode)), st.st_uid == os.geteuid())
            """)
        self.assertEqual(result.stdout, "0o600 True\n")
        st = os.stat(map_path(result.pid))
        self.assertEqual(stat.S_IMODE(st.st_mode), 0o600)
        self.assertTrue(stat.S_ISREG(st.st_mode))

    def test_stale_map_replaced(self):
        # A map left by a dead process that had our pid.
        result = self.run_script("""\
            import os, sys
            path = f"/tmp/perf-{os.getpid()}.map"
            with open(path, "w") as f:
                f.write("deadbeef 10 py::stale:/old.py\\n" * 100)
                f.write("half a line")
            os.chmod(path, 0o644)
            os.utime(path, (1, 1))      # older than this process
            sys.activate_stack_trampoline("perf")
            def fresh():
                return 1
            fresh()
            """)
        entries = result.map_entries()
        symbols = [e.symbol for e in entries]
        self.assertNotIn("py::stale:/old.py", symbols)
        self.assertIn(f"py::fresh:{result.path}", symbols)
        # The file is private again, whatever its old mode.
        mode = stat.S_IMODE(os.stat(map_path(result.pid)).st_mode)
        self.assertEqual(mode, 0o600)

    def test_stale_map_replaced_with_xoption(self):
        # exec() keeps the pid: the script plants a stale map for the
        # interpreter it then becomes.
        result = self.run_script("""\
            import os, sys
            path = f"/tmp/perf-{os.getpid()}.map"
            with open(path, "w") as f:
                f.write("not a map line at all\\n" * 100)
            os.utime(path, (1, 1))      # older than this process
            code = "def fresh(): return 1\\nfresh()\\nprint('ran')"
            os.execv(sys.executable,
                     [sys.executable, "-X", "perf", "-c", code])
            """)
        self.assertEqual(result.stdout, "ran\n")
        entries = self.assertMapWellFormed(result.pid)
        self.assertIn("py::fresh:<string>", [e.symbol for e in entries])

    REFUSED = """\
        import os, sys
        path = f"/tmp/perf-{{os.getpid()}}.map"
        target = os.path.join(os.getcwd(), "target.txt")
        with open(target, "w") as f:
            f.write("precious\\n")
        # Maps outlive their processes: one of a dead process that had
        # our pid (pids wrap at pid_max) would make {make} fail.
        if os.path.lexists(path):
            os.unlink(path)
        {make}
        try:
            sys.activate_stack_trampoline("perf")
        except OSError as exc:
            print(type(exc).__name__, exc.errno, exc.filename == path)
        def f():
            return 1
        f()
        print(sys.is_stack_trampoline_active())
        with open(target) as f:
            print(f.read(), end="")
        {remove}
        """

    def refused(self, make, remove):
        return self.run_script(self.REFUSED.format(make=make, remove=remove))

    def test_symlink_refused(self):
        result = self.refused("os.symlink(target, path)", "os.unlink(path)")
        self.assertEqual(result.stdout, "OSError 40 True\nFalse\nprecious\n")

    def test_dangling_symlink_refused(self):
        result = self.refused(
            "os.symlink(target + '.new', path)",
            "os.unlink(path); print(os.path.exists(target + '.new'))")
        self.assertEqual(result.stdout,
                         "OSError 40 True\nFalse\nprecious\nFalse\n")

    def test_directory_refused(self):
        result = self.refused("os.mkdir(path)", "os.rmdir(path)")
        self.assertEqual(result.stdout,
                         "IsADirectoryError 21 True\nFalse\nprecious\n")

    def test_hard_link_refused(self):
        if os.stat(self.tmpdir).st_dev != os.stat("/tmp").st_dev:
            self.skipTest(f"{self.tmpdir} is not on the file system of /tmp")
        result = self.refused("os.link(target, path)", "os.unlink(path)")
        self.assertEqual(result.stdout,
                         "PermissionError 1 True\nFalse\nprecious\n")

    def test_symlink_with_xoption_warns_and_runs(self):
        result = self.run_script("""\
            import os, sys
            target = os.path.join(os.getcwd(), "target.txt")
            with open(target, "w") as f:
                f.write("precious\\n")
            os.symlink(target, f"/tmp/perf-{os.getpid()}.map")
            code = ("import pathlib, sys\\n"
                    "def f(): return 1\\n"
                    "f()\\n"
                    "print('ran', sys.is_stack_trampoline_active())\\n"
                    "print(pathlib.Path(" + repr(target) + ").read_text(),"
                    " end='')\\n")
            os.execv(sys.executable,
                     [sys.executable, "-X", "perf", "-c", code])
            """)
        path = map_path(result.pid)
        try:
            self.assertEqual(result.stdout, "ran False\nprecious\n")
            lines = result.stderr.splitlines()
            self.assertEqual(len(lines), 1, result.stderr)
            self.assertTrue(lines[0].startswith("Python perf trampolines: "),
                            lines[0])
            self.assertIn(path, lines[0])
            self.assertIn("Too many levels of symbolic links", lines[0])
        finally:
            if os.path.islink(path):
                os.unlink(path)


class ForkTests(PerfTestCase):
    """A forked child writes a map of its own."""

    SCRIPT = """\
        import os, sys
        def before_fork():
            return 1
        before_fork()
        pid = os.fork()
        if pid == 0:
            def child_only():
                return 2
            child_only()
            before_fork()
            os._exit(0 if sys.is_stack_trampoline_active() else 3)
        _, status = os.waitpid(pid, 0)
        def parent_after():
            return 3
        parent_after()
        print(pid, os.waitstatus_to_exitcode(status))
        """

    def run_fork(self, python_args=("-X", "perf"), env=None):
        result = self.run_script(self.SCRIPT, python_args=python_args,
                                 env=env)
        child, status = map(int, result.stdout.split())
        self.files.add_pid(child)
        self.assertEqual(status, 0)
        return result, child

    def test_child_map_covers_inherited_trampolines(self):
        result, child = self.run_fork()
        parent_entries = result.map_entries()
        child_entries = result.map_entries(child)
        # Everything the parent had at the fork, at the same addresses.
        fork_index = [e.qualname for e in parent_entries].index(
            "parent_after")
        inherited = parent_entries[:fork_index]
        self.assertGreater(len(inherited), 10)
        self.assertEqual(child_entries[:len(inherited)], inherited)
        child_script = result.script_names(child)
        self.assertEqual(child_script, ["<module>", "before_fork",
                                        "child_only"])

    def test_parent_map_lacks_child_entries(self):
        result, child = self.run_fork()
        self.assertEqual(result.script_names(),
                         ["<module>", "before_fork", "parent_after"])

    def test_child_of_sys_api_activation(self):
        result = self.run_script("""\
            import os, sys
            sys.activate_stack_trampoline("perf")
            def before_fork():
                return 1
            before_fork()
            pid = os.fork()
            if pid == 0:
                def child_only():
                    return 2
                child_only()
                os._exit(0)
            os.waitpid(pid, 0)
            print(pid)
            """)
        child = int(result.stdout)
        self.files.add_pid(child)
        self.assertEqual(result.script_names(child),
                         ["before_fork", "child_only"])
        self.assertEqual(result.script_names(), ["before_fork"])


    def test_copy_off_child_names_what_it_calls(self):
        # -X perf_fork_copy=0: the child's map starts empty, and every
        # function gets a new trampoline on its first call in the child.
        cases = {
            "xoption": (["-X", "perf", "-X", "perf_fork_copy=0"], None),
            "env": (["-X", "perf"], clean_env(PYTHON_PERF_FORK_COPY="0")),
        }
        for case, (python_args, env) in cases.items():
            with self.subTest(case=case):
                result, child = self.run_fork(python_args, env)
                self.assertEqual(result.stderr, "")
                self.assertEqual(result.script_names(child),
                                 ["child_only", "before_fork"])
                child_entries = result.map_entries(child)
                self.assertLess(len(child_entries), 30)
                # (The parent's later trampolines may take the same
                # addresses as the child's new ones.)
                parent = result.map_entries()
                names = [e.qualname for e in parent]
                inherited = parent[:names.index("parent_after")]
                self.assertFalse({e.start for e in inherited}
                                 & {e.start for e in child_entries})
                self.assertEqual(result.script_names(),
                                 ["<module>", "before_fork",
                                  "parent_after"])

    def test_fork_copy_switch_values(self):
        # Only the value 0 turns copying off; a value that is not
        # understood warns and never stops the program.
        cases = [
            (["-X", "perf_fork_copy=1"], {}, True, None),
            (["-X", "perf_fork_copy"], {}, True, None),
            (["-X", "perf_fork_copy=2"], {}, True, "-X perf_fork_copy"),
            ([], {"PYTHON_PERF_FORK_COPY": "1"}, True, None),
            ([], {"PYTHON_PERF_FORK_COPY": "no"}, False,
             "PYTHON_PERF_FORK_COPY"),
            (["-E"], {"PYTHON_PERF_FORK_COPY": "0"}, True, None),
        ]
        for args, env, copied, warning in cases:
            with self.subTest(args=args, env=env):
                result, child = self.run_fork(["-X", "perf", *args],
                                              clean_env(**env))
                self.assertEqual("<module>" in result.script_names(child),
                                 copied)
                if warning is None:
                    self.assertEqual(result.stderr, "")
                else:
                    self.assertEqual(len(result.stderr.splitlines()), 1)
                    self.assertIn(warning, result.stderr)

    def test_child_of_deactivated_parent_writes_nothing(self):
        # Trampolines are off in the child: no copy, no file.  If it turns
        # them on, its functions get new trampolines in a map of its own.
        result = self.run_script("""\
            import os, sys, time
            def before_fork():
                return 1
            before_fork()
            sys.deactivate_stack_trampoline()
            r, w = os.pipe()
            forked = time.time()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                os.read(r, 1)
                sys.activate_stack_trampoline("perf")
                before_fork()
                os._exit(0)
            os.close(r)
            print(pid, flush=True)
            time.sleep(0.2)
            # (A map an earlier process with the child's pid left is older.)
            try:
                mtime = os.stat(f"/tmp/perf-{pid}.map").st_mtime
                print(mtime >= forked - 0.05)
            except FileNotFoundError:
                print(False)
            os.close(w)
            os.waitpid(pid, 0)
            """, python_args=["-X", "perf"])
        pid, exists = result.stdout.split()
        child = int(pid)
        self.files.add_pid(child)
        self.assertEqual(exists, "False")
        self.assertEqual(result.script_names(child), ["before_fork"])
        parent = [e for e in result.script_entries()
                  if e.qualname == "before_fork"]
        self.assertNotEqual(result.script_entries(child)[0].start,
                            parent[0].start)

    def test_subprocess_with_preexec_fn_writes_nothing(self):
        # The child execs right after preexec_fn: no copy of the parent's
        # map, and no map at all for the child's pid.
        result = self.run_script("""\
            import os, subprocess, sys
            def hook():
                os.environ["HOOK_RAN"] = "1"
            out = subprocess.run(
                [sys.executable, "-c",
                 "import os; print(os.getpid(), os.environ['HOOK_RAN'])"],
                preexec_fn=hook, capture_output=True, text=True, check=True)
            print(out.stdout, end="")
            """, python_args=["-X", "perf"])
        pid, ran = result.stdout.split()
        self.files.add_pid(int(pid))
        self.assertEqual(ran, "1")
        self.assertFalse(result.wrote_map(int(pid)))
        self.assertEqual(result.script_names(), ["<module>"])


class ThreadTests(PerfTestCase):

    def test_threads_create_code_concurrently(self):
        result = self.run_script("""\
            import sys, threading
            sys.setswitchinterval(1e-6)
            THREADS, FUNCS = 8, 150
            barrier = threading.Barrier(THREADS)
            def work(t):
                source = "".join(f"def f_{t}_{i}(): return {i}\\n"
                                 for i in range(FUNCS))
                namespace = {}
                exec(compile(source, __file__, "exec"), namespace)
                barrier.wait()
                for _ in range(3):
                    for i in range(FUNCS):
                        namespace[f"f_{t}_{i}"]()
            threads = [threading.Thread(target=work, args=(t,))
                       for t in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print("ok")
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "ok\n")
        entries = self.assertMapWellFormed(result.pid)
        starts = [e.start for e in entries]
        self.assertEqual(len(starts), len(set(starts)))
        names = [e.qualname for e in entries if e.filename == result.path]
        expected = {f"f_{t}_{i}" for t in range(8) for i in range(150)}
        funcs = [n for n in names if n.startswith("f_")]
        self.assertEqual(len(funcs), len(set(funcs)))
        self.assertEqual(set(funcs), expected)
        self.assertEqual(names.count("work"), 1)


class SubinterpreterTests(PerfTestCase):

    def test_activate_in_subinterpreter(self):
        result = self.run_script("""\
            import os, sys, _testcapi
            code = '''if 1:
                import sys
                sys.activate_stack_trampoline("perf")
                active = sys.is_stack_trampoline_active()
                exec(compile("def sub_fn():\\\\n    return 1\\\\nsub_fn()",
                             FILE, "exec"))
                with open("sub.txt", "w") as f:
                    f.write(str(active))
                '''.replace("FILE", repr(__file__))
            print(_testcapi.run_in_subinterp(code))
            with open("sub.txt") as f:
                print(f.read())
            print(sys.is_stack_trampoline_active())
            def main_fn():
                return 2
            main_fn()
            """)
        self.assertEqual(result.stdout, "0\nTrue\nFalse\n")
        self.assertEqual(result.script_names(), ["<module>", "sub_fn"])

    def test_subinterpreter_deactivation_leaves_main_active(self):
        result = self.run_script("""\
            import os, sys, _testcapi
            code = '''if 1:
                import sys
                before = sys.is_stack_trampoline_active()
                sys.deactivate_stack_trampoline()
                with open("sub.txt", "w") as f:
                    f.write(f"{before} {sys.is_stack_trampoline_active()}")
                '''
            print(_testcapi.run_in_subinterp(code))
            with open("sub.txt") as f:
                print(f.read())
            def main_fn():
                return 2
            main_fn()
            print(sys.is_stack_trampoline_active())
            """, python_args=["-X", "perf"])
        # The subinterpreter starts with the same configuration (-X perf).
        self.assertEqual(result.stdout, "0\nTrue False\nTrue\n")
        self.assertIn("main_fn", result.script_names())


class SemanticsTests(PerfTestCase):
    """A program prints exactly the same with and without -X perf."""

    def assertSameOutput(self, source, mapped=()):
        off = self.run_script(source, check=False)
        on = self.run_script(source, python_args=["-X", "perf"], check=False)
        self.assertEqual(off.returncode, 0, off.stderr)
        self.assertEqual(on.stdout, off.stdout)
        self.assertEqual(on.stderr, off.stderr)
        self.assertEqual(on.returncode, off.returncode)
        names = on.script_names()
        for name in mapped:
            self.assertIn(name, names)
        return off.stdout

    def test_exceptions_unwinding(self):
        out = self.assertSameOutput("""\
            import traceback

            def deep(n):
                if n == 0:
                    raise KeyError("bottom")
                return deep(n - 1) + 1

            class Boom:
                def method(self, n):
                    return deep(n)

            for depth in (0, 1, 5, 60):
                try:
                    Boom().method(depth)
                except KeyError as exc:
                    tb = exc.__traceback__
                    entries = []
                    while tb is not None:
                        entries.append((tb.tb_frame.f_code.co_qualname,
                                        tb.tb_lineno))
                        tb = tb.tb_next
                    print(depth, len(entries), entries[:3], entries[-2:])
            try:
                Boom().method(3)
            except KeyError:
                print(traceback.format_exc())
            def chained():
                try:
                    deep(2)
                except KeyError as exc:
                    raise ValueError("again") from exc
            try:
                chained()
            except ValueError:
                print(traceback.format_exc())
            def reraise_in_finally():
                try:
                    return deep(4)
                finally:
                    print("finally ran")
            try:
                reraise_in_finally()
            except KeyError as exc:
                print(repr(exc))
            """, mapped=["deep", "Boom.method", "chained"])
        self.assertIn("60 63 ", out)
        self.assertIn('line 5, in deep\n    raise KeyError("bottom")', out)

    def test_generators(self):
        out = self.assertSameOutput("""\
            def gen(n):
                try:
                    for i in range(n):
                        received = yield i
                        print("gen got", received)
                except ValueError as exc:
                    print("gen caught", exc)
                    yield "after-throw"
                finally:
                    print("gen finally")

            g = gen(5)
            print(next(g), g.send("a"), g.send("b"))
            print(g.throw(ValueError("boom")))
            g.close()
            g = gen(2)
            next(g)
            try:
                g.throw(TypeError("unhandled"))
            except TypeError as exc:
                tb = exc.__traceback__
                print("propagated", exc, tb.tb_next.tb_lineno,
                      tb.tb_next.tb_frame.f_code.co_name)
            print(list(gen(3)))
            print(sum(x * x for x in range(10)))

            def delegating():
                result = yield from gen(2)
                return result
            d = delegating()
            print(next(d), d.throw(ValueError("to inner")))
            d.close()

            def closing():
                try:
                    yield 1
                except GeneratorExit:
                    print("GeneratorExit seen")
                    raise
            c = closing()
            next(c)
            c.close()
            print(c.gi_frame, g.gi_running)
            """, mapped=["gen", "delegating", "closing", "<genexpr>"])
        self.assertIn("gen caught boom\nafter-throw\n", out)
        self.assertIn("GeneratorExit seen\n", out)

    def test_generators_resumed_by_the_evaluator(self):
        # for and yield from resume generators, and await coroutines,
        # from the evaluator (through their trampolines with -X perf);
        # every state gen_send_ex2() does not run the frame in takes the
        # usual way.  Without perf too: make test runs CPython's generator
        # and coroutine tests on the same path.
        out = self.assertSameOutput("""\
            import asyncio, traceback

            def numbers(n):
                for i in range(n):
                    yield i
                return "done"

            def relay(n):
                result = yield from numbers(n)
                print("relayed", result)
                return result

            def raises_stop():
                yield 1
                raise StopIteration("inside")

            def reentrant():
                yield from me

            def report(what, body):
                try:
                    print(what, body())
                except Exception:
                    print(what, traceback.format_exc(limit=-1).rstrip())

            print([x for x in relay(3)], list(relay(2)))
            for _ in range(3):
                print(sum(x for x in numbers(10)))
            g = numbers(2)
            print(list(g), list(g), [x for x in g])
            report("stop", lambda: [x for x in raises_stop()])
            me = reentrant()
            report("reentrant", lambda: next(me))
            me = reentrant()
            report("reentrant for", lambda: [x for x in me])

            async def leaf(i):
                if i == 2:
                    raise ValueError(i)
                return i

            async def reuse():
                coro = leaf(1)
                print("first", await coro)
                print("second", await coro)

            async def main():
                for i in range(4):
                    try:
                        print("leaf", await leaf(i))
                    except ValueError as exc:
                        print("caught", repr(exc))
                try:
                    await reuse()
                except RuntimeError as exc:
                    print("reuse", exc)

            asyncio.run(main())
            """, mapped=["numbers", "relay", "leaf", "main"])
        self.assertIn("relayed done\n", out)
        self.assertIn("generator raised StopIteration", out)
        self.assertEqual(out.count("generator already executing"), 2, out)
        self.assertIn("reuse cannot reuse already awaited coroutine\n", out)

    def test_coroutines(self):
        out = self.assertSameOutput("""\
            import asyncio

            async def leaf(i):
                await asyncio.sleep(0)
                if i == 3:
                    raise RuntimeError(f"coro {i}")
                return i * 2

            async def middle(i):
                try:
                    return await leaf(i)
                except RuntimeError as exc:
                    return f"caught {exc} at {exc.__traceback__.tb_lineno}"

            async def agen():
                for i in range(3):
                    yield i
                    await asyncio.sleep(0)

            async def main():
                print(await asyncio.gather(*(middle(i) for i in range(5))))
                print([x async for x in agen()])
                task = asyncio.ensure_future(asyncio.sleep(10))
                await asyncio.sleep(0)
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    print("cancelled")
                coro = leaf(0)
                print(coro.cr_code.co_name, coro.send(None) is None)
                try:
                    coro.throw(KeyError("thrown"))
                except KeyError as exc:
                    print("throw", repr(exc))

            asyncio.run(main())
            """, mapped=["leaf", "middle", "agen", "main"])
        self.assertIn("caught coro 3 at", out)
        self.assertIn("cancelled\n", out)

    def test_settrace_events(self):
        out = self.assertSameOutput("""\
            import sys

            def callee(x):
                y = x * 2
                if y > 2:
                    try:
                        raise ValueError(y)
                    except ValueError:
                        pass
                return y

            def caller(x):
                return callee(x) + callee(x + 1)

            def gen():
                yield 1
                yield 2

            events = []
            def tracer(frame, event, arg):
                if frame.f_code.co_filename == __file__:
                    events.append((event, frame.f_code.co_name,
                                   frame.f_lineno,
                                   type(arg).__name__))
                return tracer

            sys.settrace(tracer)
            caller(1)
            caller(5)
            list(gen())
            sys.settrace(None)
            for event in events:
                print(*event)
            """, mapped=["caller", "callee"])
        self.assertIn("call callee 3 NoneType\n", out)
        self.assertIn("exception callee 7 tuple\n", out)

    def test_setprofile_events(self):
        out = self.assertSameOutput("""\
            import sys

            def callee(x):
                return len(str(x))

            class K:
                def method(self, x):
                    return callee(x)

            def caller(x):
                return K().method(x) + sorted([x, 1], key=abs)[0]

            events = []
            def profiler(frame, event, arg):
                name = (getattr(arg, "__name__", None)
                        if event.startswith("c_") else None)
                events.append((event, frame.f_code.co_name, name))

            sys.setprofile(profiler)
            caller(3)
            caller(-7)
            sys.setprofile(None)
            for event in events:
                print(*event)
            """, mapped=["caller", "callee", "K.method"])
        self.assertIn("call callee None\n", out)
        self.assertIn("c_call callee len\n", out)

    def test_frames(self):
        out = self.assertSameOutput("""\
            import sys

            def inner():
                f = sys._getframe(0)
                chain = []
                while f is not None:
                    chain.append((f.f_code.co_name, f.f_lineno))
                    f = f.f_back
                print(chain)
                print([sys._getframe(n).f_code.co_name for n in range(4)])
                print(sys._getframe(1).f_locals)
                return sys._getframe(1).f_lineno

            def middle(a):
                local = a + 1
                return inner()

            def outer():
                return middle(1)

            print(outer())
            print(sys._getframe().f_back)

            saved = []
            def keep():
                saved.append(sys._getframe())
            def keeper():
                keep()
                return 1
            keeper()
            f = saved[0]
            print(f.f_code.co_name, f.f_lineno, f.f_back.f_code.co_name,
                  f.f_back.f_lineno)
            """, mapped=["inner", "middle", "outer"])
        self.assertIn("[('inner', 7), ('middle', 16), ('outer', 19), "
                      "('<module>', 21)]", out)

    def test_lasti(self):
        # f_lasti of a caller and tb_lasti depend on how far the call
        # instruction had got when the callee runs: with trampolines they
        # must be what they are without.
        self.assertSameOutput("""\
            import sys

            def callee():
                f = sys._getframe(1)
                return f.f_lasti, f.f_lineno

            def caller():
                return callee()

            def boom():
                raise ValueError

            def catcher():
                try:
                    boom()
                except ValueError as exc:
                    tb = exc.__traceback__
                    out = []
                    while tb is not None:
                        out.append((tb.tb_frame.f_code.co_name, tb.tb_lasti,
                                    tb.tb_lineno))
                        tb = tb.tb_next
                    return out

            for _ in range(3):
                print(caller(), catcher())
            """, mapped=["caller", "callee", "catcher"])

    def test_caller_stack_during_a_call(self):
        # While the callee runs, the caller's frame has its value stack
        # saved, as for an inlined call: the garbage collector sees the
        # locals and stack of a generator that is calling (gen_traverse).
        out = self.assertSameOutput("""\
            import gc

            class Held:
                pass

            def callee():
                return [type(o).__name__ for o in gc.get_referents(g)
                        if isinstance(o, Held)]

            def gen():
                local = Held()
                yield (Held(), callee())

            g = gen()
            print(next(g)[1])
            """, mapped=["callee", "gen"])
        self.assertEqual(out, "['Held', 'Held']\n")

    def test_caller_stack_hidden_again_after_a_call(self):
        # Once the callee has returned, the caller's stack is hidden from
        # the GC again (stacktop -1) while it runs: the slots the call
        # used may hold objects freed since.
        self.assertSameOutput("""\
            import gc

            class Held:
                pass

            def f():
                return 1

            def gen():
                t = (Held(), Held(), Held(), Held(), Held(), f())
                del t
                yield sorted(type(o).__name__
                             for o in gc.get_referents(g))

            g = gen()
            print(next(g))
            """, mapped=["f", "gen"])

    def test_f_lineno_jump_of_a_calling_frame(self):
        # A trace function moves the caller, whose call is running, to
        # another line with the same stack.  Stock 3.11 resumes it after
        # the target's first instruction, and then underflows its stack
        # (a crash, hence the separate processes): whatever it does,
        # -X perf must do the same, not drop the jump.
        source = """\
            import sys

            def callee():
                return 1

            def caller():
                a = 5
                x = (callee()
                     + 100)
                y = (a
                     + 200)
                return sorted(locals().items())

            def tracer(frame, event, arg):
                if event == "line" and frame.f_code is callee.__code__:
                    frame.f_back.f_lineno = caller.__code__.co_firstlineno + 5
                    print("jumped", flush=True)
                return tracer

            sys.settrace(tracer)
            print(caller(), flush=True)
            """
        off, on = [self.run_script(source, python_args=["-X", option],
                                   check=False)
                   for option in ("perf=0", "perf")]
        self.assertTrue(off.stdout.startswith("jumped\n"), off.stdout)
        self.assertEqual((on.returncode, on.stdout),
                         (off.returncode, off.stdout))
        self.assertIn("callee", on.script_names())

    def test_specialized_calls(self):
        out = self.assertSameOutput("""\
            class Seq:
                def __init__(self, n):
                    self.n = n

                def __getitem__(self, i):
                    if i >= self.n:
                        raise IndexError(i)
                    return i * self.n

                def method(self, a, b=2, *, c=3):
                    return (a, b, c, self.n)

            def with_defaults(a, b=10, c=20):
                return a + b + c

            def exact(a, b):
                return a - b

            s = Seq(3)
            total = 0
            for i in range(50):
                total += s[1] + with_defaults(i) + with_defaults(1, 2)
                total += with_defaults(1, c=5) + exact(i, 1)
                total += s.method(1)[0] + s.method(1, c=9)[2]
            print(total, list(s), s.method(7, b=8))
            for i in range(50):
                try:
                    s[i % 5]
                except IndexError as exc:
                    last = (repr(exc), exc.__traceback__.tb_next.tb_lineno)
            print(last)
            try:
                with_defaults()
            except TypeError as exc:
                print(exc)
            try:
                exact(1, 2, 3)
            except TypeError as exc:
                print(exc)
            print(sorted([3, 1, 2], key=lambda v: -v),
                  list(map(with_defaults, [1, 2])))
            """, mapped=["Seq.__getitem__", "Seq.method", "with_defaults",
                         "exact"])
        self.assertIn("('IndexError(4)', 7)\n", out)


class StackSafetyTests(PerfTestCase):
    """The fast path's native frames never exhaust the C stack."""

    def assertSameOutput(self, source, script_args=()):
        off = self.run_script(source, script_args=script_args, check=False)
        on = self.run_script(source, script_args=script_args, check=False,
                             python_args=["-X", "perf"])
        self.assertEqual(off.returncode, 0, off.stderr[-2000:])
        self.assertEqual((on.returncode, on.stdout, on.stderr),
                         (off.returncode, off.stdout, off.stderr))
        return on

    def test_deep_recursion(self):
        on = self.assertSameOutput("""\
            import sys
            sys.setrecursionlimit(200000)
            def down(n):
                return 0 if n == 0 else 1 + down(n - 1)
            print(down(150000))
            """)
        self.assertEqual(on.stdout, "150000\n")
        self.assertIn("down", on.script_names())

    RUNAWAY = """\
        import sys, threading
        depth = 0
        def runaway():
            global depth
            depth += 1
            runaway()
        def attempt():
            global depth
            depth = 0
            try:
                runaway()
            except RecursionError as exc:
                print(threading.current_thread().name, exc, depth)
        sys.setrecursionlimit(int(sys.argv[1]))
        {run}
        """

    def test_runaway_recursion_main_thread(self):
        for limit in ("1000", "100000"):
            with self.subTest(limit=limit):
                on = self.assertSameOutput(
                    self.RUNAWAY.format(run="attempt()"),
                    script_args=[limit])
                # <module> and attempt() count too.
                self.assertEqual(
                    on.stdout, "MainThread maximum recursion depth exceeded "
                               f"{int(limit) - 2}\n")

    def test_runaway_recursion_small_thread_stack(self):
        run = """
            threading.stack_size(256 * 1024)
            thread = threading.Thread(target=attempt, name="small")
            thread.start()
            thread.join()
            """
        source = self.RUNAWAY.format(run=textwrap.indent(
            textwrap.dedent(run), " " * 8))
        for limit in ("1000", "100000"):
            with self.subTest(limit=limit):
                on = self.assertSameOutput(source, script_args=[limit])
                self.assertRegex(
                    on.stdout,
                    r"^small maximum recursion depth exceeded \d+\n$")


# gdb learns about trampolines through its JIT interface
# (Python/perf_gdb_jit.c): one in-memory ELF image per arena, with a
# function symbol and an FDE for every slot.
GDB_TRAMPOLINE = "py_trampoline"

# gdb's JIT interface (GDB manual, "JIT Compilation Interface"), for the C
# programs below that stand in for another JIT.
JIT_INTERFACE_C = """\
#include <stdint.h>

struct jit_code_entry {
    struct jit_code_entry *next_entry;
    struct jit_code_entry *prev_entry;
    const char *symfile_addr;
    uint64_t symfile_size;
};
struct jit_descriptor {
    uint32_t version;
    uint32_t action_flag;
    struct jit_code_entry *relevant_entry;
    struct jit_code_entry *first_entry;
};
"""

def run_gdb(commands, args=(), *, attach=None, files=None,
            timeout=support.SHORT_TIMEOUT):
    """Run gdb -batch with `commands` (each an -ex) on the program `args`,
    or attached to the process `attach`; return its whole output.
    `files` (a ProfilerFiles) claims the files of the processes it ran."""
    cmd = ["gdb", *GDB_OPTIONS]
    if attach is not None:
        cmd += ["-p", str(attach)]
    for command in commands:
        cmd += ["-ex", command]
    if args:
        cmd += ["--args", *args]
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, errors="backslashreplace",
        env=clean_env(), timeout=timeout)
    if files is not None:
        files.add_gdb_inferiors(proc.stdout)
    return proc.stdout


def backtraces(output):
    """The frame names of each "bt" in gdb's output, innermost first."""
    traces = []
    for line in output.splitlines():
        match = GDB_FRAME_RE.match(line)
        if match is None:
            continue
        if match.group(1) == "0":
            traces.append([])
        if traces:
            traces[-1].append(match.group(2))
    return traces


@needs_host("gdb")
class GdbTests(PerfTestCase):
    """gdb unwinds through trampolines: a backtrace taken anywhere in a
    Python call reaches main, each Python level an evaluator frame called
    by its trampoline."""

    SCRIPT = """\
        import os
        def leaf():
            return os.getppid()
        def middle():
            return leaf()
        def top():
            return middle()
        top()
        """

    def setUp(self):
        super().setUp()
        reason = gdb_available()
        if reason:
            skip_environment(reason)

    def assertPythonLevels(self, names, levels, output):
        """`levels` Python calls in a row, each an evaluator called by a
        trampoline gdb names, and the whole stack down to main."""
        run = [EVAL, GDB_TRAMPOLINE] * levels
        self.assertTrue(
            any(names[i:i + len(run)] == run for i in range(len(names))),
            output)
        self.assertNotIn("Backtrace stopped", output)
        self.assertIn("Py_BytesMain", names, output)
        # Every frame down to main has a name.  (Below it, libc's own
        # static functions have none without libc's debug symbols.)
        self.assertNotIn("??", names[:names.index("Py_BytesMain")], output)

    def test_backtrace_walks_through_trampolines(self):
        path = write_script(self.tmpdir, self.SCRIPT)
        # The same stop without trampolines shows what this gdb can do.
        names, output = gdb_backtrace([sys.executable, path], "os_getppid",
                                      self.files)
        if names[:1] != ["os_getppid"] or "Py_BytesMain" not in names:
            skip_environment("gdb cannot unwind this interpreter without "
                          "trampolines either:\n" + output[-1000:])
        for backend in ("perf", "perf_jit"):
            with self.subTest(backend=backend):
                names, output = gdb_backtrace(
                    [sys.executable, "-X", backend, path], "os_getppid",
                    self.files)
                self.assertEqual(names[:1], ["os_getppid"], output)
                # leaf, middle, top and <module>
                self.assertPythonLevels(names, 4, output)

    def test_backtrace_from_the_evaluator(self):
        # Stop at the entry of inner()'s evaluator, four levels deep: its
        # caller is the trampoline, at the instruction after the call.
        path = write_script(self.tmpdir, """\
            import os
            def inner():
                return 1
            def leaf():
                os.getppid()
                return inner()
            def middle():
                return leaf()
            def top():
                return middle()
            top()
            """)
        for backend in ("perf", "perf_jit"):
            with self.subTest(backend=backend):
                output = run_gdb(
                    ["break os_getppid", "run",
                     f"break {EVAL}", "continue", "bt", "kill"],
                    [sys.executable, "-X", backend, path], files=self.files)
                traces = backtraces(output)
                self.assertEqual(len(traces), 1, output)
                names = traces[0]
                self.assertEqual(names[:2], [EVAL, GDB_TRAMPOLINE], output)
                # inner, leaf, middle, top and <module>
                self.assertPythonLevels(names, 5, output)

    # Run inside gdb: stop in leaf()'s first call, then break at every
    # instruction of leaf()'s trampoline (its address from the perf map)
    # and take a backtrace at each stop.  The first call hits the
    # instructions after the call; the second call, all of them.
    STEP_SCRIPT = """\
        import gdb

        def stack():
            names = []
            frame = gdb.newest_frame()
            while frame is not None:
                names.append(frame.name() or "??")
                last, frame = frame, frame.older()
            return names, gdb.frame_stop_reason_string(
                last.unwind_stop_reason())

        gdb.execute("run")
        pid = gdb.selected_inferior().pid
        with open(f"/tmp/perf-{{pid}}.map", encoding="utf-8") as f:
            for line in f:
                start, size, name = line.rstrip("\\n").split(" ", 2)
                if name == {target!r}:
                    start, size = int(start, 16), int(size, 16)
                    break
        frame = gdb.newest_frame()
        while not start <= frame.pc() < start + size:
            frame = frame.older()
        print("RETURN", frame.pc() - start)
        arch = gdb.selected_frame().architecture()
        insns = arch.disassemble(start, start + size - 1)
        print("INSNS", *(insn["addr"] - start for insn in insns))
        gdb.execute("delete")
        for insn in insns:
            gdb.Breakpoint(f"*{{insn['addr']:#x}}")
        for _ in range(100):
            gdb.execute("continue")
            if not gdb.selected_inferior().threads():
                break
            names, reason = stack()
            offset = gdb.selected_frame().pc() - start
            print("STOP", offset, ",".join(names), reason)
        """

    def test_every_instruction_of_a_trampoline(self):
        probe = run_gdb(["python print('gdb has python')"])
        if "gdb has python" not in probe:
            skip_environment("this gdb has no Python support:\n" + probe)
        # leaf's map line waits in memory until the process blocks: the
        # first call makes it, a sleep writes it, the calls from middle()
        # are the ones stopped in.
        path = write_script(self.tmpdir, """\
            import os, time
            def leaf():
                return os.getppid()
            def middle():
                leaf()
                return leaf()
            def top():
                return middle()
            leaf()
            time.sleep(0)
            top()
            """)
        commands = write_script(
            self.tmpdir,
            self.STEP_SCRIPT.format(target=f"py::leaf:{path}"),
            name="commands.py")
        output = run_gdb(["break os_getppid", "ignore 1 1",
                          f"source {commands}"],
                         [sys.executable, "-X", "perf", path],
                         files=self.files)
        insns = returns_to = None
        stops = []
        for line in output.splitlines():
            words = line.split()
            if words[:1] == ["INSNS"]:
                insns = [int(word) for word in words[1:]]
            elif words[:1] == ["RETURN"]:
                returns_to = int(words[1])
            elif words[:1] == ["STOP"]:
                _, offset, names, reason = line.split(" ", 3)
                stops.append((int(offset), reason, names.split(",")))
        self.assertIsNotNone(insns, output)
        self.assertIn(returns_to, insns, output)
        self.assertGreater(returns_to, insns[0], output)
        # The first call is past its call instruction; the second one
        # runs them all.
        expected = [offset for offset in insns if offset >= returns_to]
        self.assertEqual([offset for offset, _, _ in stops],
                         expected + insns, output)
        for offset, reason, names in stops:
            with self.subTest(offset=offset):
                # leaf's trampoline, then middle, top and <module>.
                self.assertEqual(names[0], GDB_TRAMPOLINE, output)
                self.assertEqual(names[1:7], [EVAL, GDB_TRAMPOLINE] * 3,
                                 output)
                self.assertIn("Py_BytesMain", names, output)
                # gdb ends a backtrace at main when it knows main (as in
                # a --with-pydebug build), else where the stack ends;
                # never at an unwinding error.
                if names[-1] != "main":
                    self.assertEqual(reason, "outermost", output)

    OTHER_JIT = """\
/* Another JIT in the process: its own gdb JIT interface pair, and one
   image (an object file with a function) registered through it. */
#include <stdlib.h>
#include <string.h>
""" + JIT_INTERFACE_C + """

void __attribute__((noinline))
__jit_debug_register_code(void)
{
    __asm__ __volatile__("" ::: "memory");
}

struct jit_descriptor __jit_debug_descriptor = {1, 0, NULL, NULL};

int
other_jit_register(const char *image, uint64_t size)
{
    struct jit_code_entry *entry = calloc(1, sizeof(*entry));
    char *copy = malloc(size);
    if (entry == NULL || copy == NULL) {
        return -1;
    }
    memcpy(copy, image, size);
    entry->symfile_addr = copy;
    entry->symfile_size = size;
    entry->next_entry = __jit_debug_descriptor.first_entry;
    if (entry->next_entry != NULL) {
        entry->next_entry->prev_entry = entry;
    }
    __jit_debug_descriptor.first_entry = entry;
    __jit_debug_descriptor.relevant_entry = entry;
    __jit_debug_descriptor.action_flag = 1;
    __jit_debug_register_code();
    __jit_debug_descriptor.action_flag = 0;
    return 0;
}
"""

    def test_another_jits_images_next_to_ours(self):
        # A JIT library with its own pair of gdb symbols registers an image
        # (an object file with one function) from a -X perf process: gdb
        # knows that function and still walks through our trampolines.
        cc = shutil.which(sysconfig.get_config_var("CC").split()[0])
        if cc is None:
            skip_environment("needs the C compiler Python was built with")
        library = os.path.join(self.tmpdir, "libotherjit.so")
        image = os.path.join(self.tmpdir, "image.o")
        write_script(self.tmpdir, self.OTHER_JIT, "otherjit.c")
        write_script(self.tmpdir,
                     "int other_jit_function(int x) { return x * 7; }\n",
                     "image.c")
        for command in ([cc, "-shared", "-fPIC", "otherjit.c", "-o",
                         library],
                        [cc, "-g", "-c", "image.c", "-o", image]):
            build = subprocess.run(command, cwd=self.tmpdir,
                                   capture_output=True, text=True)
            self.assertEqual(build.returncode, 0, build.stderr)
        path = write_script(self.tmpdir, """\
            import ctypes, os, sys
            other_jit = ctypes.PyDLL(sys.argv[1])
            with open(sys.argv[2], "rb") as f:
                image = f.read()
            if other_jit.other_jit_register(image,
                                            ctypes.c_uint64(len(image))):
                sys.exit("other_jit_register failed")
            def leaf():
                return os.getppid()
            def middle():
                return leaf()
            middle()
            """)
        output = run_gdb(["break os_getppid", "run",
                          "info functions other_jit_function", "bt", "kill"],
                         [sys.executable, "-X", "perf", path, library, image],
                         files=self.files)
        self.assertIn("int other_jit_function(int);", output)
        traces = backtraces(output)
        self.assertEqual(len(traces), 1, output)
        # leaf, middle and <module>
        self.assertPythonLevels(traces[0], 3, output)

    def test_py_bt(self):
        # CPython's gdb extension walks the C stack for evaluator frames:
        # it needs the unwinding through trampolines too.
        extension = os.path.join(os.path.dirname(sys.executable),
                                 "python-gdb.py")
        if not os.path.exists(extension):
            skip_environment(f"needs the build directory's {extension}")
        probe = run_gdb(["python print('gdb has python')"])
        if "gdb has python" not in probe:
            skip_environment("this gdb has no Python support:\n" + probe)
        path = write_script(self.tmpdir, self.SCRIPT)
        output = run_gdb([f"source {extension}", "break os_getppid", "run",
                          "py-bt", "kill"],
                         [sys.executable, "-X", "perf", path],
                         files=self.files)
        functions = re.findall(rf'^  File "{re.escape(path)}", line \d+, '
                               rf'in (\S+)$', output, re.MULTILINE)
        self.assertEqual(functions, ["leaf", "middle", "top", "<module>"],
                         output)
        self.assertNotIn("Python Exception", output)

    def test_attach_to_process_and_forked_child(self):
        # gdb -p finds the images already registered, by walking the list;
        # a forked child has the parent's images at the same addresses.
        path = write_script(self.tmpdir, """\
            import os, sys
            def leaf():
                return os.read(0, 1)        # until the test closes stdin
            def middle():
                pid = os.fork()
                role = "child" if pid == 0 else "parent"
                # One write(): print() may split a line between writes.
                os.write(1, f"{role} {os.getpid()}\\n".encode())
                leaf()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            def top():
                return middle()
            top()
            """)
        proc = subprocess.Popen(
            [sys.executable, "-X", "perf", path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=clean_env())
        try:
            pids = {}
            for _ in range(2):
                role, pid = proc.stdout.readline().split()
                pids[role] = int(pid)
                self.files.add_pid(pid)
            for role, pid in sorted(pids.items()):
                with self.subTest(role):
                    output = run_gdb(["bt", "detach"], attach=pid)
                    if "ptrace: Operation not permitted" in output:
                        skip_environment("gdb may not attach here (ptrace "
                                      "scope):\n" + output[-500:])
                    traces = backtraces(output)
                    self.assertEqual(len(traces), 1, output)
                    # leaf, middle, top and <module>
                    self.assertPythonLevels(traces[0], 4, output)
        finally:
            proc.stdin.close()
            proc.stdout.close()
            proc.wait(timeout=support.SHORT_TIMEOUT)
        self.assertEqual(proc.returncode, 0)


class GdbJitImageTests(PerfTestCase):
    """The ELF images Python/perf_gdb_jit.c hands gdb, read back from a
    running interpreter through __jit_debug_descriptor and decoded with
    readelf: one per arena, with one symbol and one FDE covering all its
    slots, the FDE's rules right at every instruction of every slot."""

    # Make trampolines until a second arena exists, then walk the list
    # and dump every image into the current directory.
    SCRIPT = """\
        import ctypes, json, types

        class Entry(ctypes.Structure):
            pass
        Entry._fields_ = [
            ("next_entry", ctypes.POINTER(Entry)),
            ("prev_entry", ctypes.POINTER(Entry)),
            ("symfile_addr", ctypes.c_void_p),
            ("symfile_size", ctypes.c_uint64),
        ]
        class Descriptor(ctypes.Structure):
            _fields_ = [
                ("version", ctypes.c_uint32),
                ("action_flag", ctypes.c_uint32),
                ("relevant_entry", ctypes.POINTER(Entry)),
                ("first_entry", ctypes.POINTER(Entry)),
            ]
        api = ctypes.PyDLL(None)
        descriptor = Descriptor.in_dll(api, "__jit_debug_descriptor")

        def entries():
            found = []
            entry = descriptor.first_entry
            while entry:
                found.append(entry)
                entry = entry.contents.next_entry
            return found

        code = compile("def f(): return 1", "generated.py", "exec")
        body = code.co_consts[0]
        for i in range(100_000):
            if i % 256 == 0 and len(entries()) >= 2:
                break
            types.FunctionType(body.replace(co_name=f"f{i}"), {})()

        images = []
        previous = None
        for n, entry in enumerate(entries()):
            e = entry.contents
            with open(f"image{n}.o", "wb") as f:
                f.write(ctypes.string_at(e.symfile_addr, e.symfile_size))
            prev = ctypes.cast(e.prev_entry, ctypes.c_void_p).value
            images.append({"path": f"image{n}.o", "size": e.symfile_size,
                           "prev_ok": prev == previous})
            previous = ctypes.addressof(e)
        import _testinternalcapi
        print(json.dumps({
            "version": descriptor.version,
            "action_flag": descriptor.action_flag,
            "relevant_entry": bool(descriptor.relevant_entry),
            "template_size": len(_testinternalcapi.perf_template()),
            "images": images,
        }))
        """

    def setUp(self):
        super().setUp()
        if shutil.which("readelf") is None:
            skip_environment("readelf (binutils) is not installed")

    def readelf(self, *args):
        proc = subprocess.run(["readelf", "-W", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, errors="backslashreplace",
                              timeout=support.SHORT_TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Warning", proc.stderr)
        return proc.stdout

    def sections(self, path):
        """{name: (type, address, size, flags)} from readelf -S."""
        found = {}
        for line in self.readelf("-S", path).splitlines():
            match = re.match(r"^\s*\[\s*\d+\]\s+(\S+)\s+(\S+)\s+([0-9a-f]+) "
                             r"[0-9a-f]+ ([0-9a-f]+) [0-9a-f]+\s+(\S*)\s+\d",
                             line)
            if match:
                name, kind, addr, size, flags = match.groups()
                found[name] = (kind, int(addr, 16), int(size, 16), flags)
        return found

    def symbols(self, path):
        """[(value, size, type, bind, section, name)] from readelf -s."""
        found = []
        for line in self.readelf("-s", path).splitlines():
            words = line.split()
            if len(words) in (7, 8) and re.fullmatch(r"\d+:", words[0]):
                found.append((int(words[1], 16), int(words[2]), words[3],
                              words[4], words[6], " ".join(words[7:])))
        return found

    def eh_frame(self, path):
        """The bytes of the image's .eh_frame section."""
        with open(path, "rb") as f:
            data = f.read()
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3a)
        def header(i):
            # name, offset, size
            name, = struct.unpack_from("<I", data, shoff + i * shentsize)
            offset, size = struct.unpack_from("<QQ", data,
                                              shoff + i * shentsize + 24)
            return name, offset, size
        _, names_at, _ = header(shstrndx)
        for i in range(shnum):
            name, offset, size = header(i)
            end = data.index(b"\0", names_at + name)
            if data[names_at + name:end] == b".eh_frame":
                return data[offset:offset + size]
        self.fail(f"{path} has no .eh_frame")

    def test_images(self):
        # Rules derived from the template's disassembly, as test_jit does.
        from test.test_perf_profiler.test_jit import (
            HOST_MACHINE, check_slot_fde, disassemble, make_elf,
            running_template, unwind_info_from_c)
        if HOST_MACHINE is None:
            self.skipTest("not an x86_64 or aarch64 host")
        template = running_template()
        slot = (len(template) + 15) & ~15
        elf = os.path.join(self.tmpdir, "template.so")
        with open(elf, "wb") as f:
            f.write(make_elf(HOST_MACHINE, template,
                             *unwind_info_from_c(HOST_MACHINE, template)))
        insns = disassemble(self, HOST_MACHINE, elf)

        result = self.run_script(self.SCRIPT, python_args=["-X", "perf"])
        info = json.loads(result.stdout)
        # Registered and back to "no action", as the protocol asks.
        self.assertEqual((info["version"], info["action_flag"],
                          info["relevant_entry"]), (1, 0, False))
        self.assertEqual(info["template_size"], len(template))
        images = info["images"]
        self.assertEqual(len(images), 2, "one image per arena")
        texts = []
        for image in images:
            with self.subTest(image=image["path"]):
                self.assertTrue(image["prev_ok"], "list links")
                path = os.path.join(self.tmpdir, image["path"])
                header = self.readelf("-h", path)
                self.assertRegex(header, r"Type:\s+REL ")
                self.assertRegex(header, r"Class:\s+ELF64")
                machine = {62: "X86-64", 183: "AArch64"}[HOST_MACHINE]
                self.assertRegex(header, rf"Machine:\s+.*{machine}")

                sections = self.sections(path)
                self.assertEqual(sorted(sections), [
                    ".eh_frame", ".shstrtab", ".strtab", ".symtab", ".text"])
                kind, text, text_size, flags = sections[".text"]
                self.assertEqual((kind, flags), ("NOBITS", "AX"))
                self.assertEqual(sections[".eh_frame"][0], "PROGBITS")
                texts.append((text, text_size))

                # One symbol, covering every slot.
                symbols = self.symbols(path)
                self.assertEqual(symbols, [
                    (0, 0, "NOTYPE", "LOCAL", "UND", ""),
                    (0, text_size, "FUNC", "LOCAL", "1", GDB_TRAMPOLINE)])
                self.assertEqual(text_size % slot, 0)
                self.assertGreater(text_size // slot, 1000)

                # One CIE and one FDE (which readelf decodes without a
                # warning), with the template's rules at every instruction
                # of every slot.
                self.assertIn("DW_CFA_def_cfa_expression",
                              self.readelf("--debug-dump=frames", path))
                check_slot_fde(self, HOST_MACHINE, insns,
                               self.eh_frame(path), text, text_size, slot)

                # The section headers end the image.
                shoff = re.search(r"Start of section headers:\s+(\d+)",
                                  header)
                self.assertEqual(int(shoff.group(1)) + 6 * 64,
                                 image["size"])

        # The arenas do not overlap, and every trampoline of the map
        # starts at a slot of one of them.
        texts.sort()
        for (a, a_size), (b, _) in zip(texts, texts[1:]):
            self.assertLessEqual(a + a_size, b)
        entries = result.map_entries()
        self.assertGreater(len(entries), sum(size for _, size in texts)
                           // slot // 2)
        for entry in entries:
            self.assertTrue(any(text <= entry.start < text + size
                                and (entry.start - text) % slot == 0
                                for text, size in texts), entry)


class GdbJitSymbolTests(PerfTestCase):
    """gdb's JIT interface symbols are weak: a program that links the
    static libpython next to its own pair (as LLVM, LuaJIT or V8 users
    do) links, and our images go to its list."""

    HOST = """\
#include <Python.h>
""" + JIT_INTERFACE_C + """
/* This program's own gdb JIT interface, as another JIT would define it. */

static int registrations;

void __attribute__((noinline))
__jit_debug_register_code(void)
{
    registrations++;
    __asm__ __volatile__("" ::: "memory");
}

struct jit_descriptor __jit_debug_descriptor = {1, 0, NULL, NULL};

int
main(int argc, char **argv)
{
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.module_search_paths_set = 1;
    for (int i = 1; i < argc; i++) {
        wchar_t *path = Py_DecodeLocale(argv[i], NULL);
        if (path == NULL
            || PyStatus_Exception(PyWideStringList_Append(
                   &config.module_search_paths, path))) {
            return 2;
        }
        PyMem_RawFree(path);
    }
    if (PyStatus_Exception(PyWideStringList_Append(&config.xoptions,
                                                   L"perf"))) {
        return 2;
    }
    PyStatus status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        Py_ExitStatusException(status);
    }
    if (PyRun_SimpleString(
            "import sys\\n"
            "def f():\\n"
            "    return sys.is_stack_trampoline_active()\\n"
            "print(f())\\n") != 0) {
        return 1;
    }
    int entries = 0;
    for (struct jit_code_entry *e = __jit_debug_descriptor.first_entry;
         e != NULL; e = e->next_entry) {
        entries++;
    }
    printf("%d %d\\n", registrations > 0, entries == registrations);
    return Py_FinalizeEx() < 0 ? 1 : 0;
}
"""

    def test_host_with_its_own_pair(self):
        srcdir = sysconfig.get_config_var("srcdir")
        if sysconfig.get_config_var("Py_ENABLE_SHARED"):
            # The build's libpython.so: its uses of the pair must bind to
            # the program's, even linked -Bsymbolic-functions (Debian).
            name = sysconfig.get_config_var("LDLIBRARY")
            library = [f"-L{srcdir}", f"-l:{name}", f"-Wl,-rpath,{srcdir}"]
        else:
            name = sysconfig.get_config_var("LIBRARY")
            library = [os.path.join(srcdir, name)]
        if not os.path.exists(os.path.join(srcdir, name)):
            skip_environment(f"needs the build directory's {name}")
        cc = shutil.which(sysconfig.get_config_var("CC").split()[0])
        if cc is None:
            skip_environment("needs the C compiler Python was built with")
        source = write_script(self.tmpdir, self.HOST, "host.c")
        host = os.path.join(self.tmpdir, "host")
        libs = " ".join(sysconfig.get_config_var(name) or "" for name in
                        ("LIBS", "SYSLIBS", "MODLIBS", "LINKFORSHARED"))
        build = subprocess.run(
            [cc, "-I", os.path.join(srcdir, "Include"), "-I", srcdir,
             source, *library, *libs.split(), "-o", host],
            capture_output=True, text=True)
        self.assertEqual(build.returncode, 0, build.stderr)
        with open(os.path.join(srcdir, "pybuilddir.txt")) as f:
            extensions = os.path.join(srcdir, f.read().strip())
        proc = subprocess.Popen(
            target_command([host, os.path.join(srcdir, "Lib"), extensions]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env())
        self.files.add_pid(proc.pid)
        stdout, stderr = proc.communicate(timeout=support.SHORT_TIMEOUT)
        self.assertEqual(proc.returncode, 0, stderr)
        # Trampolines on; the host's own function was called and its list
        # holds every image registered.
        self.assertEqual((stdout, stderr), ("True\n1 1\n", ""))


@needs_host("perf")
class PerfRecordTests(PerfTestCase):
    """perf record -g sees the Python functions, in call order."""

    def setUp(self):
        super().setUp()
        reason = perf_record_works()
        if reason:
            skip_environment(reason)

    def record(self, source, python_args=(), returncode=0):
        path = write_script(self.tmpdir, source)
        record, samples = record_samples(
            [sys.executable, *python_args, path], self.tmpdir,
            check=returncode == 0)
        self.assertEqual(record.returncode, returncode, record.stderr)
        pids = {int(s.header.split()[0]) for s in samples
                if s.header.split()[0].isdigit()}
        for pid in pids:
            self.files.add_pid(pid)
        return path, samples

    def assertChains(self, samples, path, expected, between=None):
        """Check samples in `expected[0]`: their py:: frames of `path` are
        `expected` (innermost first) and, in most, consecutive Python
        frames are separated by exactly one evaluator frame (or, for the
        pairs in `between`, by a chain through that C function).  With
        PYTHON_FRAME_RECORDS, such a chain shows only the function that
        called the trampoline: the C functions above it keep no frame
        record, nor does the evaluator that called them."""
        hits = [s for s in samples if expected[0] in s.python_frames(path)]
        self.assertGreaterEqual(len(hits), 20,
                                f"{len(samples)} samples, few in "
                                f"{expected[0]}")
        symbols = [f"py::{name}:{path}" for name in expected]
        good = 0
        for sample in hits:
            if sample.python_frames(path) != expected:
                continue
            positions = [sample.frames.index(symbol) for symbol in symbols]
            ok = True
            for k, (a, b) in enumerate(zip(positions, positions[1:])):
                gap = sample.frames[a + 1:b]
                if between and k in between:
                    if PYTHON_FRAME_RECORDS:
                        ok = ok and len(gap) == 1 and gap[0] != EVAL
                    else:
                        ok = ok and between[k] in gap and gap[-1] == EVAL
                else:
                    ok = ok and gap == [EVAL]
            good += ok
        # A sample taken while a trampoline sets up its frame, or in a
        # function without a frame pointer, may lose a frame: demand
        # most, not all.
        self.assertGreaterEqual(good, len(hits) // 2,
                                f"{good} of {len(hits)} samples in "
                                f"{expected[0]} show {expected}:\n"
                                + "\n".join(map(str, hits[:3])))

    HOT = """\
        def leaf(n):
            s = 0
            for i in range(n):
                s += i * i
            return s
        def middle(n):
            return leaf(n)
        def top():
            t = 0
            for _ in range(25):
                t += middle(150000)
            return t
        """

    def test_killed_process_chain(self):
        # The map of a process killed outright ends in the NULs it was
        # grown with: perf reads the names before them all the same.
        # (perf record passes the command's death on: it kills itself.)
        path, samples = self.record(
            textwrap.dedent(self.HOT) + "import os, signal\n"
            "top()\n"
            "os.kill(os.getpid(), signal.SIGKILL)\n",
            ["-X", "perf"], returncode=-signal.SIGKILL)
        self.assertChains(samples, path,
                          ["leaf", "middle", "top", "<module>"])

    def test_other_eval_frame_function_chain(self):
        # Another PEP 523 function chained behind ours: calls go through
        # _PyEval_Vector, as in stock 3.11 with that function installed,
        # and perf still names every Python frame.
        path, samples = self.record(
            textwrap.dedent(self.HOT) + "import _testinternalcapi\n"
            "_testinternalcapi.set_eval_frame_record([])\n"
            "top()\n", ["-X", "perf"])
        self.assertChains(samples, path,
                          ["leaf", "middle", "top", "<module>"],
                          between={k: "_PyEval_Vector" for k in range(3)})

    def test_xoption_fast_path_chain(self):
        path, samples = self.record(self.HOT + "top()\n", ["-X", "perf"])
        self.assertChains(samples, path,
                          ["leaf", "middle", "top", "<module>"])

    def test_sys_api_chain(self):
        path, samples = self.record(
            "import sys\nsys.activate_stack_trampoline('perf')\n"
            + textwrap.dedent(self.HOT) + "top()\n")
        self.assertChains(samples, path, ["leaf", "middle", "top"])
        # The module frame started before activation: no trampoline.
        for sample in samples:
            self.assertNotIn("<module>", sample.python_frames(path))

    def test_calls_from_c_chain(self):
        path, samples = self.record("""\
            def leaf(n):
                s = 0
                for i in range(3000):
                    s += i * n
                return s
            def middle():
                return list(map(leaf, range(300)))
            def top():
                for _ in range(8):
                    middle()
            top()
            """, ["-X", "perf"])
        self.assertChains(samples, path,
                          ["leaf", "middle", "top", "<module>"],
                          between={0: "map_next"})

    def test_generator_chain(self):
        # Calling squares() only makes the generator; its frame goes
        # through the trampoline each time sum() resumes it.
        path, samples = self.record("""\
            def squares(n):
                for i in range(n):
                    yield i * i
            def total():
                t = 0
                for _ in range(25):
                    t += sum(squares(150000))
                return t
            total()
            """, ["-X", "perf"])
        self.assertChains(samples, path,
                          ["squares", "total", "<module>"],
                          between={0: "builtin_sum"})

    def test_nested_generators_chain(self):
        # for over a generator, yield from: the evaluator resumes each
        # generator's frame through its trampoline itself, one evaluator
        # frame between two generators as between two functions.
        path, samples = self.record("""\
            def leaf(n):
                for i in range(n):
                    s = 0
                    for j in range(100):
                        s += i * j
                    yield s
            def middle(n):
                yield from leaf(n)
            def top(n):
                t = 0
                for x in middle(n):
                    t += x
                return t
            top(60000)
            """, ["-X", "perf"])
        self.assertChains(samples, path,
                          ["leaf", "middle", "top", "<module>"])

    def test_await_chain(self):
        path, samples = self.record("""\
            async def leaf(n):
                s = 0
                for i in range(n):
                    s += i * i
                return s
            async def middle(n):
                return await leaf(n)
            async def top():
                t = 0
                for _ in range(25):
                    t += await middle(150000)
                return t
            def run(coro):
                try:
                    coro.send(None)
                except StopIteration as stop:
                    return stop.value
            run(top())
            """, ["-X", "perf"])
        self.assertChains(samples, path,
                          ["leaf", "middle", "top", "run", "<module>"],
                          between={2: "gen_send"})

    def test_specialized_calls_chain(self):
        # BINARY_SUBSCR_GETITEM, CALL_PY_WITH_DEFAULTS, a method call.
        path, samples = self.record("""\
            def hot(n, step=1):
                s = 0
                for i in range(0, n, step):
                    s += i * i
                return s
            class Table:
                def method(self, n):
                    return hot(n)
                def __getitem__(self, n):
                    return self.method(n)
            def top():
                table = Table()
                for _ in range(25):
                    table[150000]
            top()
            """, ["-X", "perf"])
        self.assertChains(samples, path,
                          ["hot", "Table.method", "Table.__getitem__",
                           "top", "<module>"])


if __name__ == "__main__":
    unittest.main()
