#!/usr/bin/env python3
"""What each change of the evaluator patch that acts with perf off wins.

tools/bench-perf-off.sh builds the variants in one tree, all alike:
`variant-full` (the whole patch), `variant-records` (ceval.c without frame
records) and one `variant-NAME` per bench/perf_off/NAME.patch, which undoes
that one change.  This script measures them side by side:

* Instructions (valgrind's callgrind), perf off, on the workloads where
  the variant's change acts: the same from run to run to about 0.1%,
  whatever the load on the machine.  Reported as variant / full.
* The C stack a level of a generator chain takes (the `delegate` and
  `loop` shapes of test_stress's recursion through C: SEND and FOR_ITER
  resuming a generator), perf off and -X perf, in a thread with a 256 KiB
  stack: the depth reached where the stack runs out.
* Calls of another co_extra user's free function for code objects it never
  tagged, with -X perf.

Usage: perf_off.py --dir BUILD_DIR --variant=NAME... [--json PATH]
[--stock PYTHON] (its C stack per level is the baseline, when built).
"""

import argparse
import datetime
import json
import os
import re
import sys
import tempfile
import textwrap

import run_bench

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

# Where each variant's change acts; full and records take them all.
ALL = ("fib", "nbody", "generators", "exceptions", "codeobjects")
WORKLOADS = {"float_inline": ("nbody",), "gen_resume": ("generators",),
             "co_extra": ("codeobjects",)}
RUN_TIMEOUT = 1800
STACK = 256 * 1024
SHAPES = ("delegate", "loop")
UNTAGGED = 1000

DEPTH_SCRIPT = textwrap.dedent("""\
    import mmap, resource, sys, threading
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    shape, stack = sys.argv[1], int(sys.argv[2])
    sys.setrecursionlimit(10 ** 8)
    with open(sys.argv[3], "r+b") as f:
        reached = mmap.mmap(f.fileno(), 8)

    def delegate(k):        # SEND resumes the next level
        reached[:] = k.to_bytes(8, "little")
        return (yield from delegate(k + 1))

    def loop(k):            # FOR_ITER resumes the next level
        reached[:] = k.to_bytes(8, "little")
        for v in loop(k + 1):
            yield v

    def run():
        try:
            next(globals()[shape](1))
        except RecursionError:
            print("RecursionError")

    threading.stack_size(stack)
    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    """)

CO_EXTRA_SCRIPT = textwrap.dedent("""\
    import ctypes, gc, os, sys
    freefunc = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
    request = ctypes.pythonapi._PyEval_RequestCodeExtraIndex
    request.argtypes = (freefunc,)
    request.restype = ctypes.c_ssize_t
    calls = []
    on_free = freefunc(lambda ptr: calls.append(ptr))
    request(on_free)
    ns = {}
    exec("".join(f"def f{i}():\\n    return {i}\\n"
                 for i in range(int(sys.argv[1]))), ns)
    for name, f in list(ns.items()):
        if name.startswith("f"):
            f()
    del ns, f
    gc.collect()
    print(len(calls), flush=True)
    # Not at shutdown: a Python free function would run in the middle of
    # its own deallocation there.
    os._exit(0)
    """)


def log(msg):
    print("perf-off: " + msg, file=sys.stderr, flush=True)


def run_checked(argv):
    """run_bench.run_python(argv): its stderr, or RuntimeError."""
    rc, _, err = run_bench.run_python(argv, RUN_TIMEOUT)
    if rc != 0:
        raise RuntimeError("%s: %s" % (" ".join(argv), err.strip()[-500:]))
    return err


def instructions(python, workload):
    """Instructions one run of bm_WORKLOAD.py executes, perf off."""
    script = "bm_%s.py" % workload
    # A first run writes the .pyc files of what the workload imports:
    # compiling them would be counted.
    run_checked([python, script])
    err = run_checked(["valgrind", "--tool=callgrind",
                       "--callgrind-out-file=/dev/null", python, script])
    return int(re.findall(r"^==\d+== Collected : (\d+)$", err, re.M)[-1])


