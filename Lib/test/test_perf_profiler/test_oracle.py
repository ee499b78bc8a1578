"""The stack oracle: perf shows each sample's true Python stack.

The workloads (oracle.py) call leaf functions in every shape a program
gives its stack -- nested calls, exceptions, generators, coroutines,
threads, activation with threads running, fork and C-level fork, pools,
a pre-fork server, exec, subprocesses, deep recursion; and Debian's
gunicorn with its workers.  Each leaf records the qualified names of its
frames as the program itself sees them (sys._getframe()) and the
interval it then spins in, by pid and thread.  perf records the shapes
in one session per route, gunicorn (which takes its process over) in one
of its own:

* frame pointers: -X perf, perf record -g, on sys.executable;
* DWARF: -X perf_jit, perf record --call-graph dwarf, perf inject --jit,
  on the build without frame pointers (PERF_NOFP_PYTHON);
* the same with Debian's python3.11 and perftramp311 (make ext's venv,
  or PERF_EXT_PYTHON), switched on by PYTHONPERFSUPPORT=1.

Every sample taken in a thread while its leaf spins must show exactly
the recorded chain: no frame missing, none invented, none misnamed.  As
far as they go, two kinds are right too: those cut short by a route's
bound (the kernel's on the length of a chain, the DWARF route's copy of
the stack), and in shapes deeper than a thread's C stack room for
trampolines (DEEP), those that show its innermost frames as one UNNAMED
frame and the rest truly.
"""

import collections
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import unittest

from test.test_perf_profiler import jitlib, oracle
from test.test_perf_profiler.util import (
    DIST_PACKAGES, NOFP_ONCE, TIMED_FIELDS, TIMEOUT, ProfilerFiles,
    clean_env, needs_host, once_per_run, parse_perf_script,
    perf_record_works, record_samples, skip_environment, tmp_files_lock)

ORACLE = os.path.abspath(oracle.__file__)

# The shapes (oracle.py), in the order they run.
SHAPES = ["calls", "exceptions", "generators", "coroutines", "threads",
          "activation", "fork", "fork_nocopy", "pool_fork",
          "pool_forkserver", "pool_spawn", "server", "cfork", "cfork_exec",
          "exec", "subprocess", "recursion", "recursion_thread"]
# Those whose samples are taken in a process started with exec.
EXEC_SHAPES = {"pool_forkserver", "pool_spawn", "cfork_exec", "exec",
               "subprocess"}

# What the gunicorn shape runs: Debian's gunicorn, pure Python, imported
# from there by any 3.11.
GUNICORN = os.path.join(DIST_PACKAGES, "gunicorn")


def gunicorn_missing():
    """Why the gunicorn shape cannot run here, or None."""
    if not os.path.isdir(GUNICORN):
        return (f"Debian's gunicorn is not installed ({GUNICORN}: "
                "python3-gunicorn, tools/install-deps.sh test)")
    return None


# Samples each shape must have had checked to prove anything.
MIN_SAMPLES = 50

# The frame-pointer route: the kernel's bound on a call chain's length
# (kernel.perf_event_max_stack) cuts deep stacks; such a sample is
# checked as far as it goes.
try:
    with open("/proc/sys/kernel/perf_event_max_stack") as f:
        MAX_STACK = int(f.read())
except OSError:
    MAX_STACK = 127

# The DWARF route copies this much stack per sample: perf unwinds no
# frame above it (see DwarfOracleTests).
STACK_DUMP = 16384

# What perf names the frames a thread runs once its C stack room for
# trampolines is used up (Python/perf_trampoline.c, the unnamed
# trampoline), as python_frames() gives it.
UNNAMED = "[deeper frames, beyond the C stack room]"
# The shapes that use the room up by design: their samples that name the
# outer part of the chain truly and the rest UNNAMED count as right.
DEEP = {"recursion_thread"}


