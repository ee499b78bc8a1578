#!/usr/bin/env python3
"""What perf support costs besides time: memory per code object, and fork.

Memory: a child process makes FUNCTIONS distinct functions with realistic
names, then calls each once.  The growth of its resident set size (RSS)
during the calls, per function, minus the same with perf off, is what one
code object costs: the trampoline, the co_extra slot and what gdb is told.
The map and the jitdump are files, counted as /tmp use.

Fork: a parent with a map of CHILD_MAP_LINES lines forks CHILDREN children,
one at a time; each child calls one known function and exits.  Reported:
the fork latency (from os.fork() in the parent until the child has run
Python code and said so through a pipe), and the bytes the children leave
in /tmp.  Also subprocess.Popen() with a preexec_fn, which execs right away.

Attach: `python -I -m perf_trampoline attach PID` (then detach) on a
busy process, ATTACHES times; reported: the median wall time of an
attach, from starting the tool until it has said the process switched
(interpreter start-up included).

Usage: side_costs.py [--json PATH] PYTHON [PYTHON_ARGS...] (prints Markdown
tables; --json also writes the figures there, for bench/figures.py); each
measurement runs RUNS times and the minimum is kept.
"""

import json
import os
import statistics
import subprocess
import sys
import textwrap
import time

import harness

FUNCTIONS = 50000
CHILD_MAP_LINES = 20000
CHILDREN = 64
RUNS = int(os.environ.get("BENCH_RUNS", 3))
ATTACHES = 20

DEFINE = textwrap.dedent("""\
    import os, sys, time, json
    import types
    def define(n):
        # Copies of one code object, renamed: making them frees little
        # memory, which the trampolines' allocations would reuse unseen.
        namespace = {}
        exec(compile("def handle_request(request):\\n"
                     "    return request + 1\\n",
                     "/srv/app/handlers/requests.py", "exec"), namespace)
        code = namespace["handle_request"].__code__
        return [types.FunctionType(
                    code.replace(co_name=f"handle_request_{i}",
                                 co_qualname=f"handle_request_{i}"),
                    namespace)
                for i in range(n)]
    def rss():
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    """)

MEMORY = DEFINE + textwrap.dedent("""\
    funcs = define(N)
    before = rss()
    for f in funcs:
        f(1)
    print(json.dumps({"bytes": (rss() - before) / N}))
    """)

FORK = DEFINE + textwrap.dedent("""\
    import subprocess
    funcs = define(N)
    for f in funcs:
        f(1)
    def tmp_bytes(pid):
        total = 0
        for name in PROFILER_FILES:
            path = name.format(pid)
            try:
                total += os.path.getsize(path)
                os.unlink(path)
            except FileNotFoundError:
                pass
        return total
    latencies, tmp = [], 0
    for _ in range(CHILDREN):
        r, w = os.pipe()
        start = time.perf_counter()
        pid = os.fork()
        if pid == 0:
            funcs[1](1)
            os.write(w, b"x")
            os._exit(0)
        os.read(r, 1)
        latencies.append(time.perf_counter() - start)
        os.close(r)
        os.close(w)
        os.waitpid(pid, 0)
        tmp += tmp_bytes(pid)
    spawns, spawn_tmp = [], 0
    for _ in range(CHILDREN):
        start = time.perf_counter()
        proc = subprocess.Popen(["true"], preexec_fn=lambda: None)
        proc.wait()
        spawns.append(time.perf_counter() - start)
        spawn_tmp += tmp_bytes(proc.pid)
    print(json.dumps({"fork_ms": sorted(latencies)[len(latencies) // 2]
                                 * 1e3,
                      "tmp": tmp / CHILDREN,
                      "spawn_ms": sorted(spawns)[len(spawns) // 2] * 1e3,
                      "spawn_tmp": spawn_tmp / CHILDREN}))
    """)

CONFIGS = [
    ("perf off", []),
    ("-X perf", ["-X", "perf"]),
    ("-X perf, perf_fork_copy=0", ["-X", "perf", "-X", "perf_fork_copy=0"]),
    ("-X perf_jit", ["-X", "perf_jit"]),
    ("-X perf_jit, perf_fork_copy=0",
     ["-X", "perf_jit", "-X", "perf_fork_copy=0"]),
]


