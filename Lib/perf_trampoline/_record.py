"""python3.11 -m perf_trampoline record: perf with the right options, then
the reports.

    record [options] -- COMMAND [ARG...]
    record [options] -p PID [--seconds N]

The route is this interpreter's (route()): the command is taken to be
run by it.

Frame pointers (backend "perf"), where perf trampolines are built in
with frame records:
    perf record --call-graph fp -e cpu-clock -F HZ
--jit (backend "perf_jit"), the only route of a build without frame
pointers and of a stock 3.11 with perftramp311:
    perf record -k 1 --call-graph dwarf,DWARF_STACK -e cpu-clock -F HZ,
    then perf inject --jit into DIR/perf.data
cpu-clock is a software event: it works in virtual machines too.  -e,
--call-graph and -a (system-wide) change those options of perf record.
perf keeps its build-id cache in DIR/debug (_reports.BUILDID_NAME), not
in ~/.debug; perf record adds nothing to it.  After perf inject, the ELF
files it wrote in /tmp (jitted-PID-N.so, cached in DIR/debug) and the
jitdumps of the processes that have exited are removed (_JitFiles); the
copies of container processes' jitdumps go to DIR.

A COMMAND gets PYTHONPERFSUPPORT=1 (--jit: PYTHON_PERF_JIT_SUPPORT=1).
perf runs it as its child, in its own process group; a small exec helper
moves the command back into ours (the terminal's foreground job) and
gives it our stdout and stderr, so that Ctrl-C reaches the command, never
perf, exactly as it would without us; perf's own output goes to
DIR/perf-record.log.  Until the command exits, its stdout and stderr
carry its bytes alone; then ours follow on stderr, the paths of the files
written last.  Recording ends when the command exits; its exit status is
ours.

A running process (-p) is switched with this package's attach() unless
trampolines are on with the right backend already, and switched back
(detach(), or attach() of the backend it had) when recording ends, also
on Ctrl-C, SIGTERM or an error.  Recording ends after --seconds, on
Ctrl-C or SIGTERM, or when the process exits.

Processes in other PID or mount namespaces write their maps where the
host's perf does not look: _namespaces.NamespaceMaps copies them for the
process, or every descendant of the command, while recording.
"""

import argparse
import contextlib
import math
import os
import re
import selectors
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import time

from perf_trampoline import _namespaces, _output, _reports
from perf_trampoline._attach import _Control, attach, detach, status
from perf_trampoline._elf import RemoteError
from perf_trampoline._procfs import _alive, _read_small, _warn

# The oldest perf whose perf inject --jit was seen to name every frame
# (Debian 12's 6.1: test_oracle, perftramp311 and -X perf_jit alike);
# nothing older was tried.
PERF_JIT_MIN = (6, 1)
# Bytes of stack perf copies per sample on the DWARF route: it unwinds no
# frame above them, and perf.data grows by as much per sample.  rst2html
# (docutils) on a 630 KB text under perftramp311, perf 6.12, 999 Hz:
#
#   bytes      samples whole   reaching <module>   perf.data per sample
#   8192       19%             12%                 8.5 KB
#   16384      55%             44%                 16.7 KB
#   32768      93%             82%                 33 KB
#   65528      100%            84%                 65.5 KB
#
# (16% of its samples have no Python frame: start-up and exit.)  The
# evaluator, inlining Python calls, needs far less than perftramp311's
# hook, which makes each Python call a C call.  perf takes at most
# DWARF_STACK_MAX.
DWARF_STACK = 32768
DWARF_STACK_MAX = 65528
# The share of samples cut short above which record says so.
DWARF_CUT_WARN = 0.05
DEFAULT_HZ = 999
DEFAULT_EVENT = "cpu-clock"
# perf record --call-graph MODE: frame pointers, DWARF (with the bytes of
# stack copied per sample), Intel's last branch records.
CALL_GRAPH_RE = re.compile(r"fp|lbr|dwarf(,[1-9][0-9]*)?")
# An event as perf names it: "cycles:u", "sched:sched_switch",
# "cpu/event=0x3c,umask=0/", "r003c", "{cycles,instructions}".
EVENT_RE = re.compile(r"[A-Za-z0-9_{][\w.:/,=@{}*+-]*")
# How often the loop wakes: signals, the process tree, progress.
TICK = 0.25
# Namespace map copies, and progress lines when stderr is not a tty.
UPDATE_INTERVAL = 0.5
PLAIN_PROGRESS_INTERVAL = 10.0
# How long perf record -p may take to start recording.
READY_TIMEOUT = 60.0
SI_KERNEL = 0x80    # siginfo si_code of a signal the terminal sent
ENV_VARS = {"perf": "PYTHONPERFSUPPORT", "perf_jit": "PYTHON_PERF_JIT_SUPPORT"}
LOG_NAME = "perf-record.log"
RAW_NAME = "perf.raw.data"     # --jit: perf record's, before perf inject

