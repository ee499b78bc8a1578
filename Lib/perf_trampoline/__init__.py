"""Switch perf trampolines on or off in a Python process that is running.

    python3.11 -I -m perf_trampoline attach PID [--backend perf|perf_jit]
    python3.11 -I -m perf_trampoline detach PID
    python3.11 -I -m perf_trampoline status PID
    python3.11 -I -m perf_trampoline record [-p PID | -- COMMAND ...]

(record runs perf with the right options and writes reports: see
perf_trampoline._record and "record --help".)

Run it as root with -I (isolated mode): without it, `python -m` puts the
current directory first on sys.path, and a module there would run as root.

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

Exit status: 0 the process switched (or, for status, was read); 1 this
request has not switched it: it is pending, was withdrawn, or another
tool's replaced it; 2 an error or bad usage; the process was not changed.
"""

import argparse
import errno
import os
import select
import signal
import stat
import struct
import sys
import time

__all__ = ["attach", "detach", "status", "dynamic_symbol", "loaded_symbol",
           "RemoteError", "ELFError"]

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

# Bounds on what is read of an ELF file the target maps.
ELF_MAX_SECTIONS = 1 << 16
ELF_MAX_TABLE = 64 << 20

# /proc/PID/stat's flags: a kernel thread.
PF_KTHREAD = 0x00200000


class RemoteError(Exception):
    """The request cannot be made; the target was not changed."""


class ELFError(RemoteError):
    """An image the target maps is not an ELF file we can read."""


# ----------------------------------------------------------------------
# The dynamic symbol table of an image, read in bounded pieces

def _read_exact(fd, size, offset, file_size, what):
    if offset < 0 or size < 0 or offset + size > file_size:
        raise ELFError(f"{what}: beyond the end of the file")
    data = os.pread(fd, size, offset)
    if len(data) != size:
        raise ELFError(f"short read of {what}")
    return data


def dynamic_symbol(fd, name):
    """(value, ELF file type) of the dynamic symbol `name` (bytes) in the
    64-bit little-endian ELF file open as `fd`, or None if it has no such
    symbol.  Raises ELFError if `fd` is not a regular file or not an ELF
    file this reads: only the headers, the section headers, .dynsym and
    its string table are read, each checked against the file's size."""
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        raise ELFError("not a regular file")
    size = st.st_size
    header = _read_exact(fd, 64, 0, size, "the ELF header")
    if header[:4] != b"\x7fELF":
        raise ELFError("not an ELF file")
    if header[4] != 2 or header[5] != 1:
        raise ELFError("not a 64-bit little-endian ELF file")
    e_type, = struct.unpack_from("<H", header, 16)
    shoff, = struct.unpack_from("<Q", header, 40)
    shentsize, shnum = struct.unpack_from("<HH", header, 58)
    if shoff == 0:
        return None                     # no section headers: no .dynsym
    if shentsize != 64:
        raise ELFError(f"section header size {shentsize}, not 64")
    if shnum == 0:
        # More sections than e_shnum holds: section 0's sh_size has it.
        first = _read_exact(fd, 64, shoff, size, "section header 0")
        shnum, = struct.unpack_from("<Q", first, 32)
    if shnum > ELF_MAX_SECTIONS:
        raise ELFError(f"{shnum} sections")
    table = _read_exact(fd, shnum * 64, shoff, size, "the section headers")
    sections = list(struct.iter_unpack("<IIQQQQIIQQ", table))
    SHT_STRTAB = 3
    SHT_DYNSYM = 11
    for _, sh_type, _, _, offset, length, link, _, _, entsize in sections:
        if sh_type != SHT_DYNSYM:
            continue
        if entsize != 24 or length % 24:
            raise ELFError(".dynsym has entries that are not 24 bytes")
        if link >= shnum or sections[link][1] != SHT_STRTAB:
            raise ELFError(".dynsym has no string table")
        str_offset, str_length = sections[link][4], sections[link][5]
        if length > ELF_MAX_TABLE or str_length > ELF_MAX_TABLE:
            raise ELFError("the dynamic symbol table is too large")
        symbols = _read_exact(fd, length, offset, size, ".dynsym")
        strings = _read_exact(fd, str_length, str_offset, size, ".dynstr")
        # Names may share tails ("x_name" holds "name"): every place the
        # name ends a string is a possible st_name.
        wanted = name + b"\0"
        places = set()
        at = strings.find(wanted)
        while at >= 0:
            places.add(at)
            at = strings.find(wanted, at + 1)
        if not places:
            return None
        SHN_UNDEF = 0
        for (st_name, _, _, shndx, value,
             _) in struct.iter_unpack("<IBBHQQ", symbols):
            if st_name in places and shndx != SHN_UNDEF and value:
                return value, e_type
        return None
    return None


def _gnu_hash(name):
    h = 5381
    for c in name:
        h = (h * 33 + c) & 0xffffffff
    return h