def run(python, args, source, **constants):
    prelude = "".join(f"{k} = {v!r}\n" for k, v in constants.items())
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHONPERF", "PYTHON_PERF"))}
    proc = subprocess.Popen([*python, *args, "-c", prelude + source],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        out, _ = proc.communicate()
    finally:
        harness.remove_profiler_files(proc.pid)
    if proc.returncode != 0:
        raise subprocess.CalledProcessError(proc.returncode, proc.args, out)
    return json.loads(out)


def measure(python):
    rows = {}
    for name, args in CONFIGS:
        memory = min(run(python, args, MEMORY, N=FUNCTIONS)["bytes"]
                     for _ in range(RUNS))
        forks = [run(python, args, FORK, N=CHILD_MAP_LINES,
                     CHILDREN=CHILDREN,
                     PROFILER_FILES=harness.PROFILER_FILES)
                 for _ in range(RUNS)]
        rows[name] = {
            "memory": memory,
            "fork_ms": min(f["fork_ms"] for f in forks),
            "tmp": statistics.median(f["tmp"] for f in forks),
            "spawn_ms": min(f["spawn_ms"] for f in forks),
            "spawn_tmp": statistics.median(f["spawn_tmp"] for f in forks),
        }
    return rows


# The main thread waits on stdin; a thread runs Python code.
BUSY = textwrap.dedent("""\
    import os, sys, threading
    stop = False
    def spin():
        def work(n):
            return sum(i * i for i in range(n))
        while not stop:
            work(1000)
    threading.Thread(target=spin, daemon=True).start()
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    """)


def attach_ms(python):
    """Median wall time of an attach to a busy process, in ms."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHONPERF", "PYTHON_PERF"))}
    target = subprocess.Popen([python[0], "-c", BUSY], env=env,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    times = []
    try:
        pid = target.stdout.readline().strip()
        for _ in range(ATTACHES):
            for command in ("attach", "detach"):
                start = time.perf_counter()
                subprocess.run([python[0], "-I", "-m", "perf_trampoline",
                                command, pid], check=True, env=env,
                               stdout=subprocess.DEVNULL)
                if command == "attach":
                    times.append(time.perf_counter() - start)
    finally:
        target.stdin.close()
        target.wait()
        harness.remove_profiler_files(target.pid)
    return statistics.median(times) * 1e3


def table(rows):
    off = rows["perf off"]["memory"]
    lines = [
        f"| configuration | RSS per code object, vs off | fork, ms "
        f"({CHILD_MAP_LINES} functions) | /tmp per child | "
        f"subprocess with preexec_fn, ms | its /tmp |",
        "|---|---|---|---|---|---|",
    ]
    for name, r in rows.items():
        per_code = r["memory"] - off
        lines.append(
            f"| {name} | {per_code:+.0f} B | {r['fork_ms']:.2f} | "
            f"{r['tmp'] / 1024:.0f} KiB | {r['spawn_ms']:.2f} | "
            f"{r['spawn_tmp']:.0f} B |")
    return "\n".join(lines)


def main():
    args = sys.argv[1:]
    json_path = None
    if args[:1] == ["--json"] and len(args) > 1:
        json_path, args = args[1], args[2:]
    if not args:
        sys.exit(__doc__)
    rows = measure(args)
    print(f"{FUNCTIONS} functions called once; fork: {CHILDREN} children "
          f"of a parent with {CHILD_MAP_LINES} functions; min of {RUNS} "
          f"runs")
    print(table(rows))
    print()
    attach = attach_ms(args)
    print(f"| attach to a busy process (median of {ATTACHES}, with the "
          f"tool's start-up) |\n|---|\n| {attach:.1f} ms |")
    if json_path:
        with open(json_path, "w") as f:
            json.dump({"rows": rows, "attach_ms": attach}, f, indent=1)


if __name__ == "__main__":
    main()