HELP = f"""\
Writes DIR/perf.data (already injected with --jit) and the reports made
from it, and prints the perf report command for it and their paths, one
per line, on stderr.  DIR defaults to perf-record-YYYYmmdd-HHMMSS in the
current directory.  A DIR that holds a perf.data is refused unless
--force; so is a DIR reached through a symbolic link, or that another
user owns or could write in (by its mode, a group not yours alone, or an
ACL), as is any directory above it (a sticky one of root's, such as
/tmp, may be writable by all).  perf's own messages are in
DIR/perf-record.log, its build-id cache in DIR/debug (--jit: the frames
of the Python functions).  Of the reports, gecko.json (for the Firefox
Profiler) needs perf >= 6.7, which has its gecko script; with an older
perf it is left out.

The route is this Python's, which COMMAND is taken to run: frame
pointers where it has perf trampolines built in with frame records,
--jit where it has none (a build without frame pointers, or a stock 3.11
with perftramp311).  --jit copies {DWARF_STACK} bytes of stack per sample
(--call-graph dwarf,BYTES: up to {DWARF_STACK_MAX}); where more than
{DWARF_CUT_WARN:.0%} of the samples were cut short, a warning says so.

COMMAND runs with PYTHONPERFSUPPORT=1 (--jit: PYTHON_PERF_JIT_SUPPORT=1),
with record's stdin, stdout and stderr, and its output is left as it
wrote it: record writes nothing on stdout, and on stderr only once the
command has exited.  Ctrl-C reaches it as it would without perf, and
recording ends when it exits.  Exit status: the command's (128+N if
signal N killed it).

-p PID: switches perf trampolines on in the process (unless they are on
with the right backend) and back when recording ends: after --seconds, on
Ctrl-C or SIGTERM, or when the process exits.  With --jit, samples taken
before the switch have no jitdump.  Exit status 0.

perf is the one --perf names, else $PERF, else build/perf/usr/bin/perf
of the repository whose build runs this (make deps-jit), else perf on
PATH.

Exit status 2: bad input or an error (no perf, perf too old for --jit, a
process that is not this patched Python, ...), said in one line; 127: the
COMMAND was not found, 126: it cannot be run (as env(1) says).
"""


