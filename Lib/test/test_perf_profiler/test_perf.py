"""Perf map backend: the map's lines, the switches, the sys API, other
frame evaluators and the map file's place in /tmp.

Each test runs the interpreter in a subprocess and checks its output and
the /tmp/perf-<pid>.map it leaves behind.
"""

import os
import re
import stat
import sysconfig
import textwrap
import unittest

from test.test_perf_profiler.util import (
    PerfTestCase, clean_env, map_path, parse_map, write_script)


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
            # Longer than a word, one in each of three (the last overlaps).
            i = type(f)(f.__code__.replace(
                co_qualname="abcdefg\\x1fhijklmn\\x7fop\\x01"), {})
            g(); h(); i()
            """, python_args=["-X", "perf"])
        names = result.script_names()
        self.assertIn("a\\x0ab\\x09c", names)
        self.assertIn("s\\udc80t\u00e9", names)
        self.assertIn("abcdefg\\x1fhijklmn\\x7fop\\x01", names)

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
            def later():
                def after():            # first called while off
                    return 2
                after()
            before()
            print(sys.is_stack_trampoline_active())
            sys.deactivate_stack_trampoline()
            print(sys.is_stack_trampoline_active())
            later()
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "True\nFalse\n")
        names = result.script_names()
        self.assertIn("before", names)
        self.assertNotIn("later.<locals>.after", names)

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

    def test_arena_mappings(self):
        # 5000 trampolines need more than one arena.  None is writable
        # and executable; each has 64 KiB of inaccessible address space
        # below it, where no thread stack comes within reach of perf's
        # stack copy (up to 65528 bytes), which DWARF unwinding would read
        # in place of the trampoline's unwind tables.
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
            arena = [(low, high, p) for low, high, p in mappings
                     if low <= entry.start and end <= high]
            self.assertEqual([p for _, _, p in arena], ["r-xp"], entry)
            below = [(low, p) for low, high, p in mappings
                     if high == arena[0][0]]
            self.assertEqual(len(below), 1, entry)
            self.assertEqual(below[0][1], "---p", entry)
            self.assertGreaterEqual(arena[0][0] - below[0][0], 64 * 1024)

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


if __name__ == "__main__":
    unittest.main()
