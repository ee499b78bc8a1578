"""The attach protocol: a request to switch perf trampolines, written
through /proc/PID/mem, and what became of it; attach, detach, status.

The target must be this patched CPython 3.11 (any build with perf
trampolines; it need not have been started with -X perf).  Nothing runs
inside it on our behalf, and it is never stopped: the tool opens
/proc/PID/mem, finds the interpreter's control block (_PyPerf_remote) in
the dynamic symbol table of the image the process runs, checks its magic
and version through that descriptor, and writes the request and then the
main interpreter's eval breaker through the same descriptor.  A descriptor
of /proc/PID/mem belongs to the address space it was opened on: once the
process has exec'd or exited, reads and writes through it fail, so a
request can never land in another program that took the pid.

Several tools may write requests at once: each carries a random tag,
and the interpreter logs what it did with each request it took, so a tool
reports what became of its own (see Include/internal/pycore_perf.h).

The interpreter acts on the request the next time one of its threads
checks the eval breaker (between bytecode instructions), exactly as
sys.activate_stack_trampoline() would.  The interpreter may recompute the
breaker from its own flags at any moment and so clear ours; the tool sets
it again every REARM_INTERVAL seconds while the request is pending.  A
target blocked in a system call (sleep, select, a lock, a read) acts when
it next runs Python code: nothing can wake it without a signal it would
see, so the tool says what it is blocked in and that the request is
pending (or, with --no-wait, withdraws it).

Everything read on the target's behalf comes from /proc: the images it
runs through /proc/PID/exe and /proc/PID/map_files/, never by a path the
target controls, opened non-blocking, checked to be regular files, and read
in bounded pieces (the ELF headers, section headers and dynamic symbols).
Without CAP_SYS_ADMIN, which map_files needs, a libpython's dynamic symbols
are read where it is loaded, through the same /proc/PID/mem descriptor.
"""

import errno
import os
import select
import struct
import time

from perf_trampoline._elf import (ELFError, RemoteError, dynamic_symbol,
                                  load_bias, loaded_symbol)
from perf_trampoline._procfs import (_alive, _check_process, _gone,
                                     _mappings, _not_permitted, _open_image,
                                     _open_mem, _open_pidfd, _proc,
                                     _read_small, _stat_fields)

SYMBOL = b"_PyPerf_remote"
MAGIC = 0x46505950
VERSION = 2
# struct _PyPerf_RemoteControl (Include/internal/pycore_perf.h): the
# fields at their offsets.  Version 1 (an older interpreter, which status
# still reads) had an int request at 8 and no `taken` or log: 36 bytes.
V1_SIZE = 36
HEADER = struct.Struct("<II")
REQUEST_AT, BREAKER_AT, HANDLED_AT, ACTIVE_AT, TAKEN_AT, LOG_AT = (
    8, 16, 24, 28, 32, 40)
U64 = struct.Struct("<Q")
U32 = struct.Struct("<I")
INT = struct.Struct("<i")
LOG_SIZE = 16
OUTCOME = struct.Struct("<Qii")         # request word, active, error
REQUEST_NONE = 0
REQUESTS = {"perf": 1, "perf_jit": 2, "off": 3}
BACKENDS = {1: "perf", 2: "perf_jit"}

# How often the wait reads the control block, and sets the eval breaker
# again while the request is pending (finding a lost wake-up).
POLL_INTERVAL = 0.005
REARM_INTERVAL = 0.02
# A target none of whose threads has been runnable for this long is
# blocked: the tool stops waiting for it.
BLOCKED_AFTER = 0.2
# After writing a withdrawal: how long a target that took the request
# just before it is given to finish acting on it.
DECIDE_TIMEOUT = 1.0


# ----------------------------------------------------------------------
# The target's control block

def _read_image(pid, what, function, *args):
    """function(*args), with its errors said as reading `what`."""
    try:
        return function(*args)
    except ELFError as exc:
        raise ELFError(f"process {pid}: cannot read {what}: "
                       f"{exc}") from None
    except OSError as exc:
        raise RemoteError(f"process {pid}: cannot read {what}: "
                          f"{exc}") from None


