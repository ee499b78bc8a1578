"""perf's frame-pointer unwinding, done by hand, on x86_64 and aarch64.

perf record -g takes the sampled pc, then follows the chain of frame
records from the frame pointer (rbp on x86_64, x29 on aarch64): each
record holds the caller's frame pointer and a return address.  These
tests stop the interpreter in a C function called from a deep Python
call, walk that chain the same way from the registers and memory gdb
reads, and resolve every address through /tmp/perf-PID.map: the Python
functions must come out innermost first.

Natively, gdb runs the interpreter.  Under qemu-user (make test's aarch64
run, where perf cannot follow the emulated process) the interpreter waits
for gdb-multiarch on qemu's gdbstub.  On both, gdb's own "bt" through the
trampolines' JIT images must reach main.
"""

import os
import platform
import re
import shutil
import socket
import subprocess
import sys
import textwrap
import unittest
from typing import NamedTuple

from test.support import import_helper
from test.test_perf_profiler.util import (
    GDB_FRAME_RE, GDB_OPTIONS, INLINED_CALLS, PYTHON_FRAME_RECORDS, TIMEOUT,
    PerfTestCase, clean_env, read_map, skip_environment, under_qemu,
    write_script)

# The C function to stop in: os.getppid(), which nothing else calls.
BREAKPOINT = "os_getppid"
SCRIPT = """\
    import os

    def level3():
        return os.getppid()

    def level2():
        return level3()

    def level1():
        return level2()

    level1()
    """

# Frames that the eval-frame entry starts, not a CALL instruction: a
# generator resumed by next(), a function called from C by map().
SCRIPT_FROM_C = """\
    import os

    def numbers():
        yield os.getppid()

    def first(_):
        return next(numbers())

    def level1():
        return list(map(first, [0]))

    level1()
    """

# Deeper than the frame records one evaluator entry holds
# (_PyEval_EvalFrameDefault enters itself again, through the trampoline).
SCRIPT_DEEP = """\
    import os

    def down(n):
        if n == 0:
            return os.getppid()
        return down(n - 1)

    down(20)
    """

# Inlined frames left every way but a return before the stop: by an
# exception, by making a generator, with perf switched off and on in
# between (a call run inline while off has no record).  The chain must
# hold exactly the frames still running.
SCRIPT_LEFT = """\
    import os, sys

    def fails(n):
        if n == 0:
            raise ValueError
        fails(n - 1)

    def numbers():
        yield 1

    def off_and_on():
        sys.deactivate_stack_trampoline()
        inner()
        sys.activate_stack_trampoline("perf")
        return inner()

    def inner():
        return 1

    def final():
        return os.getppid()

    def level1():
        try:
            fails(12)
        except ValueError:
            pass
        list(numbers())
        off_and_on()
        return final()

    level1()
    """

# After the walk the script runs to its end: the map lines of new
# functions wait in memory (Python/perf_map.c), and a process that exits
# writes them, where one that is killed (gdb's "kill") may not.
CONTINUE = "continue"

FRAME_POINTER = {"x86_64": "$rbp", "aarch64": "$x29"}
# The bits of a return address that are the address: on aarch64, the
# kernel strips the pointer authentication code (PAC) that paciasp put in
# the saved x30 from each address of a perf callchain; so does the walk.
ADDRESS_MASK = {"x86_64": (1 << 64) - 1, "aarch64": (1 << 48) - 1}

# Run by gdb at the breakpoint: the pc, then each frame record's return
# address, as perf's frame-pointer unwinder collects them, and where the
# record is.  Callers' frames are at higher addresses: the walk stops at a
# null, a downward or an unreadable frame pointer.
WALK = """\
import struct
inferior = gdb.selected_inferior()
print("PID", inferior.pid)
print("TID", gdb.selected_thread().ptid[1])
print("IP", int(gdb.parse_and_eval("$pc")))
fp = int(gdb.parse_and_eval("{fp}"))
for _ in range(10000):
    try:
        next_fp, ret = struct.unpack("<QQ", inferior.read_memory(fp, 16))
    except gdb.MemoryError:
        break
    print("IP", ret & {mask}, fp)
    if next_fp <= fp:
        break
    fp = next_fp
"""


class Walk(NamedTuple):
    """One stop's walk, as WALK printed it."""
    tid: int
    # (pc, None), then (return address, record address) of each record.
    records: list


def walks(output):
    """The walks in gdb's output, in the order they were made."""
    found = []
    for line in output.splitlines():
        word, *numbers = line.split()[:3] or [""]
        if word == "TID":
            found.append(Walk(int(numbers[0]), []))
        elif word == "IP":
            found[-1].records.append((int(numbers[0]), *(
                map(int, numbers[1:]) if len(numbers) > 1 else [None])))
    return found