class Checked:
    """One shape's samples: exact, cut short (a true innermost part of
    the chain, where the route's bound cut the stack), or mismatched;
    apart from those, samples whose frame-pointer walk stopped before
    any Python frame (in a library built without frame pointers)."""

    def __init__(self):
        self.exact = 0
        self.unwalked = collections.Counter()   # where the walk ended
        self.cut = collections.Counter()        # frames seen -> samples
        self.unnamed = 0        # true but for the innermost, UNNAMED
        self.mismatches = collections.Counter()  # describe() -> samples
        self.pids = set()       # processes with samples checked

    @property
    def total(self):
        return self.exact + sum(self.cut.values()) + self.unnamed + sum(
            self.mismatches.values())

    def report(self, route, shape):
        lines = [f"oracle {route} {shape}: {self.total} samples "
                 f"({len(self.pids)} processes), "
                 f"{self.exact} exact, {sum(self.cut.values())} cut short, "
                 f"{self.unnamed} unnamed past the C stack room, "
                 f"{sum(self.mismatches.values())} wrong"]
        for where, count in self.unwalked.most_common():
            lines.append(f"  left out: {count} whose walk stopped in "
                         f"{where}, before any Python frame")
        for depth, count in sorted(self.cut.items()):
            lines.append(f"  cut short to {depth} Python frames: {count}")
        for mismatch, count in self.mismatches.most_common():
            lines.append(f"  {count} x {mismatch}")
        return "\n".join(lines)


def describe(chain, seen, context=6):
    """A mismatch: both chains (innermost first), around where they first
    differ in long ones."""
    first = next((i for i, (a, b) in enumerate(zip(chain, seen)) if a != b),
                 min(len(chain), len(seen)))
    start = max(0, first - context)

    def part(names):
        shown = list(names[start:first + context])
        return (f"{'... ' if start else ''}{shown}"
                f"{' ...' if len(names) > first + context else ''}")

    return (f"(first difference at frame {first})\n"
            f"    true: {part(chain)}\n    perf: {part(seen)}")


def read_records(directory):
    """The leaves' records: {(pid, tid): [(start, end, shape, chain)]}."""
    records = collections.defaultdict(list)
    for name in os.listdir(directory):
        if name.endswith(".jsonl"):
            with open(os.path.join(directory, name)) as f:
                for line in f:
                    r = json.loads(line)
                    records[r["pid"], r["tid"]].append(
                        (r["start"], r["end"], r["shape"], tuple(r["chain"])))
    return records


# Where a frame-pointer walk that reached no Python frame may have
# stopped legitimately: not in the interpreter's evaluator (whose frame
# records lead on to the trampolines), nor at an unnamed address.
BROKEN_WALK_ENDS = ("_PyEval_EvalFrameDefault", "[unknown]")


def stopped_outside(sample):
    """Where `sample`'s walk stopped, if it stopped before any Python
    frame in a function other than BROKEN_WALK_ENDS; else None."""
    if not sample.frames or any(frame.startswith("py::")
                                for frame in sample.frames):
        return None
    last = sample.frames[-1]
    return None if last in BROKEN_WALK_ENDS else last


def named_past_room(seen, chain):
    """Whether `seen` is UNNAMED standing for the innermost frames of
    `chain`, then its next frames outwards, truly (as far as they go)."""
    named = seen[1:]
    return (len(seen) > 1 and seen[0] == UNNAMED
            and any(chain[k:k + len(named)] == named
                    for k in range(1, len(chain) - len(named) + 1)))


def check(samples, records, route):
    """{shape: Checked} for the samples taken while a leaf spun.
    route.cut_short(sample, seen, chain) says whether `seen`, a true
    innermost part of `chain`, was cut by the route's bound;
    route.unwalked(sample) where a walk that can be left out stopped."""
    results = collections.defaultdict(Checked)
    for sample in samples:
        pid, tid, when = sample.origin()
        for start, end, shape, chain in records.get((pid, tid), ()):
            if start <= when <= end:
                break
        else:
            continue
        seen = tuple(sample.python_frames())
        result = results[shape]
        where = route.unwalked(sample)
        if where is not None:
            result.unwalked[where] += 1
            continue
        result.pids.add(pid)
        if seen == chain:
            result.exact += 1
        elif (seen and seen == chain[:len(seen)]
              and route.cut_short(sample, seen, chain)):
            result.cut[len(seen)] += 1
        elif shape in DEEP and named_past_room(seen, chain):
            result.unnamed += 1
        else:
            result.mismatches[describe(chain, seen) + (
                "" if seen else f"\n    walk: {list(sample.frames)}")] += 1
    return results


