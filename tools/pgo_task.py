"""The release build's PGO training (its PROFILE_TASK): CPython's own task,
`python -m test --pgo`, run twice, with perf trampolines off and then with
-X perf, so that the compiler lays out neither mode's paths (the inlined
Python-to-Python calls, the trampolined ones, the eval-frame hook, the map
writes) as cold code.

Debian trains its python3.11 on the whole regression suite, and builds
about 30 of the standard library's extension modules into it.  Doing
that here (both runs, Debian's exclusions; with or without those modules
built in) adds a quarter of an hour to the build and moves single
workloads of bench/ by up to 8% either way (regular expressions faster,
method calls slower), their geomean by 1% at most: CPython's task is
kept, and the modules stay shared as CPython builds them.

Run by the instrumented interpreter as `python pgo_task.py`; failing tests
do not stop the build (CPython's Makefile ignores the task's status too).
test_generators fails in both runs, as it does in the task of an unpatched
3.11.2 built with --enable-optimizations: it passes when run alone.
The perf maps of the -X perf run and of the interpreters it starts are
removed afterwards.
"""

import glob
import os
import subprocess
import sys

TASK = ["-m", "test", "--pgo", "--timeout=1200"]


def our_maps(before):
    """Perf maps written since `before` (a set of paths) that name code of
    this tree's standard library: ours to remove."""
    lib = os.path.dirname(os.__file__)
    for path in set(glob.glob("/tmp/perf-*.map")) - before:
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                if lib in f.read():
                    yield path
        except OSError:
            pass


def main():
    env = {name: value for name, value in os.environ.items()
           if not name.startswith("PYTHONPERF")}
    before = set(glob.glob("/tmp/perf-*.map"))
    status = 0
    for options in ([], ["-X", "perf"]):
        print(f"pgo_task: python {' '.join(options + TASK)}", flush=True)
        proc = subprocess.run([sys.executable, *options, *TASK], env=env)
        status = status or proc.returncode
    for path in our_maps(before):
        os.unlink(path)
    return status


if __name__ == "__main__":
    sys.exit(main())
