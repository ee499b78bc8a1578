"""Switch perf trampolines on or off in a Python process that is running.

    python3.11 -m perf_trampoline attach PID [--backend perf|perf_jit]
    python3.11 -m perf_trampoline detach PID
    python3.11 -m perf_trampoline status PID

The target must be this patched CPython 3.11 (any build with perf
trampolines; it need not have been started with -X perf).  Nothing runs
inside it on our behalf at an arbitrary point: gdb stops the process for a
moment, writes a request into the interpreter's _PyPerf_remote and sets the
main interpreter's eval breaker, and detaches.  The interpreter acts on the
request the next time one of its threads checks the eval breaker (between
bytecode instructions), exactly as sys.activate_stack_trampoline() would.
A target blocked in a system call acts on it when it next runs Python code;
the request stays pending until then.

Reading the target's state needs only /proc/PID/mem, with the same
permission gdb needs to attach (ptrace).
"""

import argparse
import errno
import os
import shutil
import struct
import subprocess
import sys
import time

__all__ = ["attach", "detach", "status", "RemoteError"]

SYMBOL = b"_PyPerf_remote"
MAGIC = 0x46505950
VERSION = 1
# struct _PyPerf_RemoteControl (Include/internal/pycore_perf.h)
CONTROL = struct.Struct("<IIiiQIii")
REQUEST_OFFSET = 8
REQUESTS = {"perf": 1, "perf_jit": 2, "off": 3}
BACKENDS = {1: "perf", 2: "perf_jit"}

GDB_TIMEOUT = 60


class RemoteError(Exception):
    """The request cannot be made; the target was not changed."""


# ----------------------------------------------------------------------
# Finding _PyPerf_remote in the target

