"""Helpers shared by the test_perf_profiler modules.

The API, in the order a test usually needs it:

* PerfTestCase: a TestCase base class.  Each test gets a fresh directory
  (self.tmpdir) and a snapshot of the profiler files in /tmp; files the
  test's processes created there are removed afterwards, nothing else.
  self.run_script(source, ...) writes a script into self.tmpdir, runs it
  in a fresh interpreter and returns a ScriptResult.
* ScriptResult: returncode, stdout, stderr, pid, path; map_entries(pid)
  and script_entries(pid) read and parse the perf map the run wrote.
* MapEntry, parse_map(), read_map(), map_path(), jitdump_path(): the perf
  map format ("START SIZE py::<qualname>:<filename>").
* clean_env(): the environment for a child interpreter, free of the
  perf switches this test run might have inherited.
* perf_record_works(), record_samples(), script_samples(),
  parse_perf_script(), Sample: run a command under "perf record -g" and
  read back its call chains (with TIMED_FIELDS: also each sample's thread
  and time).
* gdb_available(), gdb_backtrace(): frame names of a gdb "bt".
* skip_environment(): skip a test this machine cannot run -- or, where
  the tests are required (CI), fail it.
* needs_host(): mark a test that needs the host machine itself (perf,
  gdb or bpftrace on the interpreter, the host's extension modules): the
  run under qemu-user leaves it out.
* CHAIN_SOURCE, CHAIN, CHAIN_RESULT: nested functions for targets.
* assert_refused(): perf_trampoline refused its input in one line.
* PYTHON_FRAME_RECORDS: the interpreter keeps frame records on the
  Python call chain only.
* INLINED_CALLS: under -X perf, Python-to-Python calls run inline, named
  to perf by frame records (Python/ceval.c).
* ProfilerFiles: the snapshot/cleanup logic PerfTestCase uses, for tests
  that need it on its own.
* tmp_files_lock(): keeps PerfTestCase's tests and upstream's (which
  remove every new perf map in /tmp) from running at the same time.
"""

import contextlib
import fcntl
import functools
import glob
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import unittest
from typing import NamedTuple

from test import support

# Environment variables that switch trampolines on at startup.
PERF_ENV_VARS = ("PYTHONPERFSUPPORT", "PYTHON_PERF_JIT_SUPPORT",
                 "PYTHON_PERF_FORK_COPY")

# Debian's python3-* packages (tools/install-deps.sh test): pure Python,
# or built for its python3.11, whose ABI ours keeps.
DIST_PACKAGES = "/usr/lib/python3/dist-packages"

# One line of a perf map written by the interpreter: hex without "0x".
MAP_LINE_RE = re.compile(r"^([0-9a-f]+) ([0-9a-f]+) (py::.+)$")

# Built --with-frame-pointers=python: only the evaluator and the
# trampolines keep frame records, and nothing else writes the frame
# pointer register.
PYTHON_FRAME_RECORDS = sysconfig.get_config_var("FRAME_POINTERS") == "python"
# The evaluator owns the frame pointer register and keeps there a frame
# record per Python call it runs inline.
INLINED_CALLS = "-DPY_PERF_FRAME_RECORDS" in (
    sysconfig.get_config_var("PERF_EVAL_CFLAGS") or "").split()


# Source of outer() -> middle() -> inner(3000), whose samples tests look
# for (CHAIN, innermost first); outer() returns CHAIN_RESULT.
CHAIN_SOURCE = """\
def inner(n):
    total = 0
    for i in range(n):
        total += i
    return total

def middle():
    return inner(3000)

def outer():
    return middle()
"""
CHAIN = ["inner", "middle", "outer"]
CHAIN_RESULT = 4498500


# ----------------------------------------------------------------------
# Skips

def tests_required():
    """True where no test may be skipped for want of perf, gdb, ptrace,
    mounts, cross tools or pyenv: CI=true or PERF_TESTS_REQUIRED=1.  CI
    must prove the product works, not skip the proof."""
    return (os.environ.get("CI", "").lower() == "true"
            or os.environ.get("PERF_TESTS_REQUIRED") == "1")