class RecordError(Exception):
    """Said in one line; exit status `status` (default 2)."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


def add_parser(commands, formatter_class):
    """Add the record subcommand to the subparsers action `commands`."""
    text = "run perf on a command or a running process, then make reports"
    parser = commands.add_parser(
        "record", help=text, description=text, epilog=HELP,
        formatter_class=formatter_class,
        usage="%(prog)s [options] -- COMMAND [ARG...]\n"
              "       %(prog)s [options] -p PID [--seconds N]")
    parser.add_argument("-p", "--pid", type=int,
                        help="record this running process")
    parser.add_argument("--seconds", type=float,
                        help="with -p: stop after this many seconds "
                             "(default: at Ctrl-C or when it exits)")
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="directory to write to")
    parser.add_argument("--force", action="store_true",
                        help="write into DIR even if it holds a perf.data")
    parser.add_argument("--jit", action="store_true",
                        help="backend perf_jit, DWARF unwinding and perf "
                             "inject --jit (perf >= 6.1; the only route "
                             "without frame pointers)")
    parser.add_argument("-F", "--freq", type=int, default=DEFAULT_HZ,
                        metavar="HZ",
                        help=f"samples per second (default {DEFAULT_HZ})")
    parser.add_argument("-e", "--event", default=DEFAULT_EVENT,
                        help=f"the event to sample, as perf record -e "
                             f"takes it (default {DEFAULT_EVENT}, a timer "
                             f"that works in virtual machines too)")
    parser.add_argument("--call-graph", metavar="MODE",
                        help="how perf walks the stack: fp (frame "
                             "pointers, the default) or lbr; "
                             "dwarf[,BYTES] (the only mode with --jit, "
                             "its default)")
    parser.add_argument("-a", "--all-cpus", action="store_true",
                        help="record every process on the machine while "
                             "COMMAND runs (perf record -a)")
    parser.add_argument("--perf", metavar="PATH",
                        help="the perf to run (default: $PERF, else perf "
                             "on PATH)")
    parser.add_argument("argv", nargs=argparse.REMAINDER, metavar="COMMAND",
                        help="the command to record and its arguments, "
                             "after --")
    return parser


# ----------------------------------------------------------------------
# perf

def _repository_perf():
    """build/perf/usr/bin/perf (make deps-jit) of the repository whose
    build runs this, or None: an installed Python has no repository."""
    import sysconfig
    if not sysconfig.is_python_build():
        return None
    # srcdir: ROOT/build/cpython (or another tree beside it).
    root = os.path.dirname(os.path.dirname(
        sysconfig.get_config_var("srcdir")))
    path = os.path.join(root, "build", "perf", "usr", "bin", "perf")
    return path if os.path.isfile(path) else None


def find_perf(given, jit):
    """Path of the perf to run, checked to run (and, for --jit, to be new
    enough): --perf, else $PERF, else the repository's, else perf on
    PATH; RecordError otherwise."""
    for name, how in ((given, "--perf"), (os.environ.get("PERF"), "$PERF"),
                      (_repository_perf(), "make deps-jit"),
                      ("perf", "PATH")):
        if name:
            break
    path = shutil.which(name) if os.sep not in name else name
    if path is None or not os.path.isfile(path):
        raise RecordError(f"no perf found ({name!r} from {how}): install "
                          f"perf (Debian: linux-perf) or name one with "
                          f"--perf PATH")
    try:
        proc = subprocess.run([path, "version"], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise RecordError(f"{path} does not run: {exc}; name another "
                          f"perf with --perf PATH") from None
    match = re.search(r"perf version (\d+)\.(\d+)", proc.stdout)
    if proc.returncode != 0 or match is None:
        raise RecordError(f"{path} is not perf: 'version' said "
                          f"{proc.stdout.strip()[:80]!r}; name perf with "
                          f"--perf PATH")
    version = (int(match.group(1)), int(match.group(2)))
    if jit and version < PERF_JIT_MIN:
        raise RecordError(
            f"--jit needs perf >= {PERF_JIT_MIN[0]}.{PERF_JIT_MIN[1]} (perf "
            f"inject --jit of DWARF-unwound frames; older ones were not "
            f"tried); {path} is "
            f"{version[0]}.{version[1]}: name a newer one with --perf PATH "
            f"or PERF=PATH ('make deps-jit' puts 6.12 in the repository's "
            f"build/perf/; Debian 12: linux-perf from bookworm-backports)")
    # Absolute: perf inject runs in the output directory.
    return os.path.abspath(path)


# What this interpreter has (route()).
FRAME_RECORDS = "frame records"
NO_FRAME_POINTERS = "no frame pointers"
EXTENSION = "perftramp311"


def this_python():
    """How perf can see this interpreter's Python functions: FRAME_RECORDS
    (perf trampolines built in, with frame pointers), NO_FRAME_POINTERS
    (built in, without) or EXTENSION (a stock 3.11 with perftramp311);
    RecordError if it has none."""
    if hasattr(sys, "activate_stack_trampoline"):
        import sysconfig
        if sysconfig.get_config_var("PY_WITHOUT_FRAME_POINTERS"):
            return NO_FRAME_POINTERS
        return FRAME_RECORDS
    try:
        import perftramp311
    except ImportError:
        raise RecordError(f"{sys.executable} has no perf trampolines: "
                          f"install perftramp311 in it, or record with "
                          f"the patched interpreter") from None
    if perftramp311.REFUSED is not None:
        raise RecordError(perftramp311.REFUSED)
    return EXTENSION


def route(args):
    """Set args.jit for this interpreter: the frame-pointer route only
    where it has frame records; RecordError for a --call-graph that
    cannot walk its Python frames."""
    python = this_python()
    if python == FRAME_RECORDS or args.jit:
        return
    dwarf = args.call_graph is None or args.call_graph.startswith("dwarf")
    if python == EXTENSION and not dwarf:
        raise RecordError(f"--call-graph {args.call_graph}: a stock 3.11 "
                          f"keeps no frame pointers, and perftramp311 "
                          f"describes its frames for DWARF: give "
                          f"--call-graph dwarf[,BYTES] or leave it out")
    # Without frame pointers, a mode other than DWARF (lbr) is the
    # user's choice, with the map.
    args.jit = dwarf


def record_options(args):
    """perf record's options for the parsed arguments `args` (checked by
    _check_args())."""
    # -k 1: CLOCK_MONOTONIC, the clock of the jitdump's timestamps.
    options = ["-k", "1"] if args.jit else []
    # The binaries stay where they are: perf reads them there for the
    # reports and perf report, as it reads the maps in /tmp.
    options += ["--no-buildid-cache", "--call-graph",
                args.call_graph or (f"dwarf,{DWARF_STACK}" if args.jit
                                    else "fp"),
                "-e", args.event, "-F", str(args.freq)]
    if args.all_cpus:
        options.append("-a")
    return options


def inject(perf, out):
    """perf inject --jit from RAW_NAME into perf.data, in `out` (an
    _output.OutputDir); RecordError on failure."""
    proc = subprocess.run([*_reports.perf_command(perf, out), "inject",
                           "--jit", "-i", RAW_NAME, "-o", _reports.DATA_NAME],
                          stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True,
                          errors="replace", **out.as_cwd())
    if proc.returncode != 0:
        raise RecordError(f"perf inject --jit failed (exit "
                          f"{proc.returncode}): {_first_line(proc.stdout)}; "
                          f"the recording is {out.join(RAW_NAME)}")
    out.unlink(RAW_NAME)


def _first_line(text):
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    errors = [line for line in lines if "rror" in line or "ailed" in line]
    return (errors or lines or ["no output"])[0]


def _read_log(out):
    try:
        return out.read_text(LOG_NAME)
    except OSError:
        return None


def _samples(out):
    """The sample count perf record's closing line gives, or None if it
    wrote none (it failed)."""
    text = _read_log(out)
    if text is None:
        return None
    match = re.search(r"perf record: Captured and wrote .*", text)
    if match is None:
        return None
    # Without samples the line gives no count.
    count = re.search(r"\((\d+) samples?\)", match.group())
    return int(count.group(1)) if count else 0


def _log_failure(out, returncode):
    text = _read_log(out)
    said = "no output" if text is None else _first_line(text)
    return (f"perf record failed (exit {returncode}): {said} (all of it: "
            f"{out.join(LOG_NAME)})")


# ----------------------------------------------------------------------
# Processes

# Runs between perf's fork and the command: back into our process group
# (so the terminal's Ctrl-C reaches the command, not perf), our stdout and
# stderr back in place of perf's log, perf's descriptor of the output
# directory closed.  In Perl where there is one: perf's DWARF unwinder
# (6.1 and 6.12) takes the mappings of the image a process left by exec
# for its new ones where they do not overlap, and a Python helper with a
# shared libpython (pyenv's, a --enable-shared build's) lost the Python
# frames of 3 of 6 recordings of such a Python; a Perl helper, 0 of 10.
# The Python helper (-I -S: no environment, no site; it ignores
# PYTHONPERFSUPPORT, which the command gets) is for hosts without perl.
_EXEC_HELPER_PERL = """\
use POSIX ();
my ($pgid, $out_fd, $err_fd, $dir_fd, @command) = @ARGV;
POSIX::setpgid(0, $pgid);
for ([$out_fd, 1], [$err_fd, 2]) {
    POSIX::dup2($_->[0], $_->[1]);
    POSIX::close($_->[0]);
}
POSIX::close($dir_fd);
exec { $command[0] } @command;
my $status = $!{ENOENT} ? 127 : 126;
print STDERR "perf_trampoline: cannot run $command[0]: $!\\n";
POSIX::_exit($status);
"""
_EXEC_HELPER = """\
import os, sys
pgid, out_fd, err_fd, dir_fd, *command = sys.argv[1:]
try:
    os.setpgid(0, int(pgid))
