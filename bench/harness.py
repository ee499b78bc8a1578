"""The timing harness every bench/bm_*.py workload imports.

A workload script does a fixed amount of work as many equal chunks and
prints one JSON line, the only thing bench/run_bench.py reads from it:

    {"seconds": wall time, "cpu": CPU time, "chunks": [CPU time of each
     chunk, ...], "units": N, "unit": "what one is",
     "unit_chunks": [CPU time of each chunk spent on its units, ...]}

"units" and "unit" are there only when the work is made of N alike units
(code objects, processes) whose cost per unit the driver reports;
"unit_chunks" only when the chunks also do other work (compiling the code
objects) that the cost per unit should leave out.

Workloads are started as scripts (`python [-X perf] bm_NAME.py`), so their
directory, and with it this module, is sys.path[0].  They run under every
interpreter compared (any Python 3.10 or newer): standard library only,
and nothing here may run inside the timed part but the timing itself.  The
driver imports it too, for remove_profiler_files().
"""

import json
import os
import sys
import time

# What a process run with -X perf or -X perf_jit leaves in /tmp.
PROFILER_FILES = ("/tmp/perf-{}.map", "/tmp/jit-{}.dump")


def report(seconds, cpu, chunks, units=None, unit=None, unit_chunks=None):
    """Print the JSON line of a finished run."""
    result = {"seconds": seconds, "cpu": cpu, "chunks": chunks}
    if units is not None:
        result.update(units=units, unit=unit)
    if unit_chunks is not None:
        result["unit_chunks"] = unit_chunks
    print(json.dumps(result))


def measure(run, check, units=None, unit=None):
    """Time run() in this process and report it.

    run() does the whole fixed work and returns (result, chunks), or
    (result, chunks, unit_chunks) when its chunks do more than its units;
    check(result) raises when the result is wrong.  It runs after the
    clock stops, so a workload's own check is never part of its time."""
    t0 = time.perf_counter()
    c0 = time.process_time()
    result, chunks, *unit_chunks = run()
    seconds = time.perf_counter() - t0
    cpu = time.process_time() - c0
    check(result)
    report(seconds, cpu, chunks, units, unit, *unit_chunks)


def run_in_chunks(work, loops, check):
    """The whole script of an in-process workload: work() `loops` times,
    each call one chunk, then check() on what the last call returned."""
    def run():
        # The CPU time of each call: the driver can use the fastest one.
        chunks = []
        for _ in range(loops):
            c0 = time.process_time()
            result = work()
            chunks.append(time.process_time() - c0)
        return result, chunks
    measure(run, check)


def remove_profiler_files(pid):
    """Remove the perf map and the jitdump that process `pid` left, if any
    (perf reads them after the process, so nothing else removes them)."""
    for path in PROFILER_FILES:
        try:
            os.unlink(path.format(pid))
        except FileNotFoundError:
            pass


def interpreter_command():
    """This interpreter with the options this script was started with
    (-X perf reaches the children that way)."""
    # sys.orig_argv = [python, <interpreter options>..., script, args...]
    options = sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]
    return [sys.executable, *options]


def spawn_and_wait(argv):
    """Run argv to completion; return its CPU time (user + system)."""
    pid = os.posix_spawn(argv[0], argv, os.environ)
    _, status, usage = os.wait4(pid, 0)
    remove_profiler_files(pid)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed")
    return usage.ru_utime + usage.ru_stime


def run_children(args, runs):
    """The whole script of a per-process workload: `runs` fresh
    interpreters (with this script's interpreter options) running `args`,
    one after the other; each child's CPU time is a chunk."""
    argv = interpreter_command() + args
    t0 = time.perf_counter()
    chunks = [spawn_and_wait(argv) for _ in range(runs)]
    seconds = time.perf_counter() - t0
    report(seconds, sum(chunks), chunks, units=runs, unit="process")
