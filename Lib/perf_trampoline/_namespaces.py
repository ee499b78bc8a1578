"""Keep the perf maps of processes in containers for reports made later.

A process in its own PID or mount namespace writes /tmp/perf-<N>.map,
N its pid in its PID namespace, in its own /tmp.  perf on the host finds
that file through /proc/<host pid>/root only while the process lives;
once it has exited, perf (6.1 and 6.12 alike) reads /tmp/perf-<host
pid>.map in its own mount namespace.  NamespaceMaps follows such
processes and copies their maps there, so that a report made after they
exited still names their Python functions:

    maps = NamespaceMaps()
    maps.watch(pid)         # False: same namespaces, perf needs no copy
    while recording:
        maps.update()       # every half second or so
    paths = maps.close()    # the last lines, also after the exit

The container's files are only read, through descriptors opened while
the process lives and kept: lines written until its very end are read
after it exited, even once its private /tmp is gone.  Every lookup below
/proc/<pid> goes through a descriptor of that directory (a pid reused
later is never read), no symlink is followed on the way to the file,
and only a regular file is opened for reading.

Only whole lines are copied: the interpreter appends each line with one
write, and a line is whole once its newline is there.  A NUL is in no
map line (the interpreter writes none): a copy stops at the first, and
at MAX_COPY bytes.

Jitdumps (-X perf_jit) are copied to /tmp/jit-<pid>.dump only for a
process in our PID namespace (a private /tmp, as systemd's PrivateTmp).
`perf inject --jit` accepts the dump whose mmap perf record saw,
/tmp/jit-<N>.dump, only if N is the process's pid in its innermost
namespace, which it reads from /proc/<pid>/status; once the process has
exited it takes the host pid, so for a process that had another pid in
its namespace no file name can match (measured with perf 6.12).

Our copies in /tmp are created anew (O_EXCL, never through a link).  A
file already under the name is replaced only if it is a plain file of
ours, with no other link, no live writer (the interpreter's flock), and
was last written before the process started: it was left by a dead host
process that had the pid.  One written since is kept if it holds the
start of the same map (an earlier copy, which is then continued), and
otherwise refused: it is someone else's.
"""

import errno
import fcntl
import os
import signal
import stat
import sys
import time

from perf_trampoline._elf import RemoteError
from perf_trampoline._procfs import _innermost_pid, _parse_stat, _warn

__all__ = ["NamespaceMaps", "MapsError", "save_maps_main"]

# Bytes read from a container's file at a time; a longer line or record
# is taken for a broken file.
CHUNK = 1 << 20
# The most copied of one file: a container can write a map without end,
# and the host's /tmp is often memory.
MAX_COPY = 256 << 20

# jitdump (tools/perf/Documentation/jitdump-specification.txt): a header
# of `header size` bytes, then records, each with a prefix: id, total
# size (prefix included), timestamp.
JITDUMP_MAGIC = 0x4A695444
JIT_CODE_LOAD = 0


class MapsError(RemoteError):
    """A process cannot be followed, or a copy cannot be written."""


def _whole_lines(data, done):
    """Bytes of `data` (the file from offset `done`) that are whole map
    lines: up to the last newline (before a NUL, if there is one)."""
    nul = data.find(b"\0")
    if nul >= 0:
        data = data[:nul]
    return data.rfind(b"\n") + 1


def _whole_records(data, done):
    """Bytes of `data` (the file from offset `done`) that are the jitdump
    header or records up to the end of the last code load (an unwinding
    record goes with the code load after it)."""
    pos = 0
    if done == 0:
        if len(data) < 12:
            return 0
        magic = int.from_bytes(data[0:4], sys.byteorder)
        size = int.from_bytes(data[8:12], sys.byteorder)
        if magic != JITDUMP_MAGIC or not 12 <= size <= len(data):
            return 0
        pos = size
    whole = pos
    while pos + 8 <= len(data):
        kind = int.from_bytes(data[pos:pos + 4], sys.byteorder)
        size = int.from_bytes(data[pos + 4:pos + 8], sys.byteorder)
        if size < 16 or pos + size > len(data):
            break
        pos += size
        if kind == JIT_CODE_LOAD:
            whole = pos
    return whole


def _start_time(stat_data):
    """Wall-clock time a process started, from its /proc stat (start in
    clock ticks after boot, field 22), rounded down to a tick."""
    ticks = int(_parse_stat(stat_data)[1][19])
    hz = os.sysconf("SC_CLK_TCK")
    since_boot = ticks // hz + (ticks % hz) / hz
    return time.time() - (time.clock_gettime(time.CLOCK_BOOTTIME)
                          - since_boot)