except OSError:
    pass
for fd, to in ((out_fd, 1), (err_fd, 2)):
    os.dup2(int(fd), to)
    os.close(int(fd))
os.close(int(dir_fd))
try:
    os.execvp(command[0], command)
except OSError as exc:
    sys.stderr.write(f"perf_trampoline: cannot run {command[0]}: "
                     f"{exc.strerror}\\n")
    os._exit(127 if isinstance(exc, FileNotFoundError) else 126)
"""


def _exec_helper():
    """The exec helper's command line, before its arguments."""
    perl = shutil.which("perl")
    if perl is not None:
        return [perl, "-e", _EXEC_HELPER_PERL]
    return [sys.executable, "-I", "-S", "-c", _EXEC_HELPER]


def _spawn(args, log_fd, env, old_mask):
    """Start `args` in a process group of its own, stdout and stderr to
    `log_fd`, with the signal mask and default dispositions we were
    started with."""
    return os.posix_spawn(
        args[0], args, env, file_actions=[
            (os.POSIX_SPAWN_DUP2, log_fd, 1),
            (os.POSIX_SPAWN_DUP2, log_fd, 2)],
        setpgroup=0, setsigmask=old_mask,
        setsigdef=(signal.SIGPIPE, signal.SIGXFSZ))


def _children(pid):
    """Pids of the children of process `pid`, from its threads' lists:
    following a tree reads only the tree's /proc entries, so the cost does
    not grow with the processes the host runs."""
    found = []
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found                    # it has exited
    for tid in tids:
        data = _read_small(f"/proc/{pid}/task/{tid}/children", 1 << 20)
        if data:
            found.extend(map(int, data.split()))
    return found


def descendants(root):
    """Pids of the processes below `root`, now."""
    found = []
    todo = _children(root)
    seen = set(todo)
    while todo:
        pid = todo.pop()
        found.append(pid)
        for child in _children(pid):
            # (A pid reused while the tree is read makes no cycle.)
            if child not in seen:
                seen.add(child)
                todo.append(child)
    return found


def _signal_name(signum):
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


# ----------------------------------------------------------------------
# Recording

