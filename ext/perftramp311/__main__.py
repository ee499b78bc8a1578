"""Run a program with perf trampolines switched on, as the interpreter
would run it, or record it with perf_trampoline's record."""

import argparse
import os
import runpy
import sys
import types

import perftramp311

PROG = "python3.11 -m perftramp311"
PROGRAM_USAGE = "PROGRAM [ARG...]"
PROGRAMS = "app.py, -m MODULE or -c COMMAND"
RUN_EPILOG = f"""\
PROGRAM is {PROGRAMS}, as the interpreter takes
them; its own arguments follow it, its -m and -c included.  A script
named "record" runs as ./record.  To record the program with perf, and
get its flame graphs:

  {PROG} record [options] {PROGRAM_USAGE}

which is python3.11 -m perf_trampoline record [options] -- python3.11
{PROGRAM_USAGE} ("{PROG} record --help" lists the options).

Exit status: the program's; 2 for a usage error or a program that cannot
be found.
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
# record: perf_trampoline's, the program run by this interpreter

def record(argv):
    """`record [options] PROGRAM [ARG...]` is `python3.11 -m
    perf_trampoline record [options] -- python3.11 PROGRAM [ARG...]`."""
    from perf_trampoline import __main__ as tools
    _, commands = tools._parser()
    parser = commands.choices["record"]
    with_value = {option for action in parser._actions if action.nargs != 0
                  for option in action.option_strings}
    ours, program = _split(argv, with_value)
    if {"-h", "--help"} & set(ours):
        print(f"{PROG} record [options] {PROGRAM_USAGE} is\n"
              f"python3.11 -m perf_trampoline record [options] -- "
              f"python3.11 {PROGRAM_USAGE}:\n", flush=True)
    # Its usage errors (exit 2) before the program is looked for.
    parser.parse_args(ours)
    if program:
        try:
            _check_program(program)
        except ProgramError as exc:
            print(f"perftramp311: {exc}", file=sys.stderr)
            return 2
        ours += ["--", sys.executable, *program]
    return tools.main(["record", *ours])


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
        return record(argv[1:])
    return run(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