def _control_address(pid, mem):
    """Address of _PyPerf_remote in the target, or RemoteError.  `mem`:
    the target's /proc/PID/mem descriptor."""
    try:
        exe = os.readlink(_proc(pid, "exe"))
    except FileNotFoundError:
        raise RemoteError(f"no such process: {pid}") from None
    except PermissionError:
        raise RemoteError(_not_permitted(pid)) from None
    mappings = _mappings(pid)
    # The executable first, then libpython: the path only picks which
    # mapping to look at; the file is opened through /proc.
    exe_maps = sorted(m for m in mappings if m[2] == exe)
    lib_maps = sorted(m for m in mappings
                      if "libpython" in os.path.basename(m[2])
                      and m[2] != exe)
    candidates = exe_maps[:1] + lib_maps
    for start, end, path in candidates:
        try:
            fd = _open_image(_proc(pid, "map_files", f"{start:x}-{end:x}"))
        except PermissionError:
            # map_files needs CAP_SYS_ADMIN.  The executable can also be
            # opened through /proc/PID/exe; a library is read where it is
            # loaded.
            if path != exe:
                address = _read_image(
                    pid, f"{path} in its memory", loaded_symbol,
                    lambda at, size: os.pread(mem, size, at), start,
                    SYMBOL)
                if address is not None:
                    return address
                continue
            fd = _open_image(_proc(pid, "exe"))
        except (FileNotFoundError, ProcessLookupError):
            raise _gone(pid) from None
        try:
            found = _read_image(pid, path, dynamic_symbol, fd, SYMBOL)
        finally:
            os.close(fd)
        if found is not None:
            value, e_type = found
            return value + load_bias(e_type, start)
    if not exe_maps and not lib_maps:
        raise RemoteError(f"process {pid} runs {exe}, which it does not "
                          f"map: not a Python process")
    raise RemoteError(f"process {pid} runs {exe}, which has no perf "
                      f"trampolines to switch from outside: start it with "
                      f"-X perf on this interpreter, or, on a stock 3.11, "
                      f"with perftramp311 installed and "
                      f"PYTHONPERFSUPPORT=1")


class _Control:
    """A process, followed by handles that die with it and are never
    reused: a pidfd (where the kernel has them) tells whether it still
    runs, its /proc/PID directory (`directory`, a path through our
    descriptor of it) what its threads do, and its /proc/PID/mem
    descriptor carries every read and write of its control block, to the
    address space it was opened on.  Nothing is opened again by pid
    later."""

    def __init__(self, pid, writable):
        self.pid = pid
        _check_process(pid)
        self.pidfd = _open_pidfd(pid)
        self.fd = self.proc = None
        try:
            try:
                self.proc = os.open(_proc(pid), os.O_RDONLY
                                    | os.O_DIRECTORY | os.O_CLOEXEC)
            except OSError:
                raise RemoteError(f"no such process: {pid}") from None
            self.directory = f"/proc/self/fd/{self.proc}"
            # Opened before anything else is read: what is read after it
            # (maps, images) is of this address space, as long as reads
            # through it still succeed.
            self.fd = _open_mem(pid, writable)
            # A pid is reused only after its process has exited: if the
            # pidfd's process still runs, the pid named it when the
            # directory and mem were opened.
            if not self.alive():
                raise _gone(pid)
            self.address = _control_address(pid, self.fd)
            self.version = self._check()
        except BaseException:
            self.close()
            raise

    def close(self):
        for fd in (self.fd, self.proc, self.pidfd):
            if fd is not None:
                os.close(fd)
        self.fd = self.proc = self.pidfd = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def alive(self):
        """Has the process not exited?"""
        if self.pidfd is not None:
            return not select.select([self.pidfd], [], [], 0)[0]
        return _alive(self.pid, self.directory)

    def _pread(self, offset, size):
        try:
            data = os.pread(self.fd, size, self.address + offset)
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.ESRCH):
                raise _gone(self.pid) from None
            raise RemoteError(f"cannot read process {self.pid}: "
                              f"{exc}") from None
        if len(data) != size:
            raise _gone(self.pid)
        return data

    def _check(self):
        """The control block's version, or RemoteError."""
        magic, version = HEADER.unpack(self._pread(0, HEADER.size))
        if magic != MAGIC or version not in (1, VERSION):
            raise RemoteError(f"process {self.pid}: unknown perf trampoline "
                              f"control block (magic {magic:#x}, version "
                              f"{version})")
        return version

    def read(self):
        """(request, eval_breaker address, handled, active, taken)."""
        data = self._pread(0, V1_SIZE if self.version == 1 else LOG_AT)
        if HEADER.unpack_from(data) != (MAGIC, self.version):
            raise RemoteError(f"process {self.pid}: its perf trampoline "
                              f"control block changed")
        if self.version == 1:
            request, = INT.unpack_from(data, REQUEST_AT)
            taken = 0
        else:
            request, = U64.unpack_from(data, REQUEST_AT)
            taken, = U64.unpack_from(data, TAKEN_AT)
        breaker, = U64.unpack_from(data, BREAKER_AT)
        handled, = U32.unpack_from(data, HANDLED_AT)
        active, = INT.unpack_from(data, ACTIVE_AT)
        return request, breaker, handled, active, taken

    def field(self, offset, kind):
        """The field at `offset` of the control block, read on its own."""
        return kind.unpack(self._pread(offset, kind.size))[0]

    def log(self):
        """(handled, the log's entries, handled again after them)."""
        first = self.field(HANDLED_AT, U32)
        data = self._pread(LOG_AT, LOG_SIZE * OUTCOME.size)
        return first, list(OUTCOME.iter_unpack(data)), \
            self.field(HANDLED_AT, U32)

    def write(self, address, kind, value):
        """Write one value at `address`; RemoteError if the address space
        is gone."""
        try:
            written = os.pwrite(self.fd, kind.pack(value), address)
        except OSError as exc:
            if exc.errno in (errno.EIO, errno.ESRCH):
                raise _gone(self.pid) from None
            raise RemoteError(f"cannot write to process {self.pid}: "
                              f"{exc}") from None
        if written != kind.size:
            raise _gone(self.pid)