class _JitFiles:
    """The files of the --jit route in /tmp: the jitdumps of the recorded
    processes, and the ELF files perf inject --jit writes beside them,
    jitted-PID-N.so.  Once perf.data is injected, perf finds those in
    DIR/debug, by build id, and needs neither.  Our own are removed: the
    jitdumps new since recording began (or of the process -p named) whose
    mapping the recording saw, of processes that have exited, and all the
    ELF files of those processes: another recording's, made meanwhile,
    are left alone.  In a sticky /tmp no
    other user can put anything else under a name we checked."""

    DUMP_RE = re.compile(r"jit-([0-9]+)\.dump")
    ELF_RE = re.compile(r"jitted-([0-9]+)-[0-9]+\.so")
    # A line of perf script --show-mmap-events.
    MAPPED_RE = re.compile(
        r"PERF_RECORD_MMAP.*\]: \S+ /tmp/(jit-[0-9]+\.dump)$", re.M)

    def __init__(self, pid=None):
        self.pids = set() if pid is None else {pid}
        with self._tmp() as fd:
            self.before = {name: (st.st_dev, st.st_ino) for name, (_, st)
                           in self._scan(fd, self.DUMP_RE).items()}

    @staticmethod
    @contextlib.contextmanager
    def _tmp():
        fd = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
                     | os.O_CLOEXEC)
        try:
            yield fd
        finally:
            os.close(fd)

    @staticmethod
    def _scan(fd, pattern):
        """{name: (pid, stat)} of the regular files in the directory `fd`
        whose names match `pattern`."""
        found = {}
        with os.scandir(fd) as entries:
            for entry in entries:
                match = pattern.fullmatch(entry.name)
                if match is None:
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue            # removed meanwhile
                if stat.S_ISREG(st.st_mode):
                    found[entry.name] = (int(match.group(1)), st)
        return found

    @classmethod
    def mapped(cls, perf, out):
        """The names of the jitdumps in /tmp whose mapping the recording
        in `out`, not yet injected, holds (container processes' too: perf
        inject reads copies by those names)."""
        proc = subprocess.run(
            [*_reports.perf_command(perf, out), "script", "-i", RAW_NAME,
             "--show-mmap-events", "-F", "pid"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            errors="replace", **out.as_cwd())
        return set(cls.MAPPED_RE.findall(proc.stdout))

    def remove(self, mapped):
        """Remove ours, of the jitdumps `mapped` (see mapped()); return
        the paths removed."""
        removed = []
        with self._tmp() as fd:
            dumps = {name: (pid, st) for name, (pid, st)
                     in self._scan(fd, self.DUMP_RE).items()
                     if name in mapped}
            pids = (self.pids & {pid for pid, _ in dumps.values()}) | {
                pid for name, (pid, st) in dumps.items()
                if self.before.get(name) != (st.st_dev, st.st_ino)}
            elves = self._scan(fd, self.ELF_RE)
            for name, (pid, st) in [*elves.items(), *dumps.items()]:
                if (pid in pids and st.st_uid == os.geteuid()
                        and (name in elves or not _alive(pid))):
                    try:
                        os.unlink(name, dir_fd=fd)
                    except FileNotFoundError:
                        continue
                    removed.append(os.path.join("/tmp", name))
        return removed


class _Progress:
    """Elapsed time and perf.data's size on stderr: one updating line on a
    terminal, else a line every PLAIN_PROGRESS_INTERVAL seconds."""

    def __init__(self, out, name):
        self.out = out
        self.name = name
        self.start = time.monotonic()
        self.tty = sys.stderr.isatty()
        self.last = self.start
        self.shown = False

    def tick(self):
        now = time.monotonic()
        if not self.tty and now - self.last < PLAIN_PROGRESS_INTERVAL:
            return
        self.last = now
        try:
            size = self.out.lstat(self.name).st_size
        except OSError:
            size = 0
        line = (f"perf_trampoline: recording {now - self.start:.0f} s, "
                f"perf.data {size / 1e6:.1f} MB")
        if self.tty:
            sys.stderr.write(f"\r{line}\x1b[K")
            self.shown = True
        else:
            sys.stderr.write(line + "\n")
        sys.stderr.flush()

    def done(self):
        if self.shown:
            sys.stderr.write("\r\x1b[K")
            sys.stderr.flush()


class Recorder:
    """One perf record run: its process, the loop that watches it and the
    signals, the namespace maps."""

    def __init__(self, args, perf, out, old_mask):
        self.args = args
        self.perf = perf
        self.backend = "perf_jit" if args.jit else "perf"
        self.out = out                  # an _output.OutputDir
        self.data = out.join(_reports.DATA_NAME)
        self.recorded = RAW_NAME if args.jit else _reports.DATA_NAME
        self.old_mask = old_mask
        # While a command runs, its stderr is its own: what we have to
        # say meanwhile (a list) waits until it has exited.
        self.held = None
        self.maps = _namespaces.NamespaceMaps(warn=self.warn)
        self.host_maps = None
        self.watched = set()
        self.perf_pid = None
        self.status = None          # perf's wait status, once reaped
        self.control = None         # -p: perf's control fd, our end
        self.signals = []           # (signum, from the terminal)

    def start(self, target):
        """Start perf record on `target` (["-p", PID] or the command's
        argv after "--")."""
        try:
            log_fd = self.out.create(LOG_NAME)
        except OSError as exc:
            raise RecordError(f"cannot write {self.out.join(LOG_NAME)}: "
                              f"{exc.strerror}") from None
        # perf writes by path, and runs the command where we run: it
        # names the directory by a descriptor of its own, which no link
        # can redirect (the exec helper closes it for the command).
        dir_fd = os.dup(self.out.fd)
        os.set_inheritable(dir_fd, True)
        args = [self.perf, "record", *record_options(self.args),
                "-o", f"/proc/self/fd/{dir_fd}/{self.recorded}"]
        env = dict(os.environ)
        std_fds = []            # our stdout and stderr, for the command
        ready = None
        if target[0] == "-p":
            # perf acknowledges a ping once it records (its main loop).
            control, ping = os.pipe()
            ready, ack = os.pipe()
            for fd in (control, ack):
                os.set_inheritable(fd, True)
            args += ["--control", f"fd:{control},{ack}", *target]
        else:
            for name in ENV_VARS.values():
                env.pop(name, None)
            env[ENV_VARS[self.backend]] = "1"
            std_fds = [os.dup(1), os.dup(2)]
            for fd in std_fds:
                os.set_inheritable(fd, True)
            args += ["--", *_exec_helper(),
                     str(os.getpgrp()), *map(str, std_fds), str(dir_fd),
                     *target]
        try:
            self.perf_pid = _spawn(args, log_fd, env, self.old_mask)
        except OSError as exc:
            raise RecordError(f"cannot run {self.perf}: {exc}") from None
        finally:
            os.close(log_fd)
            os.close(dir_fd)
            for fd in std_fds:
                os.close(fd)
            if ready is not None:
                os.close(control)
                os.close(ack)
        if ready is not None:
            # Open while perf runs: a hang-up of its control fd makes
            # perf 6.1 to 6.12 fail ("pollfd index mismatch").
            self.control = ping
            self._wait_ready(ping, ready)

    def _wait_ready(self, ping, ready):
        """Until perf answers a ping (it records), or ends (it failed:
        finish() says why)."""
        try:
            os.write(ping, b"ping\n")
            with selectors.DefaultSelector() as selector:
                selector.register(ready, selectors.EVENT_READ)
                deadline = time.monotonic() + READY_TIMEOUT
                while time.monotonic() < deadline and not self._reap():
                    if selector.select(TICK):
                        os.read(ready, 64)  # "ack", or EOF: perf ended
                        return
            if self._reap():
                return
            raise RecordError(f"perf record did not start within "
                              f"{READY_TIMEOUT:g} s")
        except BrokenPipeError:
            pass                        # perf ended: finish() says why
        finally:
            os.close(ready)

    def _reap(self):
        if self.status is None:
            pid, status = os.waitpid(self.perf_pid, os.WNOHANG)
            if pid:
                self.status = status
        return self.status is not None

    def stop(self):
        """SIGINT to perf (it writes its data and ends), then wait."""
        if self.perf_pid is not None and not self._reap():
            os.kill(self.perf_pid, signal.SIGINT)
            _, self.status = os.waitpid(self.perf_pid, 0)
        if self.control is not None:
            os.close(self.control)
            self.control = None

    def warn(self, message):
        if self.held is None:
            _warn(message)
        else:
            self.held.append(message)

    def release(self):
        """Say what was held while the command ran."""
        held, self.held = self.held or [], None
        for message in held:
            _warn(message)

    def watch(self, pid):
        """Follow the maps of `pid` if it runs in a container.  A process
        that ended meanwhile has nothing to follow; any other failure
        costs only the names of its functions after it exits: said, and
        the recording goes on."""
        if pid in self.watched:
            return
        self.watched.add(pid)
        try:
            self.maps.watch(pid)
        except _namespaces.MapsError as exc:
            if _alive(pid):
                self.warn(f"{exc}; its Python functions will not be named "
                          f"once it has exited")

    def loop(self, alive=None, seconds=None, on_signal=None):
        """Until perf ends, or `seconds` pass, or (with `alive`, for a
        running process) alive() is false: namespace maps, signals, each
        passed to on_signal(signum, from_terminal), which returns True to
        stop, and for a process progress; a command's stderr is its own."""
        progress = (_Progress(self.out, self.recorded) if alive is not None
                    else None)
        started = time.monotonic()
        updated = started
        try:
            while not self._reap():
                info = signal.sigtimedwait((signal.SIGINT, signal.SIGTERM),
                                           TICK)
                if info is not None:
                    self.signals.append(info.si_signo)
                    if on_signal(info.si_signo, info.si_code == SI_KERNEL):
                        break
                now = time.monotonic()
                if alive is None:
                    for child in descendants(self.perf_pid):
                        self.watch(child)
                elif not alive():
                    break
                if seconds is not None and now - started >= seconds:
                    break
                if now - updated >= UPDATE_INTERVAL:
                    self.maps.update()
                    updated = now
                if progress is not None:
                    progress.tick()
        finally:
            if progress is not None:
                progress.done()

    def finish(self):
        """Stop perf if it runs; the sample count; RecordError if perf
        failed."""
        self.stop()
        samples = _samples(self.out)
        if samples is None:
            raise RecordError(_log_failure(
                self.out, os.waitstatus_to_exitcode(self.status)))
        return samples

    def close_maps(self):
        """The last copies of the container processes' files (once: the
        paths written)."""
        if self.host_maps is None:
            self.host_maps = self.maps.close()
        return self.host_maps


def _record_command(recorder, command):
    def forward(signum, from_terminal):
        # The terminal's signal reached the command's process group
        # (ours) already; another one (kill PID) is passed on.
        if not from_terminal:
            for child in _children(recorder.perf_pid):
                try:
                    os.kill(child, signum)
                except ProcessLookupError:
                    pass                # it has just exited
        return False

    recorder.held = []
    try:
        recorder.start(command)
        recorder.loop(on_signal=forward)
    finally:
        recorder.stop()
        recorder.release()
    return recorder.finish()


def _status(pid):
    """The backend on in process `pid` (None: off); RecordError if it is
    not this patched Python or cannot be read."""
    try:
        return status(pid)[0]
    except RemoteError as exc:
        raise RecordError(str(exc)) from None


def _record_pid(recorder, pid):
    # One handle for the whole recording (_Control): the process switched
    # back is the one switched, and once it has exited nothing is written,
    # also not to a process that took its pid.
    try:
        target = _Control(pid, writable=True)
    except RemoteError as exc:
        raise RecordError(str(exc)) from None
    with target:
        active = status(target)[0]
        recorder.start(["-p", str(pid)])
        switched = False
        try:
            if active != recorder.backend:
                try:
                    done = attach(target, recorder.backend)
                except RemoteError as exc:
                    raise RecordError(str(exc)) from None
                switched = True
                if not done and status(target)[0] != recorder.backend:
                    _warn(f"process {pid} has not switched yet: the request "
                          f"is pending (it will switch when it next runs "
                          f"Python code) or another tool's replaced it")
            recorder.watch(pid)
            recorder.loop(alive=target.alive,
                          seconds=recorder.args.seconds,
                          on_signal=lambda signum, from_terminal: True)
            samples = recorder.finish()
        finally:
            recorder.stop()
            if switched and target.alive():
                try:
                    if active is None:
                        detach(target)
                    else:
                        attach(target, active)
                except RemoteError as exc:
                    _warn(f"could not switch process {pid} back: {exc}")
    return samples


# ----------------------------------------------------------------------
# The command

def _out_dir(args):
    """The output directory, open (an _output.OutputDir, made if
    missing); RecordError if it is refused or cannot be made."""
    path = args.output or time.strftime("perf-record-%Y%m%d-%H%M%S")
    try:
        out = _output.OutputDir.open(path)
    except _output.UnsafeError as exc:
        raise RecordError(str(exc)) from None
    except OSError as exc:
        path = os.path.abspath(path)
        # The component that failed, if not the directory itself.
        where = f"{exc.filename}: " if exc.filename not in (None, path) \
            else ""
        raise RecordError(f"cannot create {path}: {where}"
                          f"{exc.strerror}; name another directory with "
                          f"-o DIR") from None
    if out.exists(_reports.DATA_NAME) and not args.force:
        out.close()
        raise RecordError(f"{out.path} holds a perf.data already: name "
                          f"another directory with -o, or overwrite it "
                          f"with --force")
    return out


def _check_args(args):
    command = args.argv[1:] if args.argv[:1] == ["--"] \
        else args.argv
    if args.pid is None and not command:
        raise RecordError("record needs a COMMAND (after --) or -p PID")
    if args.pid is not None and command:
        raise RecordError("record takes -p PID or a COMMAND, not both")
    if args.seconds is not None and (args.pid is None
                                     or not 0 < args.seconds < math.inf):
        raise RecordError("--seconds N (N > 0) goes with -p PID")
    if args.freq <= 0:
        raise RecordError("-F HZ must be a positive number")
    if not EVENT_RE.fullmatch(args.event):
        raise RecordError(f"-e {args.event!r} is not an event name: "
                          f"'perf list' lists them")
    if args.call_graph is not None:
        if not CALL_GRAPH_RE.fullmatch(args.call_graph):
            raise RecordError(f"--call-graph {args.call_graph!r}: give fp, "
                              f"dwarf, dwarf,BYTES or lbr")
        if args.jit and not args.call_graph.startswith("dwarf"):
            raise RecordError(f"--jit unwinds with DWARF: give --call-graph "
                              f"dwarf[,BYTES], or record without --jit")
    if args.all_cpus and args.pid is not None:
        raise RecordError("-a records every process: give it with a "
                          "COMMAND, or -p PID without it")
    if command:
        _check_command(command[0])
    return command


def _check_command(name):
    """RecordError unless `name` is a program to run, with the status env(1)
    gives: 127 not found, 126 found but not executable."""
    if shutil.which(name) is not None:
        return
    if os.sep in name:
        found = os.path.exists(name)
    else:
        # Not an executable on PATH: a file there that is not is still
        # found, as execvp() finds it.
        found = shutil.which(name, mode=os.F_OK) is not None
    if not found:
        raise RecordError(f"command not found: {name}: check its name, or "
                          f"give its path", status=127)
    raise RecordError(f"cannot run {name}: not an executable file: give an "
                      f"executable, or run it with its interpreter",
                      status=126)


def _fill_closed_std_fds():
    """/dev/null in place of a closed stdin, stdout or stderr: else a
    descriptor of ours (the output directory, perf's log) would take its
    number, and the command would be given it."""
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            # The lowest free number: this one.
            os.set_inheritable(os.open(os.devnull, os.O_RDWR), True)


def run(args):
    """The record subcommand; returns the exit status."""
    _fill_closed_std_fds()
    try:
        command = _check_args(args)
        route(args)
        perf = find_perf(args.perf, args.jit)
        if args.pid is not None:
            _status(args.pid)
        out = _out_dir(args)
    except RecordError as exc:
        _warn(exc)
        return exc.status
    with out:
        # Signals wait for the loop (sigtimedwait), which decides: nothing
        # may interrupt a switch of the target or its switching back.
        watched = {signal.SIGINT, signal.SIGTERM}
        old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, watched)
        recorder = Recorder(args, perf, out, old_mask)
        jit_files = _JitFiles(args.pid) if args.jit else None
        removed = []
        kept = {}
        try:
            if command:
                samples = _record_command(recorder, command)
            else:
                samples = _record_pid(recorder, args.pid)
            # perf inject reads the copies of container processes' jitdumps:
            # complete them first.
            recorder.stop()
            recorder.close_maps()
            if args.jit and samples:
                mapped = _JitFiles.mapped(perf, out)
                inject(perf, out)
                kept = _keep_dumps(out, recorder.close_maps())
                removed = jit_files.remove(mapped)
        except RecordError as exc:
            _warn(exc)
            return exc.status
        finally:
            recorder.stop()
            host_maps = recorder.close_maps()
            # Signals that came meanwhile are taken here, not raised later.
            while signal.sigtimedwait(watched, 0) is not None:
                pass
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        host_maps = [kept.get(path, path) for path in host_maps
                     if path in kept or path not in removed]
        return _report(recorder, perf, out, command, samples, host_maps)