class OracleRun:
    """Mixin: run every shape under perf once for the class, then check
    one shape per test."""

    ROUTE = None
    SHAPES = SHAPES
    # The share of a shape's samples that must be exact.
    THRESHOLD = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.enterClassContext(tmp_files_lock())
        cls.tmpdir = os.path.realpath(tempfile.mkdtemp(prefix="perforacle-"))
        cls.addClassCleanup(shutil.rmtree, cls.tmpdir, ignore_errors=True)
        cls.files = ProfilerFiles(markers=[ORACLE])
        cls.addClassCleanup(cls.files.cleanup)
        out = os.path.join(cls.tmpdir, "records")
        os.mkdir(out)
        samples = []
        for number, (args, changes) in enumerate(cls.sessions()):
            directory = os.path.join(cls.tmpdir, f"session{number}")
            os.mkdir(directory)
            env = clean_env(**{**cls.ORACLE_ENV, **changes,
                               "ORACLE_OUT": out,
                               "ORACLE_SITE": DIST_PACKAGES})
            proc, more = cls.record([*args], env, directory)
            samples += more
            for pid in {s.origin()[0] for s in more}:
                cls.claim(pid)
            if proc.returncode != 0:
                raise AssertionError(f"{' '.join(proc.args)} failed "
                                     f"({proc.returncode}):\n{proc.stderr}")
        records = read_records(out)
        for pid, _ in records:
            cls.claim(pid)
        cls.results = check(samples, records, cls)

    @classmethod
    def sessions(cls):
        """(command, environment changes) of each perf session."""
        sessions = [([*cls.COMMAND, ORACLE, *cls.SHAPES], {})]
        if not gunicorn_missing():
            sessions.append(([*cls.COMMAND, ORACLE, "gunicorn"], {}))
        return sessions

    @classmethod
    def claim(cls, pid):
        cls.files.add_pid(pid)

    def check_shape(self, shape):
        result = self.results.get(shape, Checked())
        report = result.report(self.ROUTE, shape)
        print(report, file=sys.stderr, flush=True)
        self.assertGreaterEqual(result.total, MIN_SAMPLES, report)
        exact = (result.exact + self.counted_cut(shape, result)
                 + result.unnamed)
        self.assertGreaterEqual(exact, self.THRESHOLD * result.total, report)
        return result

    def test_gunicorn(self):
        reason = gunicorn_missing()
        if reason:
            skip_environment(reason)
        result = self.check_shape("gunicorn")
        # The first two workers, and one forked while perf recorded.
        self.assertGreaterEqual(len(result.pids), 3,
                                result.report(self.ROUTE, "gunicorn"))

    def counted_cut(self, shape, result):
        """How many of the samples cut short count as exact."""
        return 0


def add_shape_tests(cls):
    """A test per shape in cls.TESTED (default: cls.SHAPES)."""
    for shape in getattr(cls, "TESTED", cls.SHAPES):
        def test(self, shape=shape):
            self.check_shape(shape)
        setattr(cls, f"test_{shape}", test)
    return cls




@needs_host("perf")
@add_shape_tests
class FramePointerOracleTests(OracleRun, unittest.TestCase):
    """-X perf, perf record -g."""

    ROUTE = "fp"
    THRESHOLD = 0.99
    COMMAND = [sys.executable, "-X", "perf"]
    ORACLE_ENV = {"ORACLE_ENABLE": "PYTHONPERFSUPPORT=1",
                  "ORACLE_BACKEND": "perf"}

    @classmethod
    def record(cls, args, env, directory):
        reason = perf_record_works()
        if reason:
            skip_environment(reason)
        return record_samples(args, directory, env=env,
                              options=("-k", "1"), fields=TIMED_FIELDS,
                              timeout=4 * TIMEOUT)

    @staticmethod
    def cut_short(sample, seen, chain):
        # The kernel stopped at its bound, which counts the context
        # markers perf script does not print.
        return len(sample.frames) >= MAX_STACK - 2

    unwalked = staticmethod(stopped_outside)

    def counted_cut(self, shape, result):
        # Only the kernel cut these: they are right as far as they go.
        return sum(result.cut.values())