# ----------------------------------------------------------------------
# What a blocked target is doing

# Blocking system calls by number, for the "pending" message.
_SYSCALLS = {
    "x86_64": {0: "read", 1: "write", 7: "poll", 23: "select",
               35: "nanosleep", 43: "accept", 44: "sendto",
               45: "recvfrom", 46: "sendmsg", 47: "recvmsg",
               42: "connect", 61: "wait4", 34: "pause", 202: "futex",
               230: "clock_nanosleep", 232: "epoll_wait", 247: "waitid",
               270: "pselect6", 271: "ppoll", 281: "epoll_pwait",
               288: "accept4", 17: "pread64", 19: "readv",
               128: "rt_sigtimedwait", 130: "rt_sigsuspend",
               441: "epoll_pwait2"},
    "aarch64": {63: "read", 64: "write", 65: "readv", 67: "pread64",
                72: "pselect6", 73: "ppoll", 22: "epoll_pwait",
                98: "futex", 101: "nanosleep", 115: "clock_nanosleep",
                133: "rt_sigsuspend", 137: "rt_sigtimedwait",
                202: "accept", 203: "connect", 206: "sendto",
                207: "recvfrom", 211: "sendmsg", 212: "recvmsg",
                242: "accept4", 260: "wait4", 95: "waitid",
                441: "epoll_pwait2"},
}


def _thread_states(control):
    """{tid: one-letter state} of the target's threads."""
    states = {}
    try:
        tids = os.listdir(os.path.join(control.directory, "task"))
    except OSError:
        return states
    for tid in tids:
        fields = _stat_fields(control.directory, tid)
        if fields is not None:
            states[int(tid)] = fields[1][0]
    return states