def _read_at(name, dir_fd):
    fd = os.open(name, os.O_RDONLY | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        return os.read(fd, 65536)
    finally:
        os.close(fd)


class _Copy:
    """One file a followed process writes, copied to `dest` in /tmp."""

    def __init__(self, name, dest, complete, started, warn):
        self.name = name            # in the container's /tmp
        self.dest = dest
        self.complete = complete    # _whole_lines or _whole_records
        self.started = started
        self.warn = warn
        self.src = -1               # kept open until close()
        self.out = -1
        self.done = 0               # bytes copied: whole lines/records
        self.failed = False
        self.written = False

    def open_source(self, tmp_fd):
        """Open the container's file if the process has written it; a file
        older than the process is another's (it may yet replace it)."""
        if self.src >= 0 or self.failed:
            return
        try:
            # O_PATH opens nothing: a device node's driver is not run, a
            # FIFO not waited on, a symlink is itself, not followed.
            path_fd = os.open(self.name, os.O_PATH | os.O_NOFOLLOW
                              | os.O_CLOEXEC, dir_fd=tmp_fd)
        except OSError:
            return          # not yet
        try:
            st = os.fstat(path_fd)
            if not stat.S_ISREG(st.st_mode) or st.st_mtime < self.started:
                return
            # The same file, now known to be a regular one.
            fd = os.open(f"/proc/self/fd/{path_fd}",
                         os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return
        finally:
            os.close(path_fd)
        try:
            here = os.lstat(self.dest)
        except OSError:
            here = None
        if here is not None and (here.st_dev, here.st_ino) == (st.st_dev,
                                                               st.st_ino):
            # The process shares our /tmp: perf finds the file itself.
            os.close(fd)
            self.failed = True
            return
        self.src = fd

    def copy(self):
        """Copy what the process wrote since the last call."""
        if self.src < 0 or self.failed:
            return
        try:
            while True:
                data = os.pread(self.src, CHUNK, self.done)
                size = self.complete(data, self.done)
                if size == 0:
                    if len(data) == CHUNK:
                        self._fail(f"{self.name}: no whole line or record "
                                   f"in {CHUNK} bytes: copy stopped")
                    return
                if self.out < 0:
                    self._open_dest()
                    if self.out < 0:
                        return
                    continue        # an adopted earlier copy moved `done`
                if self.done + size > MAX_COPY:
                    room = data[:MAX_COPY - self.done]
                    self._append(room[:self.complete(room, self.done)])
                    self._fail(f"{self.name}: larger than {MAX_COPY} bytes: "
                               f"copy stopped")
                    return
                self._append(data[:size])
                if size < len(data) or len(data) < CHUNK:
                    return
        except (OSError, MapsError) as exc:
            self._fail(str(exc))

    def _append(self, data):
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self.out, view):]
        except OSError as exc:
            # Only whole lines or records: cut the partial write off.
            os.ftruncate(self.out, self.done)
            raise MapsError(f"cannot write {self.dest}: {exc}") from None
        self.done += len(data)
        self.written = True

    def _open_dest(self):
        flags = os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
        try:
            self.out = os.open(self.dest, flags | os.O_CREAT | os.O_EXCL,
                               0o600)
        except FileExistsError:
            self._existing(flags)
            return
        fcntl.flock(self.out, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def _existing(self, flags):
        """A file is already at self.dest: see the top of this module."""
        refuse = f"{self.dest} exists and is not ours to replace"
        try:
            fd = os.open(self.dest, flags)
        except OSError as exc:
            # ELOOP: a symlink; ENXIO: a FIFO without a reader.
            raise MapsError(f"{refuse}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
                raise MapsError(f"{refuse} (not a plain file of uid "
                                f"{os.geteuid()})")
            if st.st_nlink != 1:
                raise MapsError(f"{refuse} (it has another hard link)")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise MapsError(f"{refuse} (a live process is writing "
                                f"it)") from None
            if st.st_mtime < self.started:
                # Left by a dead process that had the pid before.
                os.unlink(self.dest)
                os.close(fd)
                fd = -1
                self._open_dest()
                return
            if self._is_earlier_copy(st.st_size):
                os.lseek(fd, 0, os.SEEK_END)
                self.done = st.st_size
                self.out, fd = fd, -1
                return
            raise MapsError(f"{refuse} (written since the process started, "
                            f"and not a copy of its file)")
        finally:
            if fd >= 0:
                os.close(fd)

    def _is_earlier_copy(self, size):
        if size > MAX_COPY:
            return False
        fd = os.open(self.dest, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC
                     | os.O_NONBLOCK)
        try:
            ours = os.pread(fd, size, 0)
        finally:
            os.close(fd)
        theirs = os.pread(self.src, size, 0)
        return (ours == theirs
                and self.complete(theirs, 0) == size)

    def _fail(self, message):
        self.failed = True
        self.warn(message)

    def close(self):
        self.copy()
        for fd in (self.src, self.out):
            if fd >= 0:
                os.close(fd)
        self.src = self.out = -1
        return self.dest if self.written else None


class _Process:
    """A followed process: /proc/<pid> and its /tmp, held open."""

    def __init__(self, pid, proc_fd, nspid, started, warn):
        self.pid = pid
        self.proc_fd = proc_fd
        self.tmp_fd = -1
        self.copies = [_Copy(f"perf-{nspid}.map", f"/tmp/perf-{pid}.map",
                             _whole_lines, started, warn)]
        if nspid == pid:
            self.copies.append(_Copy(f"jit-{nspid}.dump",
                                     f"/tmp/jit-{pid}.dump",
                                     _whole_records, started, warn))

    def alive(self):
        """Has the process not exited?  (A zombie has: its namespaces and
        files are gone.)"""
        try:
            data = _read_at("stat", self.proc_fd)
        except OSError:
            return False
        state = _parse_stat(data)[1]
        return bool(state) and state[0] not in ("Z", "X")

    def update(self):
        if self.alive():
            if self.tmp_fd < 0:
                self.tmp_fd = self._open_tmp()
            if self.tmp_fd >= 0:
                for copy in self.copies:
                    copy.open_source(self.tmp_fd)
        for copy in self.copies:
            copy.copy()

    def _open_tmp(self):
        """The container's /tmp, opened without following a symlink."""
        try:
            root = os.open("root", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC,
                           dir_fd=self.proc_fd)
        except OSError:
            return -1
        try:
            return os.open("tmp", os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW
                           | os.O_CLOEXEC, dir_fd=root)
        except OSError:
            return -1
        finally:
            os.close(root)

    def close(self):
        self.update()
        paths = [copy.close() for copy in self.copies]
        for fd in (self.tmp_fd, self.proc_fd):
            if fd >= 0:
                os.close(fd)
        self.tmp_fd = self.proc_fd = -1
        return [path for path in paths if path]


class NamespaceMaps:
    """Copies of the perf maps of processes in other namespaces, where
    perf on the host looks for them once the processes have exited."""

    def __init__(self, warn=_warn):
        self.warn = warn
        self.processes = {}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def watch(self, pid):
        """Start following process `pid`.  Returns False if it shares our
        PID and mount namespaces (perf reads its /tmp/perf-<pid>.map
        itself), else True.  Raises MapsError if it cannot be followed."""
        if pid in self.processes:
            return True
        if pid <= 0:
            raise MapsError(f"no such process: {pid}")
        try:
            proc_fd = os.open(f"/proc/{pid}", os.O_PATH | os.O_DIRECTORY
                              | os.O_CLOEXEC)
        except FileNotFoundError:
            raise MapsError(f"no such process: {pid}") from None
        try:
            process = self._follow(pid, proc_fd)
        except BaseException:
            os.close(proc_fd)
            raise
        if process is None:
            os.close(proc_fd)
            return False
        self.processes[pid] = process
        process.update()
        return True

    def _follow(self, pid, proc_fd):
        """A _Process for `pid`, or None if it shares our namespaces."""
        try:
            status = _read_at("status", proc_fd).decode("ascii", "replace")
            if "\nState:\tZ" in status:
                raise MapsError(f"process {pid} has exited (a zombie): its "
                                f"files are gone")
            started = _start_time(_read_at("stat", proc_fd))
            theirs = [os.stat(f"ns/{kind}", dir_fd=proc_fd)
                      for kind in ("pid", "mnt")]
        except (FileNotFoundError, ProcessLookupError):
            raise MapsError(f"no such process: {pid}") from None
        except PermissionError:
            raise MapsError(f"not permitted to read the namespaces of "
                            f"process {pid}: run as root or as its "
                            f"owner") from None
        ours = [os.stat(f"/proc/self/ns/{kind}") for kind in ("pid", "mnt")]
        if all((a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)
               for a, b in zip(theirs, ours)):
            return None
        return _Process(pid, proc_fd, _innermost_pid(status, pid), started,
                        self.warn)

    def update(self):
        """Copy what the followed processes wrote since the last call."""
        for process in self.processes.values():
            process.update()

    def running(self):
        """Pids of the followed processes that have not exited."""
        return [pid for pid, process in self.processes.items()
                if process.alive()]

    def close(self):
        """Copy the rest, also of processes that have exited, and stop
        following them.  Returns the paths written in /tmp."""
        paths = []
        for process in self.processes.values():
            paths.extend(process.close())
        self.processes.clear()
        return paths


# ----------------------------------------------------------------------
# python -m perf_trampoline save-maps PID...

POLL_INTERVAL = 0.5


def save_maps_main(pids):
    """Follow `pids` until they exit (or SIGINT/SIGTERM), then print the
    copies' paths.  Exit status: 0, or 2 if a process could not be
    followed or a copy not written."""
    problems = []

    def warn(message):
        problems.append(message)
        _warn(message)

    # The signals are only waited for: one that interrupted a copy
    # between its write and its bookkeeping would copy lines twice.
    stop = {signal.SIGINT, signal.SIGTERM}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, stop)
    try:
        with NamespaceMaps(warn) as maps:
            for pid in pids:
                try:
                    if not maps.watch(pid):
                        print(f"process {pid} shares our PID and mount "
                              f"namespaces: perf reads its "
                              f"/tmp/perf-{pid}.map itself, nothing to "
                              f"save")
                except MapsError as exc:
                    warn(str(exc))
            while maps.running():
                if signal.sigtimedwait(stop, POLL_INTERVAL) is not None:
                    break
                maps.update()
            paths = maps.close()
    finally:
        while signal.sigtimedwait(stop, 0) is not None:
            pass
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    for path in paths:
        print(path)
    return 2 if problems else 0