def assert_refused(test, result, message):
    """`result` (a CompletedProcess of perf_trampoline) refused its input
    as the tool refuses everything: exit status 2, nothing on stdout, one
    line on stderr that names `message`."""
    test.assertEqual(result.returncode, 2, result.stderr)
    test.assertEqual(result.stdout, "")
    test.assertTrue(result.stderr.startswith("perf_trampoline: "),
                    result.stderr)
    test.assertEqual(result.stderr.count("\n"), 1, result.stderr)
    test.assertIn(message, result.stderr)


def skip_environment(reason):
    """Skip the running test (or class, from setUpClass) because this
    machine lacks something it needs, saying what; fail it instead where
    tests_required()."""
    if tests_required():
        raise AssertionError("required here (CI=true or "
                             f"PERF_TESTS_REQUIRED=1), but {reason}")
    raise unittest.SkipTest(reason)


def pyenv_root():
    """pyenv's root as `pyenv root` finds it: $PYENV_ROOT, else
    ~/.pyenv (upstream's releases, stock 3.11.x builds)."""
    return os.environ.get("PYENV_ROOT") or os.path.expanduser("~/.pyenv")


# ----------------------------------------------------------------------
# qemu-user

def under_qemu():
    """True in make test's aarch64 run (tools/run_tests.py --qemu)."""
    return bool(os.environ.get("PERF_TESTS_QEMU"))


# Seconds any single child process may take before the test fails
# (qemu-user runs the interpreter several times slower).
TIMEOUT = support.SHORT_TIMEOUT * (4 if under_qemu() else 1)


def target_command(args):
    """`args`, a program built for this interpreter's machine and its
    arguments, as a command that runs it here: under qemu-user, through
    the tree's run-qemu (tools/build-aarch64.sh)."""
    if under_qemu():
        return [os.environ["PERF_TESTS_QEMU"], *args]
    return list(args)


def needs_host(*what):
    """Decorator for a test method or class that needs the host machine
    itself: perf, gdb or bpftrace following the interpreter (they would
    see qemu, not the emulated process), or the host's own binaries.  The
    run under qemu-user leaves such tests out (tools/unit_counts.py
    --without-host-tools); the native runs hold them."""
    def mark(obj):
        obj.perf_needs_host = what
        return obj
    return mark


def once_per_run(why):
    """Decorator for a test method or class whose outcome does not depend
    on the interpreter under test (it tests another: the build without
    frame pointers, the extension's venv), or that needs only one of
    make test's native trees, `why` saying which.  make test runs it with
    its first tree; the later ones leave it out (tools/unit_counts.py
    --after-first-tree)."""
    def mark(obj):
        obj.perf_once = why
        return obj
    return mark


# Cases that test the build without frame pointers (PERF_NOFP_PYTHON),
# whichever tree make test runs them with: its first one only.
NOFP_ONCE = once_per_run("it tests the build without frame pointers "
                         "(PERF_NOFP_PYTHON)")


def host_tool(name):
    """Called where a helper is about to run `name` on the interpreter
    under test: under qemu-user, the test should have been marked
    needs_host, and fails saying so."""
    if under_qemu():
        raise AssertionError(f"this test runs {name} on the interpreter, "
                             "which cannot follow an interpreter under "
                             f"qemu-user: mark it needs_host({name!r})")


# ----------------------------------------------------------------------
# The perf map

class MapEntry(NamedTuple):
    """One line of a perf map."""
    start: int          # address of the trampoline
    size: int           # its size in bytes
    symbol: str         # "py::<qualname>:<filename>"

    @property
    def qualname(self):
        """The code object's qualified name, as written (escaped)."""
        return self.symbol[4:].partition(":")[0]

    @property
    def filename(self):
        """The code object's file name, as written (escaped)."""
        return self.symbol[4:].partition(":")[2]


