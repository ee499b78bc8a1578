"""Helpers shared by the tools: each written once, here.

The Python tools import it (they run as scripts from tools/, which is then
sys.path[0]).  The shell scripts use it through its command line, by way
of lib.sh's `tooling PYTHON COMMAND ...`:

    tooling.py clean-exec [NAME=VALUE ...] COMMAND [ARG ...]
        Replace this process with COMMAND, run without the caller's
        PYTHON* variables (but with the NAME=VALUE given) and with SIGINT
        and SIGQUIT at their usual actions.
    tooling.py profiler-snapshot FILE
        Write the profiler files now in /tmp to FILE, one a line.
    tooling.py remove-profiler-files FILE
        Remove the profiler files that are not in FILE (a snapshot), belong
        to this user and whose process has exited; print how many.

Any Python 3.8 or newer runs it, the interpreter under test included.
"""

import glob
import os
import re
import signal
import sys
import xml.etree.ElementTree as ET

# perf maps (-X perf), jitdumps (-X perf_jit) and the objects that
# `perf inject --jit` makes from them.  perf reads them at report time, so
# the processes that write them never remove them.
PROFILER_FILES = ("/tmp/perf-*.map", "/tmp/jit-*.dump", "/tmp/jitted-*.so")
# The pid in perf-<pid>.map, jit-<pid>.dump and jitted-<pid>-<n>.so.
PROFILER_PID = re.compile(r"(?:perf|jit|jitted)-(\d+)[.-]")
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


# ---- environment and signals ---------------------------------------------

def python_variables():
    """The names of the PYTHON* variables in this process's environment."""
    return sorted(name for name in os.environ if name.startswith("PYTHON"))


def clean_environment(extra=None):
    """os.environ without the PYTHON* variables, plus `extra`.

    What a caller exported (PYTHONPERFSUPPORT, PYTHONUNBUFFERED,
    PYTHONPATH, ...) changes what an interpreter does and what tests see:
    the tools run interpreters with their defaults and say what they set."""
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PYTHON")}
    env.update(extra or {})
    return env


def restore_signals():
    """Give SIGINT and SIGQUIT their usual actions back, here and in every
    program this process runs from now on.

    A shell started in the background (cmd &, nohup, CI runners) hands its
    children both ignored, an ignored signal stays ignored across exec, and
    a Python started with SIGINT ignored never raises KeyboardInterrupt:
    every test about it fails.  Bash cannot undo that; this can.  A signal
    with a handler gets its default action at exec."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def clean_exec(args):
    """`clean-exec [NAME=VALUE ...] COMMAND [ARG ...]` (see the top)."""
    extra = {}
    while args and ASSIGNMENT.match(args[0]):
        name, _, value = args.pop(0).partition("=")
        extra[name] = value
    if not args:
        usage()
    restore_signals()
    try:
        os.execvpe(args[0], args, clean_environment(extra))
    except OSError as exc:
        sys.exit(f"tooling: cannot run {args[0]}: {exc}")


# ---- JUnit files of regrtest ---------------------------------------------

def junit_cases(path):
    """[(test id, "ok" | "failed" | "skipped")], one per test case of the
    JUnit file regrtest wrote (--junit-xml), or None when there is no
    complete file (a runner that crashed or was killed).  A case regrtest
    ran again (-w) has the outcome of its last run; rerun_cases() names
    those that failed first."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return None
    last = {}
    for name, outcome in _junit_runs(tree):
        last.pop(name, None)        # keep the order of the last runs
        last[name] = outcome
    return list(last.items())


def rerun_cases(path):
    """Test ids that failed and then passed when regrtest ran them again
    (-w): flaky, and shown as such."""
    try:
        tree = ET.parse(path)
    except (OSError, ET.ParseError):
        return []
    failed = set()
    passed_again = []
    for name, outcome in _junit_runs(tree):
        if outcome == "failed":
            failed.add(name)
        elif name in failed:
            passed_again.append(name)
    return passed_again


def _junit_runs(tree):
    """(test id, outcome) of every <testcase>, in the file's order."""
    cases = []
    for case in tree.iter("testcase"):
        # regrtest puts the whole test id in "name", without "classname".
        name = case.get("name", "?")
        if case.get("classname"):
            name = case.get("classname") + "." + name
        kinds = {child.tag for child in case}
        # regrtest gives a case a status only when it reports an outcome;
        # one whose subtests failed reports none.
        if kinds & {"failure", "error"} or case.get("status") is None:
            cases.append((name, "failed"))
        elif "skipped" in kinds:
            cases.append((name, "skipped"))
        else:
            cases.append((name, "ok"))
    return cases


# ---- profiler files in /tmp ----------------------------------------------

def profiler_files():
    """The set of profiler files now in /tmp."""
    return {path for pattern in PROFILER_FILES for path in glob.glob(pattern)}


def process_exists(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:         # another user's
        return True
    return True


def remove_new_profiler_files(before):
    """Remove the profiler files that are not in `before` (an earlier
    profiler_files()), belong to this user and whose process has exited
    (a process of another job keeps its file); return how many."""
    removed = 0
    for path in sorted(profiler_files() - set(before)):
        match = PROFILER_PID.match(os.path.basename(path))
        if match and process_exists(int(match.group(1))):
            continue
        try:
            if os.lstat(path).st_uid == os.geteuid():
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed


# ---- command line --------------------------------------------------------

def usage():
    sys.exit("usage: tooling.py clean-exec [NAME=VALUE ...] COMMAND [ARG ...]"
             "\n       tooling.py profiler-snapshot FILE"
             "\n       tooling.py remove-profiler-files FILE")


def main(argv):
    command, args = (argv[0], argv[1:]) if argv else (None, [])
    if command == "clean-exec":
        clean_exec(args)
    elif command == "profiler-snapshot" and len(args) == 1:
        with open(args[0], "w") as f:
            f.writelines(path + "\n" for path in sorted(profiler_files()))
    elif command == "remove-profiler-files" and len(args) == 1:
        with open(args[0]) as f:
            before = f.read().splitlines()
        print(remove_new_profiler_files(before))
    else:
        usage()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