def _main_thread_doing(control):
    """What the target's main thread is doing, in words."""
    fields = _stat_fields(control.directory, control.pid)
    if fields is None:
        return "its main thread has exited"
    state = fields[1][0]
    if state in ("T", "t"):
        return "it is stopped (by a signal or a debugger)"
    main = os.path.join(control.directory, "task", str(control.pid))
    data = _read_small(os.path.join(main, "syscall"))
    words = data.decode("ascii", "replace").split() if data else []
    wchan = _read_small(os.path.join(main, "wchan"))
    wchan = wchan.decode("ascii", "replace").strip() if wchan else ""
    in_kernel = f", in the kernel's {wchan}()" if wchan not in ("", "0") \
        else ""
    if state == "R" or (words and words[0] == "running"):
        # Only the main interpreter takes requests: a thread running a
        # subinterpreter's code, like one in a long C call, never does.
        return ("its main thread is running, but not the main "
                "interpreter's Python code (a long call into C, or a "
                "subinterpreter)")
    if words and words[0].lstrip("-").isdigit() and int(words[0]) >= 0:
        number = int(words[0])
        name = _SYSCALLS.get(os.uname().machine, {}).get(number)
        call = f"{name}()" if name else f"system call {number}"
        return f"its main thread is blocked in {call}{in_kernel}"
    return f"its main thread is waiting (state {state}{in_kernel})"


# ----------------------------------------------------------------------
# Requests

class Outcome:
    """What became of a request: `state` is "done" (the target acted on it;
    `active` is the backend number it left, `error` the errno of its
    failure, `later` whether another request was acted on since),
    "pending" or "withdrawn" (`doing` says what a blocked target is
    doing), "replaced" (another tool's request took its place before the
    target took it) or "unknown" (the log moved on too far to tell);
    `now` is the backend number on when the tool last looked."""

    def __init__(self, state, active=0, error=0, doing="", later=False,
                 now=0):
        self.state = state
        self.active = active
        self.error = error
        self.doing = doing
        self.later = later
        self.now = now


class _Interrupted(Exception):
    """SIGINT or SIGTERM arrived while main() waited."""


# Signals main() received.  Its handlers only record them, so that no
# exception can come between two writes or in the middle of a withdrawal;
# the wait looks here between its steps.
_signals = []


def _record_signal(signum, frame):
    _signals.append(signum)


def _outcome(control, word, base):
    """What became of request `word`, written when the target had handled
    `base` requests: an Outcome, or None while it is pending or being
    acted on."""
    # In this order: the target logs a request before it takes another,
    # and takes it (`taken`) before `request` can change again; so a word
    # found neither pending nor taken is in the log if it was acted on.
    pending = control.field(REQUEST_AT, U64)
    taken = control.field(TAKEN_AT, U64)
    first, entries, last = control.log()
    now = control.field(ACTIVE_AT, INT)
    # Entry n is overwritten once n + LOG_SIZE is being acted on.
    whole = max(base, last - LOG_SIZE + 1)
    for n in range(whole, first):
        request, active, error = entries[n % LOG_SIZE]
        if request == word:
            return Outcome("done", active, error, later=last > n + 1,
                           now=now)
    if word in (pending, taken):
        return None
    return Outcome("unknown" if whole > base else "replaced", now=now)


def _withdraw(control, word, base, doing):
    """Write the request back to none if it is still ours and pending;
    then what became of it, "withdrawn" if it was never acted on."""
    withdrew = control.field(REQUEST_AT, U64) == word
    if withdrew:
        # (A request another tool writes just before this is lost too: that
        # tool then says its request was replaced.)
        control.write(control.address + REQUEST_AT, U64, REQUEST_NONE)
    # The target decides on a request after saying so in `taken`: once it
    # shows neither, it never acts on it.
    deadline = time.monotonic() + DECIDE_TIMEOUT
    while True:
        outcome = _outcome(control, word, base)
        if outcome is None and time.monotonic() >= deadline:
            return Outcome("pending", doing="it has taken the request and "
                                            "not yet acted on it")
        if outcome is not None:
            if outcome.state == "replaced" and withdrew:
                return Outcome("withdrawn", doing=doing, now=outcome.now)
            return outcome
        time.sleep(POLL_INTERVAL)


def _request(target, request, timeout, withdraw=False, _hook=None):
    """Send `request` to `target` (a pid, or a _Control open for writing)
    and wait up to `timeout` seconds for the process to act; less if it
    is blocked.  Returns an Outcome.  Then the request stays pending, or
    is withdrawn if `withdraw`; it is withdrawn if SIGINT (or, under
    main(), SIGTERM) interrupts the wait.  `_hook`, for tests, is called
    with "checked" between the check of the control block and the first
    write, and with "armed" after the first write of the eval breaker."""
    if isinstance(target, _Control):
        return _send(target, request, timeout, withdraw, _hook)
    with _Control(target, writable=True) as control:
        return _send(control, request, timeout, withdraw, _hook)


