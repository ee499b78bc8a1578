"""Readers of /proc: a process's state, its threads' stat files, its
mappings, its images and /proc/PID/mem opened without following a path
the target controls, its pid in its own PID namespace; and the tool's
one way of printing a message.
"""

import errno
import os
import sys

from perf_trampoline._elf import ELF_MAX_TABLE, RemoteError

# /proc/PID/stat's flags: a kernel thread.
PF_KTHREAD = 0x00200000


# ----------------------------------------------------------------------
# A process, through /proc

def _proc(pid, *parts):
    return os.path.join("/proc", str(pid), *parts)


def _read_small(path, limit=65536):
    """Up to `limit` bytes of a /proc file, or None if it cannot be
    read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    chunks = []
    size = 0
    try:
        while size < limit:
            chunk = os.read(fd, min(65536, limit - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _stat_fields(directory, tid=None):
    """DIRECTORY[/task/TID]/stat as (comm, [state, ppid, ...]), or None;
    `directory` is a process's in /proc."""
    path = (os.path.join(directory, "stat") if tid is None
            else os.path.join(directory, "task", str(tid), "stat"))
    data = _read_small(path)
    return _parse_stat(data) if data else None


def _parse_stat(data):
    """The bytes of a /proc stat file as (comm, [state, ppid, ...])."""
    # comm is in parentheses and may itself hold ") ".
    head, _, tail = data.decode("ascii", "replace").rpartition(")")
    return head.partition("(")[2], tail.split()


def _alive(pid, directory=None):
    """Has process `pid` (or the one whose /proc directory is `directory`)
    not exited?  (A zombie has.)"""
    fields = _stat_fields(directory or _proc(pid))
    return fields is not None and fields[1][0] not in ("Z", "X")


def _check_process(pid):
    """RemoteError unless `pid` is a live user-space process."""
    if pid <= 0:
        raise RemoteError(f"no such process: {pid}")
    fields = _stat_fields(_proc(pid))
    if fields is None:
        raise RemoteError(f"no such process: {pid}")
    comm, rest = fields
    if int(rest[6]) & PF_KTHREAD:
        raise RemoteError(f"process {pid} ({comm}) is a kernel thread, not "
                          f"a Python process")
    if rest[0] in ("Z", "X"):
        raise RemoteError(f"process {pid} ({comm}) has exited (a zombie "
                          f"its parent has not reaped)")


def _not_permitted(pid):
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f"; kernel.yama.ptrace_scope is {f.read().strip()}"
    except OSError:
        scope = ""
    return (f"not permitted to attach to process {pid}: run as the user "
            f"that owns it with ptrace allowed (kernel.yama.ptrace_scope "
            f"0), or as root with CAP_SYS_PTRACE{scope}")


def _gone(pid):
    return RemoteError(f"process {pid} exited or exec'd another program "
                       f"while the tool looked at it: nothing was written")


def _open_mem(pid, writable):
    try:
        return os.open(_proc(pid, "mem"),
                       (os.O_RDWR if writable else os.O_RDONLY)
                       | os.O_CLOEXEC)
    except (FileNotFoundError, ProcessLookupError):
        raise RemoteError(f"no such process: {pid}") from None
    except PermissionError:
        raise RemoteError(_not_permitted(pid)) from None
    except OSError as exc:
        raise RemoteError(f"cannot open /proc/{pid}/mem: {exc}") from None


def _mappings(pid):
    """[(start, end, path)] of the target's mappings of file offset 0."""
    data = _read_small(_proc(pid, "maps"), ELF_MAX_TABLE)
    if data is None:
        raise RemoteError(f"cannot read /proc/{pid}/maps")
    found = []
    for line in data.decode("utf-8", "surrogateescape").splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) < 6 or int(fields[2], 16) != 0:
            continue
        start, _, end = fields[0].partition("-")
        found.append((int(start, 16), int(end, 16), fields[5]))
    return found


def _open_image(path):
    """A descriptor of a file the target maps, through /proc: never a
    FIFO's blocking open, nor a path the target can replace.  (The /proc
    links are followed to the file the kernel holds; O_NOFOLLOW would
    refuse them.)"""
    return os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)


def _open_pidfd(pid):
    """A pidfd of process `pid`, or None where the kernel has none (before
    Linux 5.3)."""
    try:
        return os.pidfd_open(pid)
    except AttributeError:
        return None
    except OSError as exc:
        if exc.errno == errno.ENOSYS:
            return None
        if exc.errno == errno.ESRCH:
            raise RemoteError(f"no such process: {pid}") from None
        if exc.errno == errno.EINVAL:
            raise RemoteError(f"{pid} is a thread of another process: "
                              f"give the pid of its process") from None
        raise RemoteError(f"cannot follow process {pid}: {exc}") from None


def _innermost_pid(status, pid):
    """The pid of process `pid` in its own PID namespace: the last field
    of NSpid in its /proc status text `status` (`pid` if there is none)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def _namespace_pid(pid):
    data = _read_small(_proc(pid, "status")) or b""
    return _innermost_pid(data.decode("ascii", "replace"), pid)


def _warn(message):
    """Print one of this tool's messages on stderr."""
    print(f"perf_trampoline: {message}", file=sys.stderr)
