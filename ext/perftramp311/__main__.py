"""Run a program with perf trampolines switched on, as the interpreter
would run it, or record it under perf's DWARF unwinder."""

import argparse
import os
import runpy
import signal
import subprocess
import sys
import types

import perftramp311

PROG = "python3.11 -m perftramp311"
PROGRAM_USAGE = "PROGRAM [ARG...]"
PROGRAMS = "app.py, -m MODULE or -c COMMAND"
RUN_EPILOG = f"""\
PROGRAM is {PROGRAMS}, as the interpreter takes
them; its own arguments follow it, its -m and -c included.  A script
named "record" runs as ./record; to record the program with perf:

  {PROG} record --help

Exit status: the program's; 2 for a usage error or a program that cannot
be found.
"""
RECORD_EPILOG = f"""\
PROGRAM is {PROGRAMS}, as for {PROG}.

Runs perf record -k 1 --call-graph dwarf -e cpu-clock on the program
(PYTHONPERFSUPPORT=1), then perf inject --jit, which needs perf 6.8 or
newer ($PERF, else perf on the PATH): DIR/perf.data is ready for perf
report, which stderr says; stdout is the program's own.  DIR (default:
perf-record-YYYYmmdd-HHMMSS here) is checked as perf_trampoline record
checks it: one holding a perf.data is refused unless --force, as is one
reached through a symbolic link, or that another user could write in.

Exit status: the program's (128+N if signal N killed it); 2 for bad
input or an error, said in one line.
"""


def _version():
    return (f"perftramp311 {perftramp311.__version__} on Python "
            f"{sys.version.split()[0]}")


def _split(argv, with_value):
    """(our options, the program and its arguments): ours end at the
    first word that is not an option, at -m or -c (the program's, which
    argparse would take for ours), or after --."""
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return argv[:i], argv[i + 1:]
        if arg in ("-m", "-c") or not arg.startswith("-"):
            break
        i += 2 if arg in with_value else 1
    return argv[:i], argv[i:]


def _parse(parser, argv, with_value):
    """The parsed options, with the program in .program; a usage error
    (exit 2) if there is none (and no --status)."""
    ours, program = _split(argv, with_value)
    args = parser.parse_args(ours)
    if getattr(args, "status", False):
        return args
    if not program:
        parser.error(f"give the program to run: {PROGRAMS}")
    if program[0] in ("-m", "-c") and len(program) < 2:
        parser.error(f"argument {program[0]}: expected one argument")
    args.program = program
    return args


class ProgramError(Exception):
    """The program cannot be found; one line, exit status 2."""


def _check_program(program):
    """ProgramError unless the script is a file that can be read, or the
    module's top-level package can be found, as the interpreter would
    find it (the current directory first); -c is not checked."""
    if program[0] == "-c":
        return
    if program[0] == "-m":
        # Our sys.path is the program's: python -m put the current
        # directory first.  A submodule is left to the program: finding
        # it would import its package here.
        import importlib.util
        top = program[1].partition(".")[0]
        if importlib.util.find_spec(top) is None:
            raise ProgramError(f"no module named {top!r}")
        return
    path = os.path.abspath(program[0])
    try:
        with open(path, "rb"):
            pass
    except OSError as exc:
        raise ProgramError(f"can't open file {path!r}: "
                           f"{exc.strerror}") from None
    if os.path.isdir(path) and not os.path.exists(
            os.path.join(path, "__main__.py")):
        raise ProgramError(f"can't find '__main__' module in {path!r}")


# ----------------------------------------------------------------------
# record

def record_parser():
    from perf_trampoline._record import DEFAULT_HZ
    parser = argparse.ArgumentParser(
        prog=f"{PROG} record",
        usage=f"%(prog)s [options] {PROGRAM_USAGE}",
        description="Record the program with perf, its Python functions "
                    "named.",
        epilog=RECORD_EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-o", "--output", metavar="DIR",
                        help="the directory to write perf.data into")
    parser.add_argument("-F", "--freq", type=int, default=DEFAULT_HZ,
                        metavar="HZ",
                        help=f"samples per second (default {DEFAULT_HZ})")
    parser.add_argument("--force", action="store_true",
                        help="overwrite the perf.data in DIR")
    parser.add_argument("--perf", metavar="PATH",
                        help="the perf to run (default: $PERF, else perf "
                             "on PATH)")
    return parser