def map_path(pid):
    """Path of the perf map of process `pid`."""
    return f"/tmp/perf-{pid}.map"


def map_written_since(pid, since, path_func=None):
    """True if /tmp/perf-<pid>.map (or path_func(pid)) was written at or
    after `since` (a time.time() value).  Maps are never removed, so an
    older file belongs to an earlier process that had the same pid."""
    try:
        mtime = os.stat((path_func or map_path)(pid)).st_mtime
    except FileNotFoundError:
        return False
    # Allow for the coarse clock file times come from.
    return mtime >= since - 0.05


def jitdump_path(pid):
    """Path of the jitdump of process `pid`."""
    return f"/tmp/jit-{pid}.dump"


def parse_map(text):
    """Parse the text of a perf map into a list of MapEntry, in file order.

    Lines are appended whole, each with one write (Python/perf_map.c): a
    reader that copies a running process's map may catch the last one
    being written, without its newline yet, and leaves it out, as readers
    do.  Raises ValueError on a NUL byte anywhere, and naming the first
    other line that is not exactly "<hex> <hex> py::<name>".
    """
    if "\0" in text:
        raise ValueError(f"NUL in the perf map at {text.index(chr(0))}")
    *lines, rest = text.split("\n")
    entries = []
    for number, line in enumerate(lines, 1):
        match = MAP_LINE_RE.match(line)
        if match is None:
            raise ValueError(f"malformed perf map line {number}: {line!r}")
        start, size, symbol = match.groups()
        entries.append(MapEntry(int(start, 16), int(size, 16), symbol))
    return entries


def read_map(pid):
    """Read and parse the perf map of process `pid` (see parse_map()).

    Raises FileNotFoundError if the process wrote none.
    """
    with open(map_path(pid), encoding="utf-8",
              errors="surrogateescape", newline="\n") as f:
        return parse_map(f.read())


# ----------------------------------------------------------------------
# Running scripts

def clean_env(**changes):
    """Return a copy of os.environ for a child interpreter.

    The perf switches are removed, then `changes` applied: a str value
    sets a variable, None removes it.
    """
    env = dict(os.environ)
    for name in PERF_ENV_VARS:
        env.pop(name, None)
    for name, value in changes.items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    return env


class ScriptResult(NamedTuple):
    """How a script run by PerfTestCase.run_script() ended."""
    returncode: int
    stdout: str
    stderr: str
    pid: int            # pid of the interpreter that ran the script
    path: str           # absolute path of the script
    started: float = 0.0    # time.time() just before it was started

    def wrote_map(self, pid=None):
        """Did the script's process (or `pid`) write a perf map?"""
        return map_written_since(self.pid if pid is None else pid,
                                 self.started)

    def map_entries(self, pid=None):
        """Entries of the perf map of `pid` (default: the script's)."""
        return read_map(self.pid if pid is None else pid)

    def script_entries(self, pid=None):
        """Like map_entries(), only the entries of code in the script."""
        return [entry for entry in self.map_entries(pid)
                if entry.filename == self.path]

    def script_names(self, pid=None):
        """Qualified names of script_entries(), in map order."""
        return [entry.qualname for entry in self.script_entries(pid)]


def before_and_later(source):
    """Dedented `source` after a prelude that defines before(), named at
    the module's first run, and later(), whose nested after() is named
    only when later() first runs it: a line the map gets at that point."""
    return textwrap.dedent("""\
        def before():
            return 1
        def later():
            def after():
                return 2
            after()
        before()
        """) + textwrap.dedent(source)