def _dynamic_symbol(path, name):
    """(value, ELF type) of the dynamic symbol `name` in the 64-bit
    little-endian ELF file `path`, or None."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    e_type, = struct.unpack_from("<H", data, 16)
    shoff, = struct.unpack_from("<Q", data, 40)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    sections = []
    for i in range(shnum):
        at = shoff + i * shentsize
        (_, sh_type, _, _, offset, size, link,
         _, _, entsize) = struct.unpack_from("<IIQQQQIIQQ", data, at)
        sections.append((sh_type, offset, size, link, entsize))
    SHT_DYNSYM = 11
    for sh_type, offset, size, link, entsize in sections:
        if sh_type != SHT_DYNSYM or entsize == 0:
            continue
        strtab = sections[link][1]
        for at in range(offset, offset + size, entsize):
            st_name, _, _, _, st_value, _ = struct.unpack_from(
                "<IBBHQQ", data, at)
            end = data.find(b"\0", strtab + st_name)
            if data[strtab + st_name:end] == name and st_value:
                return st_value, e_type
    return None


def _mapped_files(pid):
    """{path: lowest address mapping its offset 0} of the target."""
    files = {}
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) < 6 or not fields[5].startswith("/"):
                continue
            start = int(fields[0].split("-")[0], 16)
            path = fields[5].rstrip("\n")
            if int(fields[2], 16) == 0:
                files[path] = min(start, files.get(path, start))
    return files


def _control_address(pid):
    """Address of _PyPerf_remote in the target, or RemoteError."""
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        files = _mapped_files(pid)
    except FileNotFoundError:
        raise RemoteError(f"no such process: {pid}") from None
    except PermissionError:
        raise RemoteError(_not_permitted(pid)) from None
    candidates = [exe] + [path for path in files
                          if "libpython" in os.path.basename(path)]
    for path in candidates:
        found = _dynamic_symbol(path, SYMBOL)
        if found is None or path not in files:
            continue
        value, e_type = found
        ET_DYN = 3
        return value + files[path] if e_type == ET_DYN else value
    raise RemoteError(f"process {pid} runs {exe}: this interpreter has no "
                      f"perf trampolines (it is not a CPython 3.11 built "
                      f"with them)")


def _not_permitted(pid):
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            scope = f"; kernel.yama.ptrace_scope is {f.read().strip()}"
    except OSError:
        scope = ""
    return (f"not permitted to attach to process {pid}: run as the user "
            f"that owns it with ptrace allowed (kernel.yama.ptrace_scope "
            f"0), or as root with CAP_SYS_PTRACE{scope}")


def _read_control(pid, address):
    """(request, eval_breaker address, handled, active, error)."""
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(address)
            data = mem.read(CONTROL.size)
    except FileNotFoundError:
        raise RemoteError(f"no such process: {pid}") from None
    except PermissionError:
        raise RemoteError(_not_permitted(pid)) from None
    except OSError as exc:
        if exc.errno == errno.ESRCH:
            raise RemoteError(f"no such process: {pid}") from None
        raise RemoteError(f"cannot read process {pid}: {exc}") from None
    if len(data) != CONTROL.size:
        raise RemoteError(f"cannot read process {pid}: short read")
    magic, version, request, _, breaker, handled, active, error = \
        CONTROL.unpack(data)
    if magic != MAGIC or version != VERSION:
        raise RemoteError(f"process {pid}: unknown perf trampoline control "
                          f"block (magic {magic:#x}, version {version})")
    return request, breaker, handled, active, error


# ----------------------------------------------------------------------
# Requests

def _write_request(pid, address, breaker, request):
    """Have gdb write the request and set the eval breaker."""
    gdb = shutil.which("gdb")
    if gdb is None:
        raise RemoteError("gdb is needed to attach to a process and is not "
                          "installed (Debian: apt-get install gdb)")
    commands = [
        "set auto-load off",
        f"set var *(int *){address + REQUEST_OFFSET:#x} = {request}",
        f"set var *(int *){breaker:#x} = 1",
        "detach",
    ]
    args = [gdb, "-nx", "-batch", "-iex", "set debuginfod enabled off",
            "-iex", "set auto-solib-add off", "-p", str(pid)]
    for command in commands:
        args += ["-ex", command]
    try:
        proc = subprocess.run(args, stdin=subprocess.DEVNULL,
                              stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True,
                              errors="replace", timeout=GDB_TIMEOUT)
    except subprocess.TimeoutExpired:
        raise RemoteError(f"gdb did not finish within {GDB_TIMEOUT} s")
    output = proc.stdout
    if "Operation not permitted" in output:
        raise RemoteError(_not_permitted(pid))
    if "No such process" in output:
        raise RemoteError(f"no such process: {pid}")
    if proc.returncode != 0 or "Cannot access memory" in output:
        raise RemoteError(f"gdb could not write to process {pid}:\n"
                          f"{output.strip()}")


def _request(pid, request, timeout):
    """Send `request`; wait up to `timeout` seconds for the target to act.
    Returns (done, active backend number, errno of the outcome)."""
    address = _control_address(pid)
    _, breaker, handled, _, _ = _read_control(pid, address)
    if breaker == 0:
        raise RemoteError(f"process {pid}: its interpreter is not running "
                          f"(starting up or finalized)")
    _write_request(pid, address, breaker, request)
    deadline = time.monotonic() + timeout
    while True:
        pending, _, now_handled, active, error = _read_control(pid, address)
        if now_handled != handled and pending == 0:
            return True, active, error
        if time.monotonic() >= deadline:
            return False, active, 0
        time.sleep(0.01)


def attach(pid, backend="perf", timeout=2.0):
    """Ask process `pid` to switch perf trampolines on.  Returns True if
    it did within `timeout` seconds, False if the request is pending."""
    done, active, error = _request(pid, REQUESTS[backend], timeout)
    if error:
        raise RemoteError(f"process {pid} could not switch perf trampolines "
                          f"on: {_reason(error)}")
    return done


def detach(pid, timeout=2.0):
    """Ask process `pid` to switch perf trampolines off; as attach()."""
    done, _, error = _request(pid, REQUESTS["off"], timeout)
    if error:
        raise RemoteError(f"process {pid} could not switch perf trampolines "
                          f"off: {_reason(error)}")
    return done


def status(pid):
    """(active backend name or None, a request is pending)."""
    request, _, _, active, _ = _read_control(pid, _control_address(pid))
    return BACKENDS.get(active), request != 0


def _reason(error):
    if error == errno.EBUSY:
        return ("another frame evaluation function (PEP 523) is installed, "
                "or no code object extra slot is left")
    if error == errno.EINVAL:
        return "this build does not have that backend"
    if error == errno.EOPNOTSUPP:
        return "this build has no perf trampolines"
    return os.strerror(error)


# ----------------------------------------------------------------------
# Command line

def _describe(pid, backend, pending):
    if pending:
        return f"process {pid}: request pending"
    if backend is None:
        return f"process {pid}: perf trampolines are off"
    return f"process {pid}: perf trampolines are on (backend {backend})"


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m perf_trampoline",
        description="Switch perf trampolines on or off in a running "
                    "Python process, so that perf shows its Python "
                    "functions.")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, text in (("attach", "switch perf trampolines on"),
                       ("detach", "switch them off"),
                       ("status", "tell whether they are on")):
        command = commands.add_parser(name, help=text, description=text)
        command.add_argument("pid", type=int)
        if name == "attach":
            command.add_argument("--backend", choices=["perf", "perf_jit"],
                                 default="perf")
        if name != "status":
            command.add_argument("--timeout", type=float, default=2.0,
                                 help="seconds to wait for the process to "
                                      "act (default: 2)")
    args = parser.parse_args(argv)
    try:
        if args.command == "status":
            backend, pending = status(args.pid)
            print(_describe(args.pid, backend, pending))
            return 0
        if args.command == "attach":
            done = attach(args.pid, args.backend, args.timeout)
        else:
            done = detach(args.pid, args.timeout)
        if not done:
            print(f"process {args.pid}: request pending: it has not run "
                  f"Python code for {args.timeout:g} s (blocked in a system "
                  f"call?); it switches when it next does")
            return 0
        backend, _ = status(args.pid)
    except RemoteError as exc:
        print(f"perf_trampoline: {exc}", file=sys.stderr)
        return 1
    print(_describe(args.pid, backend, False))
    if backend == "perf":
        print(f"profile it with: perf record -g -p {args.pid}")
    elif backend == "perf_jit":
        print(f"profile it with: perf record -k 1 --call-graph dwarf "
              f"-p {args.pid}, then perf inject --jit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