def loaded_symbol(read, base, name):
    """Address of the dynamic symbol `name` (bytes) in the shared object
    loaded at `base`, found in memory through `read(address, size)`, or
    None.  For a tool without CAP_SYS_ADMIN, which may not open
    /proc/PID/map_files: the loaded image's program headers, dynamic
    section and GNU hash table, each read bounded, instead of the file's
    section headers."""
    def fetch(address, size, what):
        if size > ELF_MAX_TABLE:
            raise ELFError(f"{what} is too large")
        data = read(address, size)
        if len(data) != size:
            raise ELFError(f"{what} is not mapped")
        return data

    header = fetch(base, 64, "the ELF header")
    if header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
        raise ELFError("not a 64-bit little-endian ELF image")
    phoff, = struct.unpack_from("<Q", header, 32)
    phentsize, phnum = struct.unpack_from("<HH", header, 54)
    if phentsize != 56:
        raise ELFError(f"program header size {phentsize}, not 56")
    PT_DYNAMIC = 2
    table = fetch(base + phoff, phnum * 56, "the program headers")
    for p_type, _, _, p_vaddr, _, _, p_memsz, _ in struct.iter_unpack(
            "<IIQQQQQQ", table):
        if p_type == PT_DYNAMIC:
            break
    else:
        return None
    dynamic = {}
    for tag, value in struct.iter_unpack(
            "<qQ", fetch(base + p_vaddr, p_memsz - p_memsz % 16,
                         "the dynamic section")):
        if tag == 0:            # DT_NULL
            break
        dynamic.setdefault(tag, value)
    DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_GNU_HASH = 5, 6, 10, 0x6ffffef5
    if any(tag not in dynamic
           for tag in (DT_STRTAB, DT_SYMTAB, DT_STRSZ, DT_GNU_HASH)):
        return None
    # The dynamic loader may have relocated the addresses in place.
    strtab, symtab, gnu = (value + base if value < base else value
                           for value in (dynamic[DT_STRTAB],
                                         dynamic[DT_SYMTAB],
                                         dynamic[DT_GNU_HASH]))
    strsz = dynamic[DT_STRSZ]
    nbuckets, symoffset, bloom_size, _ = struct.unpack(
        "<IIII", fetch(gnu, 16, "the GNU hash table"))
    if nbuckets == 0:
        return None
    buckets = gnu + 16 + bloom_size * 8
    chains = buckets + nbuckets * 4
    h = _gnu_hash(name)
    index, = struct.unpack("<I", fetch(buckets + h % nbuckets * 4, 4,
                                       "a hash bucket"))
    if index < symoffset:
        return None
    for _ in range(ELF_MAX_TABLE // 24):
        chain, = struct.unpack("<I", fetch(chains + (index - symoffset) * 4,
                                           4, "a hash chain"))
        if chain | 1 == h | 1:
            st_name, _, _, shndx, value, _ = struct.unpack(
                "<IBBHQQ", fetch(symtab + index * 24, 24, "a symbol"))
            if st_name + len(name) < strsz and shndx != 0 and value:
                if fetch(strtab + st_name, len(name) + 1,
                         "a symbol name") == name + b"\0":
                    return value + base
        if chain & 1:
            return None
        index += 1
    raise ELFError("a hash chain without end")


# ----------------------------------------------------------------------
# The target: its state, its images, its control block

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
            ET_DYN = 3
            return value + start if e_type == ET_DYN else value
    if not exe_maps and not lib_maps:
        raise RemoteError(f"process {pid} runs {exe}, which it does not "
                          f"map: not a Python process")
    raise RemoteError(f"process {pid} runs {exe}, which has no perf "
                      f"trampolines: it is not a CPython 3.11 built with "
                      f"them")


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


# ----------------------------------------------------------------------
# Command line

def _describe(pid, backend):
    if backend is None:
        return f"process {pid}: perf trampolines are off"
    return f"process {pid}: perf trampolines are on (backend {backend})"


EPILOG = """\
Run as root in isolated mode, so that nothing in the current directory is
imported:  python3.11 -I -m perf_trampoline attach PID

The process is never stopped: the request is written through /proc/PID/mem
and acted on the next time the process runs Python code.  Exit status: 0
switched (status: read), 1 not switched by this request (pending,
withdrawn, or replaced by another tool's), 2 error (the process was not
changed) or usage error: without a command this help goes to stderr;
"COMMAND --help" describes each command.
"""


class _Formatter(argparse.RawDescriptionHelpFormatter):
    """argparse's, with the terminal's width found without shutil: its
    import (with bz2 and lzma) was a third of the tool's start-up."""

    def __init__(self, prog):
        try:
            width = os.get_terminal_size(sys.__stdout__.fileno()).columns
        except (AttributeError, ValueError, OSError):
            width = 80
        super().__init__(prog, width=width - 2)


def _version():
    """The patch set's version and the interpreter's, for --version."""
    return (f"perf trampolines {sys._perf_trampoline_version} on Python "
            f"{sys.version.split()[0]}")


def _parser():
    """The command line's parser, and its subparsers action."""
    parser = argparse.ArgumentParser(
        prog="python3.11 -I -m perf_trampoline",
        description="Switch perf trampolines on or off in a running "
                    "Python process, so that perf shows its Python "
                    "functions.",
        epilog=EPILOG, formatter_class=_Formatter)
    parser.add_argument("--version", action="version", version=_version(),
                        help="print the versions of the perf trampolines "
                             "and of Python, and exit")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND",
                                     title="commands")
    pid_help = "the process: a CPython 3.11 with perf trampolines"
    for name, text in (("attach", "switch perf trampolines on"),
                       ("detach", "switch them off"),
                       ("status", "tell whether they are on")):
        command = commands.add_parser(name, help=text, description=text,
                                      formatter_class=_Formatter)
        command.add_argument("pid", type=int, help=pid_help)
        if name == "attach":
            command.add_argument("--backend", choices=["perf", "perf_jit"],
                                 default="perf",
                                 help="perf: a perf map, for perf record "
                                      "-g (frame pointers); perf_jit: a "
                                      "jitdump, for perf inject --jit "
                                      "(default: perf)")
        if name != "status":
            command.add_argument("--timeout", type=float, default=2.0,
                                 help="seconds to wait for a running "
                                      "process to act (default: 2; a "
                                      "blocked one is given "
                                      f"{BLOCKED_AFTER:g} s)")
            command.add_argument("--no-wait", action="store_true",
                                 help="withdraw the request if the process "
                                      "has not acted on it by then, "
                                      "instead of leaving it pending")
    text = ("copy the perf maps of processes in containers to /tmp, where "
            "perf looks once they have exited; follow them until then")
    commands.add_parser("save-maps", help=text, description=text,
                        formatter_class=_Formatter).add_argument(
                            "pid", type=int, nargs="+",
                            help="the processes whose maps to copy")
    from perf_trampoline import _record
    _record.add_parser(commands, _Formatter)
    return parser, commands