def _send(control, request, timeout, withdraw, hook):
    pid = control.pid
    if control.version != VERSION:
        raise RemoteError(f"process {pid} runs an older build of perf "
                          f"trampolines (control block version "
                          f"{control.version}), whose answers cannot be "
                          f"told apart: switch it with the perf_trampoline "
                          f"tool of the Python it runs")
    _, breaker, handled, _, _ = control.read()
    if breaker == 0:
        raise RemoteError(f"process {pid}: its interpreter is not "
                          f"running (starting up or finalized)")
    if hook is not None:
        hook("checked")
    if _signals:
        raise _Interrupted
    # A random tag tells our request from other tools' (a counter in the
    # target could not be taken atomically through /proc/PID/mem).
    word = (int.from_bytes(os.urandom(7), "little") or 1) << 8 | request
    interrupted = False
    try:
        # The request first: on its own it is acted on the next time the
        # interpreter computes its breaker; then the breaker.  A request
        # already pending (left by a tool that was killed) is replaced.
        control.write(control.address + REQUEST_AT, U64, word)
        outcome = _wait(control, word, handled, breaker, timeout, hook)
        if outcome is not None:
            return outcome
    except (_Interrupted, KeyboardInterrupt):
        # (KeyboardInterrupt: a caller other than main(), where it may
        # also come during the withdrawal.)
        interrupted = True
    doing = _main_thread_doing(control)
    if not (withdraw or interrupted):
        return Outcome("pending", doing=doing)
    return _withdraw(control, word, handled,
                     "interrupted" if interrupted else doing)


def _wait(control, word, base, breaker, timeout, hook):
    """The Outcome once the target has decided on request `word`, or None
    when it has not within `timeout` seconds, or has been blocked for
    BLOCKED_AFTER."""
    start = time.monotonic()
    rearm = 0.0
    runnable = start
    while True:
        now = time.monotonic()
        if now >= rearm:
            # The breaker of the address space checked above; setting it
            # again is harmless (one more check for pending work).
            control.write(breaker, INT, 1)
            if hook is not None and rearm == 0.0:
                hook("armed")
            rearm = now + REARM_INTERVAL
            if any(state == "R" for state in
                   _thread_states(control).values()):
                runnable = now
        outcome = _outcome(control, word, base)
        if outcome is not None:
            return outcome
        if now - start >= timeout or now - runnable >= BLOCKED_AFTER:
            return None
        if _signals:
            raise _Interrupted
        time.sleep(POLL_INTERVAL)


def _switch(target, request, timeout, switch):
    outcome = _request(target, REQUESTS[request], timeout)
    if outcome.error:
        pid = getattr(target, "pid", target)
        raise RemoteError(f"process {pid} could not switch perf trampolines "
                          f"{switch}: {_reason(outcome.error)}")
    return outcome.state == "done"


def attach(target, backend="perf", timeout=2.0):
    """Ask process `target` (a pid, or a _Control open for writing) to
    switch perf trampolines on.  Returns True if it did so with this
    request within `timeout` seconds; False if the request is pending or
    another tool's request replaced it."""
    return _switch(target, backend, timeout, "on")


def detach(target, timeout=2.0):
    """Ask process `target` to switch perf trampolines off; as attach()."""
    return _switch(target, "off", timeout, "off")


def status(target):
    """(active backend name or None, a request is pending) of process
    `target` (a pid or a _Control)."""
    if isinstance(target, _Control):
        request, _, _, active, _ = target.read()
    else:
        with _Control(target, writable=False) as control:
            request, _, _, active, _ = control.read()
    return BACKENDS.get(active), request != REQUEST_NONE


def _reason(error):
    if error == errno.EBUSY:
        return "no code object extra slot (PEP 523) is left"
    if error == errno.EINVAL:
        return "this build does not have that backend"
    if error == errno.EOPNOTSUPP:
        return "this build has no perf trampolines"
    return os.strerror(error)