def named(records, entries):
    """(map entry, record address) of each walked address a trampoline
    of `entries` holds, innermost first."""
    for address, record in records:
        for entry in entries:
            if entry.start <= address < entry.start + entry.size:
                yield entry, record
                break


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FramePointerWalk(PerfTestCase):
    """Stop the interpreter under gdb and walk its frame records."""

    def setUp(self):
        super().setUp()
        machine = platform.machine()
        if machine not in FRAME_POINTER:
            self.skipTest(f"no frame-record layout known for {machine}")
        self.gdb = shutil.which("gdb-multiarch" if under_qemu() else "gdb")
        if self.gdb is None:
            skip_environment("gdb-multiarch (tools/install-deps.sh aarch64)"
                             if under_qemu() else "gdb is not installed")
        self.script = write_script(self.tmpdir, SCRIPT)
        self.walk = write_script(
            self.tmpdir, WALK.format(fp=FRAME_POINTER[machine],
                                     mask=ADDRESS_MASK[machine]),
            "walk.py")

    def gdb_commands(self, *commands):
        return [self.gdb, *GDB_OPTIONS,
                *(arg for command in commands for arg in ("-ex", command))]

    def run_gdb(self, before, after, args=None, env=None, cpu=None):
        """Run `sys.executable -X perf args` (default: the script) under
        gdb: its commands `before`, the interpreter started, `after`;
        return (the interpreter's pid, gdb's output).  Under qemu, the CPU
        model may be given."""
        args = [sys.executable, "-X", "perf", *(args or [self.script])]
        env = env or clean_env()
        if under_qemu():
            return self.run_under_qemu(before, after, args, env, cpu)
        proc = subprocess.run(
            [*self.gdb_commands(*before, "run", *after), "--args", *args],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="backslashreplace", env=env, timeout=TIMEOUT)
        pids = {int(line.split()[1]) for line in proc.stdout.splitlines()
                if line.startswith("PID ")}
        self.assertEqual(len(pids), 1, proc.stdout)
        return pids.pop(), proc.stdout

    def run_under_qemu(self, before, after, args, env, cpu):
        """qemu (sys.executable is its wrapper, tools/build-aarch64.sh)
        starts the interpreter stopped, waiting on its gdbstub."""
        port = free_port()
        target = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=dict(env, QEMU_GDB=str(port),
                     **({"PERF_QEMU_CPU": cpu} if cpu else {})),
            cwd=self.tmpdir)
        self.files.add_pid(target.pid)
        self.addCleanup(target.wait, TIMEOUT)
        self.addCleanup(target.kill)
        # The binary qemu runs, for gdb's symbols: qemu answers
        # /proc/self/exe with it.
        binary = os.path.realpath("/proc/self/exe")
        proc = subprocess.run(
            [*self.gdb_commands(
                "set sysroot /usr/aarch64-linux-gnu",
                # qemu may not listen yet: gdb retries until then.
                f"set tcp connect-timeout {int(TIMEOUT)}",
                f"target remote 127.0.0.1:{port}",
                *before, "continue", *after), binary],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
            errors="backslashreplace", env=clean_env(), timeout=TIMEOUT)
        return target.pid, proc.stdout

    def walk_to_python(self, extra=(), qemu_cpu=None):
        """Stop in BREAKPOINT, walk the frame records; return (the Python
        functions of the script in the chain, innermost first, gdb's
        output).  Under qemu, the CPU model may be given."""
        frames, output = self.walk_records(extra, qemu_cpu)
        return [name for name, _ in frames], output

    def walk_records(self, extra=(), qemu_cpu=None):
        """As walk_to_python(), with the address of the frame record that
        names each function: [(name, address)], innermost first."""
        pid, output = self.run_gdb(
            [f"break {BREAKPOINT}"], [f"source {self.walk}", *extra, CONTINUE],
            cpu=qemu_cpu)
        self.files.add_pid(pid)
        self.assertIn("Breakpoint 1, ", output)
        walk, = walks(output)
        self.assertGreater(len(walk.records), 1, output)
        return [(entry.qualname, record)
                for entry, record in named(walk.records, read_map(pid))
                if entry.filename == self.script], output


