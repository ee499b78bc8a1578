"""python3.11 -m perftramp311 [--backend perf_jit|perf] app.py [args]
python3.11 -m perftramp311 [--backend ...] -m module [args]
python3.11 -m perftramp311 [--backend ...] -c command [args]
python3.11 -m perftramp311 record [-o DIR] [-F HZ] app.py|-m module [args]
python3.11 -m perftramp311 --status

Runs the program with perf trampolines switched on, as the interpreter
would run it.  record runs it so under perf's DWARF unwinder and makes
DIR/perf.jit.data for perf report (perf 6.8 or newer: $PERF, else perf on
the PATH); a script named "record" runs as ./record."""

import os
import re
import runpy
import shutil
import subprocess
import sys
import types

import perftramp311

USAGE = __doc__.split("\n\n")[0]

# perf inject --jit merges DWARF-unwound jitdump frames correctly from
# this version on.
PERF_MIN = (6, 8)


def record(argv):
    # Options end where the program starts (its own -m included), so
    # argparse, which would take that -m as one of ours, is not used.
    options = {"-o": ".", "-F": "999"}
    while len(argv) > 1 and argv[0] in options:
        options[argv[0]] = argv[1]
        argv = argv[2:]
    if not argv or argv[0] in ("-h", "--help") or argv == ["-m"]:
        print(USAGE, file=sys.stderr)
        return 2
    output, frequency, program = options["-o"], options["-F"], argv
    perf = os.environ.get("PERF") or shutil.which("perf")
    if not perf:
        print("perftramp311: no perf found (set PERF)", file=sys.stderr)
        return 2
    version = subprocess.run([perf, "version"], capture_output=True,
                             text=True).stdout
    found = re.search(r"(\d+)\.(\d+)", version)
    if not found or tuple(map(int, found.groups())) < PERF_MIN:
        print("perftramp311: %s is %s; perf inject --jit needs %d.%d or "
              "newer" % (perf, version.strip() or "not runnable", *PERF_MIN),
              file=sys.stderr)
        return 2
    os.makedirs(output, exist_ok=True)
    data = os.path.join(output, "perf.data")
    injected = os.path.join(output, "perf.jit.data")
    # -k 1: the jitdump's timestamps are CLOCK_MONOTONIC.
    env = dict(os.environ, PYTHONPERFSUPPORT="1")
    status = subprocess.run(
        [perf, "record", "-k", "1", "--call-graph", "dwarf",
         "-F", frequency, "-o", data, sys.executable, *program],
        env=env).returncode
    # perf inject writes each trampoline's ELF image beside its output.
    inject = subprocess.run([perf, "inject", "--jit", "-i", "perf.data",
                             "-o", "perf.jit.data"], cwd=output)
    if inject.returncode != 0:
        print("perftramp311: perf inject --jit failed", file=sys.stderr)
        return inject.returncode
    print("perftramp311: perf report -i %s" % injected, file=sys.stderr)
    return status


def main(argv):
    backend = "perf_jit"
    if argv[:1] == ["--status"]:
        print(perftramp311.status())
        return 0
    if argv[:1] == ["record"]:
        if perftramp311.REFUSED is not None:
            print(perftramp311.REFUSED, file=sys.stderr)
            return 2
        return record(argv[1:])
    if argv[:1] == ["--backend"] and len(argv) > 1:
        backend, argv = argv[1], argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
    if perftramp311.REFUSED is not None:
        print(perftramp311.REFUSED, file=sys.stderr)
        return 2
    if argv[0] in ("-m", "-c") and len(argv) < 2:
        print(USAGE, file=sys.stderr)
        return 2
    if argv[0] == "-m":
        sys.argv = argv[1:]
        perftramp311.activate(backend)
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    elif argv[0] == "-c":
        # As python -c: argv[0] is "-c", the current directory first on
        # the path, the code in __main__'s namespace.
        sys.argv = ["-c", *argv[2:]]
        sys.path[0] = ""
        code = compile(argv[1], "<string>", "exec")
        module = types.ModuleType("__main__")
        sys.modules["__main__"] = module
        perftramp311.activate(backend)
        exec(code, module.__dict__)
    else:
        # As the interpreter runs a script: its directory first on the
        # path, its code named by its absolute path.
        path = os.path.abspath(argv[0])
        sys.argv = argv
        sys.path[0] = os.path.dirname(path)
        perftramp311.activate(backend)
        runpy.run_path(path, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