def write_script(directory, source, name="script.py"):
    """Write dedented `source` to directory/name; return its path."""
    path = os.path.join(directory, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(textwrap.dedent(source))
    return path


def run_python(args, *, env=None, cwd=None, timeout=TIMEOUT):
    """Run sys.executable with `args`; return (pid, CompletedProcess).

    `env` defaults to clean_env().  Output is decoded as UTF-8 with
    backslashreplace, so a test can compare it as text.
    """
    proc = subprocess.Popen(
        [sys.executable, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        env=clean_env() if env is None else env, cwd=cwd)
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    completed = subprocess.CompletedProcess(
        proc.args, proc.returncode,
        stdout.decode("utf-8", "backslashreplace"),
        stderr.decode("utf-8", "backslashreplace"))
    return proc.pid, completed


def unshare_pid_namespace():
    """The command (a list) that runs a command as pid 1 of a new PID
    namespace with its own /proc; skips the test where that cannot be
    done here."""
    unshare = shutil.which("unshare")
    if os.geteuid() != 0 or unshare is None:
        skip_environment("needs root and unshare (util-linux) for a "
                         "process in its own PID namespace")
    command = [unshare, "-pf", "--mount-proc"]
    probe = subprocess.run([*command, "true"], stderr=subprocess.PIPE,
                           text=True)
    if probe.returncode != 0:
        skip_environment(f"unshare -pf --mount-proc fails here: "
                         f"{probe.stderr.strip()}")
    return command


# ----------------------------------------------------------------------
# Profiler files in /tmp

class ProfilerFiles:
    """The perf maps and jitdumps in /tmp, before and after a test.

    /tmp is shared with every other process on the machine, so cleanup()
    removes only files that appeared since the snapshot *and* belong to
    this test: their pid was passed to add_pid(), or their content
    mentions one of the markers (the test's directory, which appears in
    the file names of the test's scripts).
    """

    PATTERNS = ("/tmp/perf-*.map", "/tmp/jit-*.dump")

    def __init__(self, markers=()):
        self.markers = [os.fsencode(marker) for marker in markers]
        self.pids = set()
        self.before = self._scan()

    @classmethod
    def _scan(cls):
        return {path for pattern in cls.PATTERNS
                for path in glob.glob(pattern)}

    def add_pid(self, pid):
        """Claim the files of process `pid`."""
        self.pids.add(int(pid))

    def add_gdb_inferiors(self, output):
        """Claim the files of the processes gdb ran, named in its output
        ("[Inferior 1 (process 1234) killed]").  A process gdb kills may
        not have written the lines that name the test's functions."""
        for pid in re.findall(r"\(process (\d+)\)", output):
            self.add_pid(pid)

    def created(self):
        """Files that appeared since the snapshot (anyone's)."""
        return sorted(self._scan() - self.before)

    def _our_pid(self, path):
        match = re.search(r"-(\d+)\.(?:map|dump)$", path)
        return bool(match) and int(match.group(1)) in self.pids

    def _mentions_marker(self, path):
        try:
            with open(path, "rb") as f:
                data = f.read()
        except OSError:
            return False
        return any(marker in data for marker in self.markers)

    def cleanup(self):
        """Remove the created files that belong to this test.

        A symlink or an (empty) directory in place of a file is removed
        too, if it has the pid of one of the test's processes (tests
        plant those to check that the interpreter refuses them).
        """
        for path in self.created():
            try:
                if os.path.islink(path):
                    if self._our_pid(path):
                        os.unlink(path)
                elif os.path.isdir(path):
                    if self._our_pid(path):
                        os.rmdir(path)
                elif self._our_pid(path) or self._mentions_marker(path):
                    os.unlink(path)
            except OSError:
                pass


# Held shared by each PerfTestCase test, exclusive by test_upstream while
# upstream's tests run: their tearDown removes every perf map that
# appeared meanwhile, whoever made it (make test runs two modules at once).
LOCK_PATH = "/tmp/perf-tests.lock"


@contextlib.contextmanager
def tmp_files_lock(exclusive=False):
    """Hold LOCK_PATH (best effort: unlocked if it cannot be opened)."""
    try:
        fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC
                     | os.O_NOFOLLOW, 0o666)
    except OSError:
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)        # releases the lock