class DwarfRoute(OracleRun):
    """perf record --call-graph dwarf, perf inject --jit.

    Activation runs in a session of its own, in the process perf
    starts.  The leaves spin half as long: perf script
    takes minutes for a few thousand samples with DWARF call chains.

    Measured (2 cores, busy): 99.0-100% of the samples of each shape that
    fits in STACK_DUMP exact, here and with perftramp311 (96.3% in runs
    on a busier machine); the others showed no frame at all (taken in
    the vDSO's system call for the leaf's CPU clock, where perf's
    unwinder stops).  Hence THRESHOLD.
    """

    THRESHOLD = 0.95
    SHAPES = [shape for shape in SHAPES if shape != "activation"]
    TESTED = [*SHAPES, "activation"]
    # Samples a true innermost part of whose chain counts: stacks deeper
    # than STACK_DUMP by design.
    CUT = {"recursion"}
    # What the activation session's environment changes.
    ACTIVATION_ENV = {}

    @classmethod
    def sessions(cls):
        return [*super().sessions(),
                ([*cls.COMMAND[:1], ORACLE, "activation_child"],
                 {"ORACLE_SHAPE": "activation", **cls.ACTIVATION_ENV})]

    @classmethod
    def record(cls, args, env, directory):
        reason = jitlib.perf_jit_skip_reason()
        if reason:
            skip_environment(reason)
        record, inject, script = jitlib.record_jit(
            args, directory, env=env, stack_dump=STACK_DUMP,
            fields=TIMED_FIELDS)
        last = script or inject or record
        if last.returncode != 0:
            return last, []
        return last, parse_perf_script(script.stdout)

    @classmethod
    def claim(cls, pid):
        super().claim(pid)
        cls.addClassCleanup(cls.remove_jitted, pid)

    @staticmethod
    def remove_jitted(pid):
        for path in jitlib.jitted_files(pid):
            os.unlink(path)

    @staticmethod
    def cut_short(sample, seen, chain):
        return True

    def counted_cut(self, shape, result):
        return sum(result.cut.values()) if shape in self.CUT else 0

    @staticmethod
    def unwalked(sample):
        # DWARF unwinds through libraries without frame pointers.
        return None


@needs_host("perf")
@NOFP_ONCE
@add_shape_tests
class DwarfOracleTests(DwarfRoute, unittest.TestCase):
    """-X perf_jit on the build without frame pointers."""

    ROUTE = "dwarf"
    # perf (6.1 and 6.12 alike) unwinds no frame above the first in a
    # process that a recorded one started with exec where both map the
    # same shared libpython, as this build does, at different addresses
    # (the same under setarch -R); Debian's python3.11 links it in
    # (ExtensionOracleTests runs these shapes).
    SHAPES = [shape for shape in DwarfRoute.SHAPES
              if shape not in EXEC_SHAPES]
    TESTED = [*SHAPES, "activation"]
    COMMAND = [jitlib.NOFP_PYTHON, "-X", "perf_jit"]
    ORACLE_ENV = {"ORACLE_ENABLE": "PYTHON_PERF_JIT_SUPPORT=1",
                  "ORACLE_BACKEND": "perf_jit", "ORACLE_SPIN": "0.1"}


# perftramp311 (make ext) in a venv of Debian's python3.11.
EXT_PYTHON = os.environ.get("PERF_EXT_PYTHON") or os.path.join(
    os.path.dirname(os.path.dirname(sysconfig.get_config_var("srcdir"))),
    "build", "ext", "venv-debian", "bin", "python")


@needs_host("perf")
@once_per_run("it profiles Debian's python3.11 with perftramp311")
@add_shape_tests
class ExtensionOracleTests(DwarfRoute, unittest.TestCase):
    """Stock 3.11 with perftramp311, switched on by PYTHONPERFSUPPORT=1
    everywhere (it has no -X options)."""

    ROUTE = "ext"
    # No -X perf_fork_copy; and its C stack guard ends recursion_thread
    # with a RecursionError, as documented.
    SHAPES = [shape for shape in DwarfRoute.SHAPES
              if shape not in {"fork_nocopy", "recursion_thread"}]
    TESTED = [*SHAPES, "activation"]
    ACTIVATION_ENV = {"PYTHONPERFSUPPORT": None}
    COMMAND = [EXT_PYTHON]
    ORACLE_ENV = {"ORACLE_ENABLE": "PYTHONPERFSUPPORT=1",
                  "PYTHONPERFSUPPORT": "1",
                  "ORACLE_BACKEND": "perf_jit", "ORACLE_SPIN": "0.1"}

    @classmethod
    def record(cls, args, env, directory):
        if not os.path.exists(EXT_PYTHON):
            skip_environment(f"perftramp311 is not built for Debian's "
                             f"python3.11 ({EXT_PYTHON}: make ext)")
        return super().record(args, env, directory)


if __name__ == "__main__":
    unittest.main()
