"""perf itself, end to end: perf record -g names every Python frame in
order, with the C frames between them where C calls Python."""

import os
import signal
import sys
import textwrap
import unittest

from test.test_perf_profiler.util import (
    INLINED_CALLS, PYTHON_FRAME_RECORDS, PerfTestCase, needs_host,
    perf_record_works, record_samples, skip_environment, write_script)

EVAL = "_PyEval_EvalFrameDefault"


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
        for pid in {s.pid for s in samples} - {None}:
            self.files.add_pid(pid)
        return path, samples

    def assertChains(self, samples, path, expected, between=None,
                     resumed=()):
        """Check samples in `expected[0]`: their py:: frames of `path` are
        `expected` (innermost first) and, in most, consecutive Python
        frames are separated by nothing where the caller runs the callee
        inline (INLINED_CALLS: its frame record names the callee), else
        by exactly one evaluator frame, as are a generator and the frame
        that resumed it (the pairs in `resumed`); for the pairs in
        `between`, by a chain through that C function.  With
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
                elif k in resumed or not INLINED_CALLS:
                    ok = ok and gap == [EVAL]
                else:
                    ok = ok and gap == []
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
                          ["leaf", "middle", "top", "<module>"],
                          resumed={0, 1})

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
                          between={2: "gen_send"}, resumed={0, 1})

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

    # spin() appends the stack it runs on (pid, then qualified names,
    # innermost first) to stacks.txt; child_only and parent_only are made
    # on either side of the fork, in this file.
    FORK = """\
        import os, sys, time
        def spin(t):
            names = []
            frame = sys._getframe()
            while frame is not None:
                names.append(frame.f_code.co_qualname)
                frame = frame.f_back
            with open("stacks.txt", "a") as f:
                print(os.getpid(), *names, file=f)
            end = time.process_time() + t
            while time.process_time() < end:
                pass
        def run(name):
            exec(compile(f"def {name}(): spin(0.4)\\n{name}()", __file__,
                         "exec"))
        spin(0.01)
        if os.fork() == 0:
            run("child_only")
            os._exit(0)
        os.wait()
        run("parent_only")
        """

    def test_forked_child_chain(self):
        # perf names what a child inherited from the parent's map, where
        # the parent goes on naming the arena's free slots: the child's
        # new trampolines must be in memory of its own, named by its map.
        for copy in ("1", "0"):
            with self.subTest(perf_fork_copy=copy):
                path, samples = self.record(
                    self.FORK, ["-X", "perf", "-X", f"perf_fork_copy={copy}"])
                seen = {}
                with open(f"{self.tmpdir}/stacks.txt") as f:
                    for line in f:
                        pid, *names = line.split()
                        seen.setdefault(int(pid), []).append(names)
                os.unlink(f"{self.tmpdir}/stacks.txt")
                child = next(pid for pid, stacks in seen.items()
                             if "child_only" in stacks[0])
                for pid, stacks in seen.items():
                    hits = [s for s in samples
                            if s.pid == pid
                            and s.python_frames(path)[:1] == ["spin"]]
                    self.assertGreaterEqual(
                        len(hits), 20, f"few samples of {pid} in spin")
                    # Each chain is one the process saw itself (a sample
                    # taken while a trampoline sets up its frame may lose
                    # a frame: most, not all).
                    good = sum(s.python_frames(path) in stacks
                               for s in hits)
                    self.assertGreaterEqual(
                        good, len(hits) // 2,
                        f"{good} of {len(hits)} samples of {pid} show "
                        f"{stacks}:\n" + "\n".join(map(str, hits[:3])))
                for sample in samples:
                    if sample.pid == child:
                        self.assertNotIn(f"py::parent_only:{path}",
                                         sample.frames)


if __name__ == "__main__":
    unittest.main()