@support.requires_subprocess()
class PerfTestCase(unittest.TestCase):
    """Base class: a fresh directory and /tmp cleanup for every test."""

    def setUp(self):
        super().setUp()
        self.enterContext(tmp_files_lock())
        self.tmpdir = os.path.realpath(tempfile.mkdtemp(prefix="perftest-"))
        self.addCleanup(shutil.rmtree, self.tmpdir, ignore_errors=True)
        self.files = ProfilerFiles(markers=[self.tmpdir])
        self.addCleanup(self.files.cleanup)

    def run_script(self, source, *, python_args=(), script_args=(),
                   env=None, name="script.py", check=True):
        """Run `source` (dedented) as a script in a fresh interpreter.

        The command line is python <python_args> <script> <script_args>,
        run in self.tmpdir with `env` (default clean_env()).  With
        check=True the test fails unless the script exits with status 0.
        """
        path = write_script(self.tmpdir, source, name)
        started = time.time()
        pid, proc = run_python([*python_args, path, *script_args],
                               env=env, cwd=self.tmpdir)
        self.files.add_pid(pid)
        result = ScriptResult(proc.returncode, proc.stdout, proc.stderr,
                              pid, path, started)
        if check and result.returncode != 0:
            self.fail(f"script exited with {result.returncode}\n"
                      f"stdout:\n{result.stdout}\nstderr:\n{result.stderr}")
        return result

    def assertMapWellFormed(self, pid):
        """Parse the map of `pid`, failing the test on a malformed line;
        return its entries."""
        try:
            return read_map(pid)
        except ValueError as exc:
            self.fail(str(exc))


# ----------------------------------------------------------------------
# perf

class Sample(NamedTuple):
    """One sample of "perf script": its header line and call chain."""
    header: str
    frames: list        # symbol names, innermost first ("[unknown]" too)

    @property
    def pid(self):
        """The pid the header starts with ("perf script -F pid,..."), or
        None."""
        field = self.header.split()[0]
        return int(field) if field.isdigit() else None

    def python_frames(self, filename=None):
        """Qualified names of the py:: frames (only those of `filename`
        if given), innermost first."""
        names = []
        for frame in self.frames:
            if not frame.startswith("py::"):
                continue
            qualname, _, file = frame[4:].partition(":")
            if filename is None or file == filename:
                names.append(qualname)
        return names

    def origin(self):
        """(pid, tid, time in ns) of a sample printed with TIMED_FIELDS."""
        thread, stamp = self.header.split()[:2]
        pid, tid = thread.split("/")
        seconds, _, fraction = stamp.rstrip(":").partition(".")
        return int(pid), int(tid), int(seconds + fraction.ljust(9, "0"))


# "perf script" fields and options giving Sample.origin(); with "perf
# record -k 1" the time is CLOCK_MONOTONIC's.
TIMED_FIELDS = ("-F", "pid,tid,time,ip,sym", "--ns")


def parse_perf_script(text):
    """Parse "perf script -F ip,sym" style output into Samples.

    A sample is a header line (which perf may indent with spaces)
    followed by tab-indented "ADDRESS SYMBOL" lines, one per frame,
    innermost first; samples are separated by blank lines.
    """
    samples = []
    header = None
    frames = []
    for line in text.splitlines():
        if not line.strip():
            if header is not None:
                samples.append(Sample(header, frames))
            header, frames = None, []
        elif line.startswith("\t"):
            parts = line.split(None, 1)
            if header is not None and len(parts) == 2:
                frames.append(parts[1].strip())
        else:
            if header is not None:
                samples.append(Sample(header, frames))
            header, frames = line.strip(), []
    if header is not None:
        samples.append(Sample(header, frames))
    return samples


PERF_RECORD = ("perf", "record", "--no-buildid-cache", "--quiet",
               "-e", "cpu-clock", "-F", "999", "-g")