class FramePointerWalkTests(FramePointerWalk):

    def test_frame_records_reach_every_python_function(self):
        names, output = self.walk_to_python()
        self.assertEqual(names, ["level3", "level2", "level1", "<module>"],
                         output)

    def test_frame_records_through_generators_and_calls_from_c(self):
        self.script = write_script(self.tmpdir, SCRIPT_FROM_C, "from_c.py")
        names, output = self.walk_to_python()
        self.assertEqual(names, ["numbers", "first", "level1", "<module>"],
                         output)

    def test_frame_records_deeper_than_an_evaluator_entry(self):
        self.script = write_script(self.tmpdir, SCRIPT_DEEP, "deep.py")
        names, output = self.walk_to_python()
        self.assertEqual(names, ["down"] * 21 + ["<module>"], output)

    def test_frame_records_of_frames_left(self):
        self.script = write_script(self.tmpdir, SCRIPT_LEFT, "left.py")
        names, output = self.walk_to_python()
        self.assertEqual(names, ["final", "level1", "<module>"], output)

    @unittest.skipUnless(INLINED_CALLS, "every Python call enters the "
                         "evaluator through its trampoline in this build")
    def test_calls_run_inline_under_the_trampoline(self):
        # The evaluator runs level1-3 inline, each named by a record right
        # below its caller's, only if it knew that <module>'s trampoline
        # called it: the address it returns to must be the one the
        # trampoline left below its frame record.  On arm64 the evaluator
        # signs its return address (qemu's "max" CPU has PAC), and the
        # comparison must leave the code out.  Otherwise each call enters
        # the evaluator again: records far apart, or none.
        frames, output = self.walk_records()
        self.assertEqual([name for name, _ in frames],
                         ["level3", "level2", "level1", "<module>"], output)
        innermost = frames[0][1]
        self.assertEqual([record - innermost for _, record in frames],
                         [0, 16, 32, 48], output)

    def test_gdb_backtrace_reaches_main(self):
        # gdb reads the trampolines' unwind rules from the JIT images the
        # interpreter registered (Python/perf_gdb_jit.c).  main() is a
        # tail call of Py_BytesMain(): it has no frame of its own.
        # qemu 7.2's gdbstub does not give gdb the PAC mask, without which
        # gdb cannot strip signed return addresses (of any frame): under
        # qemu, gdb's backtrace runs on a CPU without PAC (BTI still on).
        names, output = self.walk_to_python(["bt"],
                                            qemu_cpu="max,pauth=off")
        frames = [match.group(2) for match in map(GDB_FRAME_RE.match,
                                                  output.splitlines())
                  if match]
        # gdb follows the call frame information, never frame records:
        # where level1, level2 and level3 run inline, it sees the one
        # evaluator entry stock 3.11 has.
        self.assertEqual(frames.count("py_trampoline"),
                         1 if INLINED_CALLS else 4, output)
        self.assertEqual(frames.count("_PyEval_EvalFrameDefault"),
                         1 if INLINED_CALLS else 4, output)
        self.assertIn("Py_BytesMain", frames, output)
        self.assertNotIn("??", frames[:frames.index("Py_BytesMain")], output)


class FrameRegister(NamedTuple):
    """How objdump shows one machine's frame pointer register at work."""
    setup: str              # the instruction that makes a frame record
    # Writes of the register that a frame record makes (its setup and
    # teardown) or the ABI's end of the chain (_start clears it).
    record_writes: re.Pattern
    any_write: re.Pattern   # an instruction that writes the register
    # How the evaluator moves the register to a record of an inlined call
    # and back (Python/ceval.c): a copy from another register, or one
    # record's size down or up.
    record_moves: re.Pattern


FRAME_REGISTER = {
    # AT&T syntax: the destination is the last operand.
    "x86_64": FrameRegister(
        "mov %rsp,%rbp",
        re.compile(r"mov %rsp,%rbp|pop %rbp|xor %ebp,%ebp"),
        re.compile(r"(?!push|cmp|test|bt)\S+ (.*,)?%(rbp|ebp|bp|bpl)"),
        re.compile(r"mov %r(\w+),%rbp|lea -?0x10\(%rbp\),%rbp")),
    # The destination is the first operand, except for stores and tests.
    "aarch64": FrameRegister(
        "mov x29, sp",
        re.compile(r"mov x29, sp|add x29, sp, #\w+|ldp x29, x30, \[sp.*"
                   r"|ldr x29, \[sp\], #\w+|mov x29, #0x0"),
        re.compile(r"(?!st|cmp|cmn|tst|ccm|cb|tb|prfm)\S+ [xw]29(,.*)?"),
        re.compile(r"mov x29, x\d+|(add|sub) x29, x29, #0x10")),
}


def code_file(symbol):
    """The file mapped into this process that holds `symbol`'s code: the
    executable, or the shared libpython."""
    ctypes = import_helper.import_module("ctypes")
    address = ctypes.cast(getattr(ctypes.pythonapi, symbol),
                          ctypes.c_void_p).value
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(maxsplit=5)
            start, end = (int(x, 16) for x in fields[0].split("-"))
            if start <= address < end and len(fields) == 6:
                return fields[5].strip()
    raise AssertionError(f"{symbol} at {address:#x} is in no mapped file")