def run_script(text, python, options, args):
    """run_bench.run_python() of `python OPTIONS SCRIPT ARGS`, SCRIPT a
    file holding `text`."""
    with tempfile.NamedTemporaryFile("w", suffix=".py") as script:
        script.write(text)
        script.flush()
        return run_bench.run_python([python, *options, script.name, *args],
                                    RUN_TIMEOUT)


def depth(python, shape, perf):
    """(levels reached, how it ended) of DEPTH_SCRIPT's chain."""
    with tempfile.NamedTemporaryFile("w+b") as counter:
        counter.write(bytes(8))
        counter.flush()
        rc, out, err = run_script(DEPTH_SCRIPT, python,
                                  ("-X", "perf") if perf else (),
                                  (shape, str(STACK), counter.name))
        counter.seek(0)
        levels = int.from_bytes(counter.read(8), "little")
    if rc < 0:
        return levels, "signal %d" % -rc
    if rc != 0 or out.strip() != "RecursionError":
        raise RuntimeError("%s %s: %s" % (python, shape, err.strip()[-500:]))
    return levels, "RecursionError"


def free_calls(python):
    """Free-function calls for UNTAGGED code objects never tagged."""
    rc, out, err = run_script(CO_EXTRA_SCRIPT, python, ("-X", "perf"),
                              (str(UNTAGGED),))
    if rc != 0:
        raise RuntimeError("%s: %s" % (python, err.strip()[-500:]))
    return int(out)


def measure(pythons):
    """Everything perf_off.py reports, for {name: interpreter}."""
    doc = {"date": datetime.date.today().isoformat(), "instructions": {},
           "stack": {}, "free_calls": {}}
    for name, python in pythons.items():
        # Stock is only the C stack's baseline.
        for w in WORKLOADS.get(name, ALL) if name != "stock" else ():
            n = instructions(python, w)
            doc["instructions"].setdefault(name, {})[w] = n
            log("%-13s %-12s %13d instructions" % (name, w, n))
            if name == "full" and w == ALL[0]:
                # The counts repeat, or the comparisons mean nothing.
                again = instructions(python, w)
                if abs(again / n - 1) > 0.001:
                    raise RuntimeError("%s: %d instructions, then %d: not "
                                       "repeatable" % (w, n, again))
    for name in ("stock", "full", "gen_resume"):
        if name not in pythons:
            continue
        for shape in SHAPES:
            for perf in (False, True) if name != "stock" else (False,):
                levels, end = depth(pythons[name], shape, perf)
                key = "%s %s" % (shape, "-X perf" if perf else "off")
                doc["stack"].setdefault(name, {})[key] = {
                    "levels": levels, "bytes_per_level": STACK // levels,
                    "end": end}
                log("%-13s %-16s %6d levels (%d B each), %s"
                    % (name, key, levels, STACK // levels, end))
    for name in ("full", "co_extra"):
        if name in pythons:
            doc["free_calls"][name] = free_calls(pythons[name])
            log("%-13s free function called %d times for %d untagged code "
                "objects" % (name, doc["free_calls"][name], UNTAGGED))
    doc["untagged"] = UNTAGGED
    doc["stack_size"] = STACK
    return doc


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", required=True)
    p.add_argument("--variant", action="append", required=True)
    p.add_argument("--stock", default=os.path.join(
        ROOT, "build", "cpython-stock", "python"))
    p.add_argument("--json", default=os.path.join(
        ROOT, "build", "bench", "perf_off.json"))
    args = p.parse_args()
    pythons = {v: os.path.join(args.dir, "variant-" + v)
               for v in args.variant}
    if os.path.exists(args.stock):
        pythons["stock"] = args.stock
    try:
        doc = measure(pythons)
    except (OSError, RuntimeError) as exc:
        sys.exit("perf-off: %s" % exc)
    full = doc["instructions"]["full"]
    for name, counts in doc["instructions"].items():
        print("%-13s %s" % (name, "  ".join(
            "%s %+.2f%%" % (w, (n / full[w] - 1) * 100)
            for w, n in counts.items())))
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=1)
        f.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
