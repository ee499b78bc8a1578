"""python3.11 -m perftramp311 [--backend perf_jit|perf] app.py [args]
python3.11 -m perftramp311 [--backend ...] -m module [args]
python3.11 -m perftramp311 --status

Runs the program with perf trampolines switched on, as the interpreter
would run it."""

import os
import runpy
import sys

import perftramp311

USAGE = __doc__.split("\n\n")[0]


def main(argv):
    backend = "perf_jit"
    if argv[:1] == ["--status"]:
        print(perftramp311.status())
        return 0
    if argv[:1] == ["--backend"] and len(argv) > 1:
        backend, argv = argv[1], argv[2:]
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 2
    if perftramp311.REFUSED is not None:
        print(perftramp311.REFUSED, file=sys.stderr)
        return 2
    if argv[0] == "-m":
        if len(argv) < 2:
            print(USAGE, file=sys.stderr)
            return 2
        sys.argv = argv[1:]
        perftramp311.activate(backend)
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
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