def _keep_dumps(out, copies):
    """Copy into `out` the jitdumps that record copied out of containers
    for perf inject, which has read them (_JitFiles then removes them
    from /tmp); return {copy: its path in out}."""
    kept = {}
    for path in copies:
        name = os.path.basename(path)
        if not _JitFiles.DUMP_RE.fullmatch(name):
            continue
        try:
            with open(os.open(path, os.O_RDONLY | os.O_NOFOLLOW
                              | os.O_CLOEXEC), "rb") as src, \
                    open(out.create(name), "wb") as dst:
                shutil.copyfileobj(src, dst)
        except OSError as exc:
            _warn(f"cannot keep {path} in {out.path}: {exc}")
            continue
        kept[path] = out.join(name)
    return kept


def _report(recorder, perf, out, command, samples, host_maps):
    exit_code = 0
    if command:
        exit_code = os.waitstatus_to_exitcode(recorder.status)
        if exit_code < 0:
            _warn(f"the command was killed by {_signal_name(-exit_code)}")
            exit_code = 128 - exit_code
        elif exit_code:
            _warn(f"the command exited with status {exit_code}")
    paths = [recorder.data] if samples else []
    summary = {}
    if samples:
        try:
            # A report this perf cannot write (gecko.json) is said in
            # --help, not here on every run.
            paths += [path for _, path in _reports.write_reports(
                perf, out, summary) if path is not None]
        except _reports.ReportError as exc:
            _warn(f"no reports: {exc}")
            exit_code = exit_code or 2
        except KeyboardInterrupt:
            _warn(f"interrupted while writing the reports; "
                  f"{recorder.data} is complete")
            return 130
    else:
        _warn("perf recorded no samples: no reports")
    _warn(f"{samples} samples")
    if "stacks" in summary:
        _warn_cut_short(recorder.args, summary["stacks"])
        if not any(_reports.is_python_frame(name)
                   for stack in summary["stacks"] for name, _ in stack):
            _warn(f"no Python function was named: a Python program must "
                  f"run on a Python with perf trampolines, such as "
                  f"{sys.executable}")
    if samples:
        _warn("perf report: " + shlex.join(
            [perf, "--buildid-dir", out.join(_reports.BUILDID_NAME),
             "report", "--max-stack", str(_reports.MAX_STACK), "-i",
             recorder.data]))
    for path in paths + list(host_maps):
        print(path, file=sys.stderr)
    return exit_code


def _dwarf_stack(args):
    """The bytes of stack perf copied per sample, or None without
    DWARF."""
    mode = args.call_graph or (f"dwarf,{DWARF_STACK}" if args.jit else "fp")
    if not mode.startswith("dwarf"):
        return None
    # perf's own default for a bare "dwarf".
    return int(mode.partition(",")[2] or 8192)


def _warn_cut_short(args, stacks):
    """Say so if more than DWARF_CUT_WARN of the samples were cut short
    by the bytes of stack perf copied, with the size to try."""
    size = _dwarf_stack(args)
    cut, total = _reports.cut_short(stacks)
    if size is None or not total or cut <= DWARF_CUT_WARN * total:
        return
    share = f"{cut / total:.0%} of the samples were cut short"
    if size < DWARF_STACK_MAX:
        _warn(f"{share} ({size} bytes of stack copied per sample): try "
              f"--call-graph dwarf,{min(2 * size, DWARF_STACK_MAX)}")
    else:
        _warn(f"{share}, with the most perf copies per sample "
              f"({DWARF_STACK_MAX} bytes of stack): a build with frame "
              f"pointers walks the whole stack")