@unittest.skipUnless(PYTHON_FRAME_RECORDS,
                     "built with frame records in every function")
class FrameRegisterTests(unittest.TestCase):
    """--with-frame-pointers=python: perf's walk steps over a C function
    between two frame records only if it leaves the register alone."""

    def test_only_frame_records_write_the_frame_pointer(self):
        from test.test_perf_profiler.jitlib import (
            HOST_MACHINE, disassemble_functions)
        register = FRAME_REGISTER.get(platform.machine())
        if register is None:
            self.skipTest(f"no frame register known for {platform.machine()}")
        functions = disassemble_functions(
            self, HOST_MACHINE, code_file("_PyEval_EvalFrameDefault"))
        evaluator = [text for name, code in functions
                     if name == "_PyEval_EvalFrameDefault"
                     for _, text in code]
        if INLINED_CALLS:
            # No frame record of its own (the trampoline's names it): the
            # register holds the records of the calls it runs inline.
            self.assertNotIn(register.setup, evaluator)
            self.assertTrue(any(map(register.record_moves.fullmatch,
                                    evaluator)))
        else:
            self.assertIn(register.setup, evaluator)
        writers = {}
        for name, code in functions:
            for _, insn in code:
                # The evaluator's cold part (PGO) is the evaluator too.
                if (register.any_write.fullmatch(insn)
                        and not register.record_writes.fullmatch(insn)
                        and not (INLINED_CALLS
                                 and name.partition(".")[0]
                                     == "_PyEval_EvalFrameDefault"
                                 and register.record_moves.fullmatch(insn))):
                    writers.setdefault(name, insn)
        self.assertEqual(writers, {})


# The stack oracle's shapes that keep to one process (oracle.py): their
# leaves stop in os.getppid() instead of spinning (ORACLE_STOP), and at
# each stop the walk must name exactly the chain the leaf took from
# sys._getframe().  test_oracle checks these shapes and the others with
# perf, natively; this also runs under qemu-user, whose gdbstub follows
# no fork (so the shapes with child processes are test_oracle's alone).
# Not recursion_thread: an open gap of issue 67 (test_oracle).
ORACLE_SHAPES = ["calls", "exceptions", "generators", "coroutines",
                 "threads", "recursion"]

# Run by gdb before the interpreter starts: a breakpoint that walks each
# time it is hit and lets the program go on.
WALK_AT_EACH_STOP = """\
def walk():
{walk}

class WalkingBreakpoint(gdb.Breakpoint):
    def stop(self):
        walk()
        return False

WalkingBreakpoint("{breakpoint}")
"""


class OracleWalkTests(FramePointerWalk):

    def test_oracle_shapes(self):
        from test.test_perf_profiler import oracle
        from test.test_perf_profiler.test_oracle import (
            describe, read_records)
        with open(self.walk) as f:
            walk = textwrap.indent(f.read(), "    ")
        walker = write_script(self.tmpdir, WALK_AT_EACH_STOP.format(
            walk=walk, breakpoint=BREAKPOINT), "walk_each.py")
        out = os.path.join(self.tmpdir, "records")
        os.mkdir(out)
        pid, output = self.run_gdb(
            [f"source {walker}"], [],
            args=[os.path.abspath(oracle.__file__), *ORACLE_SHAPES],
            env=clean_env(ORACLE_OUT=out, ORACLE_STOP="1", ORACLE_SPIN="0",
                          ORACLE_ENABLE="PYTHONPERFSUPPORT=1",
                          ORACLE_BACKEND="perf"))
        self.files.add_pid(pid)
        entries = read_map(pid)
        by_thread = {}
        for walk in walks(output):
            by_thread.setdefault(walk.tid, []).append(walk)
        checked = {shape: [] for shape in ORACLE_SHAPES}
        for (record_pid, tid), records in read_records(out).items():
            self.assertEqual(record_pid, pid)
            stops = by_thread.get(tid, [])
            self.assertEqual(len(stops), len(records), output[-3000:])
            for stop, (_, _, shape, chain) in zip(stops, records):
                seen = tuple(entry.qualname for entry, _ in
                             named(stop.records, entries))
                checked[shape].append((chain, seen))
        for shape, pairs in checked.items():
            with self.subTest(shape=shape):
                self.assertTrue(pairs, f"no leaf of {shape} stopped")
                wrong = [describe(chain, seen) for chain, seen in pairs
                         if seen != chain]
                self.assertEqual(wrong, [], f"{len(wrong)} of {len(pairs)} "
                                 f"walks of {shape} wrong")


if __name__ == "__main__":
    unittest.main()
