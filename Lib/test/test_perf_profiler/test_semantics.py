"""A program does with trampolines on exactly what it does without them:
the same output, tracebacks, recursion limits and stack safety."""

import textwrap
import unittest

from test.test_perf_profiler.util import (
    PerfTestCase)


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


if __name__ == "__main__":
    unittest.main()
