"""Switch perf trampolines on or off in a Python process that is running.

    python3.11 -I -m perf_trampoline attach PID [--backend perf|perf_jit]
    python3.11 -I -m perf_trampoline detach PID
    python3.11 -I -m perf_trampoline status PID
    python3.11 -I -m perf_trampoline record [-p PID | -- COMMAND ...]

(record runs perf with the right options and writes reports: see
perf_trampoline._record and "record --help".)

Run it as root with -I (isolated mode): without it, `python -m` puts the
current directory first on sys.path, and a module there would run as root.

Exit status: 0 the process switched (or, for status, was read); 1 this
request has not switched it: it is pending, was withdrawn, or another
tool's replaced it; 2 an error or bad usage; the process was not changed.
"""

import argparse
import os
import signal
import sys

from perf_trampoline._attach import (BACKENDS, BLOCKED_AFTER, LOG_SIZE,
                                     REQUEST_NONE, REQUESTS, _Control,
                                     _Interrupted, _main_thread_doing,
                                     _reason, _record_signal, _request,
                                     _signals)
from perf_trampoline._elf import RemoteError
from perf_trampoline._procfs import _namespace_pid, _warn


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
    """The patch set's version and the interpreter's, for --version; on a
    stock 3.11 this package came with perftramp311, whose version it is."""
    version = getattr(sys, "_perf_trampoline_version", None)
    if version is None:
        from importlib import metadata
        try:
            version = "perftramp311 " + metadata.version("perftramp311")
        except metadata.PackageNotFoundError:
            version = "(none in this Python)"
    return f"perf trampolines {version} on Python {sys.version.split()[0]}"


def _needs_record(argv):
    """Whether parsing `argv` may need record's parser: its import (perf
    script's reports) would be a third of attach's start-up."""
    for arg in argv:
        if arg in ("-h", "--help"):
            return True         # the help lists every command
        if not arg.startswith("-"):
            return arg not in ("attach", "detach", "status", "save-maps")
    return True


def _parser(with_record=True):
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
    if with_record:
        from perf_trampoline import _record
        _record.add_parser(commands, _Formatter)
    return parser, commands


def main(argv=None):
    if argv is None:
        argv = sys.argv[1:]
    parser, commands = _parser(_needs_record(argv))
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


if __name__ == "__main__":
    sys.exit(main())
