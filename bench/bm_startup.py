"""Interpreter startup: `python -c pass`, many times.

Each child is a fresh interpreter started with the same interpreter options
as this script (so `-X perf` here means `-X perf` for every child): with perf
on, every code object run during startup (site, encodings, ...) gets a
trampoline and a map line.  The CPU time is the children's (user + system,
from wait4), reported per child; the perf maps the children leave in /tmp
are removed as soon as each one exits.
"""
import json
import os
import sys
import time

RUNS = 36           # about 10 ms each


def interpreter_command():
    # sys.orig_argv = [python, <interpreter options>..., script, args...]
    options = sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]
    return [sys.executable, *options]


def spawn_and_wait(argv):
    """Run argv to completion; return its CPU time (user + system)."""
    pid = os.posix_spawn(argv[0], argv, os.environ)
    _, status, usage = os.wait4(pid, 0)
    try:
        os.unlink(f"/tmp/perf-{pid}.map")     # left by -X perf
    except FileNotFoundError:
        pass
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed")
    return usage.ru_utime + usage.ru_stime


def main():
    argv = interpreter_command() + ["-c", "pass"]
    t0 = time.perf_counter()
    chunks = [spawn_and_wait(argv) for _ in range(RUNS)]
    elapsed = time.perf_counter() - t0
    return elapsed, chunks


if __name__ == "__main__":
    elapsed, chunks = main()
    print(json.dumps({"seconds": elapsed, "cpu": sum(chunks),
                      "chunks": chunks, "units": RUNS,
                      "unit": "process"}))