def main(argv=None):
    parser, commands = _parser()
    args, extra = parser.parse_known_args(argv)
    if args.command is None:
        if extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
        parser.print_help(sys.stderr)
        return 2
    if extra:
        # argparse would say so with the top-level usage.
        commands.choices[args.command].error(
            f"unrecognized arguments: {' '.join(extra)}")
    if args.command == "save-maps":
        from perf_trampoline._namespaces import save_maps_main
        return save_maps_main(args.pid)
    if args.command == "record":
        from perf_trampoline import _record
        return _record.run(args)
    pid = args.pid
    try:
        if args.command == "status":
            with _Control(pid, writable=False) as control:
                request, _, _, active, _ = control.read()
                line = _describe(pid, BACKENDS.get(active))
                if request != REQUEST_NONE:
                    line += (f"; a request is pending: "
                             f"{_main_thread_doing(control)}")
            print(line)
            return 0
        request = REQUESTS[args.backend if args.command == "attach"
                           else "off"]
        _signals.clear()
        handlers = {signum: signal.signal(signum, _record_signal)
                    for signum in (signal.SIGINT, signal.SIGTERM)}
        try:
            outcome = _request(pid, request, args.timeout, args.no_wait)
        finally:
            for signum, handler in handlers.items():
                signal.signal(signum, handler)
    except RemoteError as exc:
        _warn(exc)
        return 2
    except (_Interrupted, KeyboardInterrupt):
        _warn(f"interrupted before anything was written to process {pid}")
        return 2
    now = BACKENDS.get(outcome.now)
    now = f"now on (backend {now})" if now else "now off"
    if outcome.state == "withdrawn":
        print(f"process {pid}: request withdrawn ({outcome.doing}); it "
              f"changed nothing")
        return 1
    if outcome.state == "replaced":
        print(f"process {pid}: another tool's request replaced this one "
              f"before the process took it, so this one changed nothing; "
              f"perf trampolines are {now}")
        return 1
    if outcome.state == "unknown":
        print(f"process {pid}: it acted on more than {LOG_SIZE} requests "
              f"meanwhile, so what became of this one is not known; perf "
              f"trampolines are {now}")
        return 1
    if outcome.state == "pending":
        print(f"process {pid}: request pending: {outcome.doing}; the "
              f"request takes effect when it next runs Python code "
              f"('status {pid}' tells when it has)")
        return 1
    if outcome.error:
        switch = "off" if request == REQUESTS["off"] else "on"
        _warn(f"process {pid} could not switch perf trampolines {switch}: "
              f"{_reason(outcome.error)}")
        return 2
    backend = BACKENDS.get(outcome.active)
    print(_describe(pid, backend))
    if outcome.later:
        print(f"another request has been acted on since: perf trampolines "
              f"are {now}")
    nspid = _namespace_pid(pid)
    if backend is not None and nspid != pid:
        print(f"it is pid {nspid} in its own PID namespace: its files are "
              f"/tmp/*-{nspid}.* in its mount namespace")
    if backend == "perf":
        print(f"profile it with: perf record -g -p {pid}")
    elif backend == "perf_jit":
        print(f"profile it with: perf record -k 1 --call-graph dwarf "
              f"-p {pid}, then perf inject --jit")
    return 0