def _run_perf(perf, out, args):
    """perf record on the program; the CompletedProcess."""
    from perf_trampoline import _record
    # Ctrl-C reaches perf and the program, and us: a handler, not SIG_IGN,
    # which they would inherit, keeps us waiting while perf writes its
    # data.  (perf_trampoline record keeps perf out of the terminal's
    # process group with an exec helper; the second exec loses the
    # Python frames of a shared libpython's process, pyenv's, at random.)
    handler = signal.signal(signal.SIGINT, lambda signum, frame: None)
    try:
        # -k 1: the jitdump's timestamps are CLOCK_MONOTONIC.  perf
        # writes by path: the directory and those above it are checked
        # already, so no other user can put a link on the way.
        return subprocess.run(
            [perf, "record", "-k", "1", "--call-graph", "dwarf",
             "-e", "cpu-clock", "-F", str(args.freq),
             "-o", out.join(_record.RAW_NAME),
             sys.executable, *args.program],
            env=dict(os.environ, PYTHONPERFSUPPORT="1"))
    finally:
        signal.signal(signal.SIGINT, handler)


def record(argv):
    # perf_trampoline (installed with this package) records for the
    # patched interpreter: its checks of perf and of the output directory
    # and its perf inject are used as they are.
    from perf_trampoline import _record, _reports
    parser = record_parser()
    args = _parse(parser, argv, {"-o", "--output", "-F", "--freq",
                                 "--perf"})
    if args.freq <= 0:
        parser.error("-F HZ must be a positive number")
    try:
        _check_program(args.program)
        perf = _record.find_perf(args.perf, jit=True)
        out = _record._out_dir(args)
    except (ProgramError, _record.RecordError) as exc:
        print(f"perftramp311: {exc}", file=sys.stderr)
        return 2
    with out:
        # What a failed perf inject left is not this recording.
        out.unlink(_record.RAW_NAME)
        proc = _run_perf(perf, out, args)
        # perf ends as its command did: killed by its signal, too.
        status = proc.returncode
        if status < 0:
            print(f"perftramp311: the program was killed by "
                  f"{_record._signal_name(-status)}", file=sys.stderr)
            status = 128 - status
        if not out.exists(_record.RAW_NAME):
            print(f"perftramp311: perf record wrote no "
                  f"{out.join(_record.RAW_NAME)} (exit {status})",
                  file=sys.stderr)
            return 2
        try:
            _record.inject(perf, out)
        except _record.RecordError as exc:
            print(f"perftramp311: {exc}", file=sys.stderr)
            return exc.status
        data = out.join(_reports.DATA_NAME)
    print(f"perftramp311: perf report -i {data}", file=sys.stderr)
    return status


# ----------------------------------------------------------------------
# Running a program

def run_parser():
    parser = argparse.ArgumentParser(
        prog=PROG, usage=f"%(prog)s [options] {PROGRAM_USAGE}",
        description="Run the program with perf trampolines switched on,\n"
                    "as the interpreter would run it.",
        epilog=RUN_EPILOG, allow_abbrev=False,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--backend", choices=["perf_jit", "perf"],
                        default="perf_jit",
                        help="perf_jit: a jitdump with unwind tables, for "
                             "perf's DWARF unwinder (the default); perf: "
                             "a perf map, which needs frame pointers")
    parser.add_argument("--status", action="store_true",
                        help="say what is switched on here, and exit")
    parser.add_argument("--version", action="version", version=_version())
    return parser


def run(argv):
    args = _parse(run_parser(), argv, {"--backend"})
    if args.status:
        print(perftramp311.status())
        return 0
    if perftramp311.REFUSED is not None:
        print(perftramp311.REFUSED, file=sys.stderr)
        return 2
    try:
        _check_program(args.program)
    except ProgramError as exc:
        print(f"perftramp311: {exc}", file=sys.stderr)
        return 2
    backend, program = args.backend, args.program
    if program[0] == "-m":
        sys.argv = program[1:]
        perftramp311.activate(backend)
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    elif program[0] == "-c":
        # As python -c: argv[0] is "-c", the current directory first on
        # the path, the code in __main__'s namespace.
        sys.argv = ["-c", *program[2:]]
        sys.path[0] = ""
        code = compile(program[1], "<string>", "exec")
        module = types.ModuleType("__main__")
        sys.modules["__main__"] = module
        perftramp311.activate(backend)
        exec(code, module.__dict__)
    else:
        # As the interpreter runs a script: its directory first on the
        # path, its code named by its absolute path.
        path = os.path.abspath(program[0])
        sys.argv = program
        sys.path[0] = os.path.dirname(path)
        perftramp311.activate(backend)
        runpy.run_path(path, run_name="__main__")
    return 0


def main(argv):
    if argv[:1] == ["record"]:
        if perftramp311.REFUSED is not None:
            print(perftramp311.REFUSED, file=sys.stderr)
            return 2
        return record(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