@functools.lru_cache(maxsize=None)
def perf_record_works():
    """Return None if "perf record -g" works here, else why not (a skip
    reason)."""
    host_tool("perf")
    if shutil.which("perf") is None:
        return "perf is not installed"
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "perf.data")
        try:
            proc = subprocess.run(
                [*PERF_RECORD, "-o", data, "--", sys.executable, "-c", "pass"],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                text=True, errors="backslashreplace", timeout=TIMEOUT)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return f"perf record cannot run: {exc}"
        if proc.returncode != 0 or not os.path.exists(data):
            lines = [line.strip() for line in proc.stdout.splitlines()
                     if line.strip()] or ["no output"]
            return (f"perf record is not permitted or fails here "
                    f"(exit {proc.returncode}): {' '.join(lines[:2])}")
    return None


def record_samples(args, directory, *, env=None, timeout=TIMEOUT,
                   options=(), check=True, fields=("-F", "pid,ip,sym")):
    """Run `args` under perf record -g (with `options`, e.g. ("-p", PID)
    to record a running process while `args` runs); return
    (CompletedProcess, samples), the samples read with `fields` (see
    script_samples()).

    perf.data is written to `directory`.  The CompletedProcess is that of
    perf record (the command's own output passes through it).  With
    check=True, no samples are read if perf record failed (it also fails
    with the status of a command that did).
    """
    data = os.path.join(directory, "perf.data")
    record = subprocess.run(
        [*PERF_RECORD, *options, "-o", data, "--", *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        errors="backslashreplace", env=clean_env() if env is None else env,
        cwd=directory, timeout=timeout)
    if check and record.returncode != 0:
        return record, []
    return record, script_samples(data, timeout=timeout, fields=fields)


def script_samples(data, *, timeout=TIMEOUT, fields=("-F", "pid,ip,sym")):
    """The samples of the perf.data file `data`, as "perf script" resolves
    them now (printing `fields`, e.g. TIMED_FIELDS)."""
    script = subprocess.run(
        ["perf", "script", "-i", data, *fields],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        errors="backslashreplace", timeout=timeout)
    return parse_perf_script(script.stdout)


# ----------------------------------------------------------------------
# gdb

GDB_FRAME_RE = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(\S+)")
# gdb -batch, without the user's settings.  Breakpoints may be pending:
# in a shared libpython build (make debian) the interpreter's functions
# are not loaded yet when the breakpoint is set.
GDB_OPTIONS = ("-batch", "-nx", "-iex", "set debuginfod enabled off",
               "-iex", "set auto-load no", "-iex", "set breakpoint pending on",
               "-ex", "set pagination off",
               "-ex", "set print frame-arguments none")


def gdb_available():
    """Return None if gdb can be used, else a skip reason."""
    host_tool("gdb")
    if shutil.which("gdb") is None:
        return "gdb is not installed"
    return None


def gdb_backtrace(args, breakpoint, files, *, env=None, timeout=TIMEOUT,
                  condition=None):
    """Run `args` under gdb -batch, stop at `breakpoint` (where the gdb
    expression `condition` holds, if given: then it is breakpoint 2),
    take a "bt".  `files` (a ProfilerFiles) claims the process's files.

    Returns (frame names outermost last, gdb's whole output).  A frame
    without a symbol is "??".
    """
    if condition:
        # gdb drops the condition of a pending breakpoint (libpython of a
        # shared build is not loaded before "run") when it resolves it:
        # set both at main, when every library is there.
        commands = ["tbreak main", "run", f"break {breakpoint}",
                    f"condition 2 {condition}", "continue"]
    else:
        commands = [f"break {breakpoint}", "run"]
    proc = subprocess.run(
        ["gdb", *GDB_OPTIONS,
         *(arg for command in [*commands, "bt", "kill"]
           for arg in ("-ex", command)),
         "--args", *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        errors="backslashreplace", env=clean_env() if env is None else env,
        timeout=timeout)
    files.add_gdb_inferiors(proc.stdout)
    names = []
    for line in proc.stdout.splitlines():
        match = GDB_FRAME_RE.match(line)
        if match:
            names.append(match.group(2))
    return names, proc.stdout
