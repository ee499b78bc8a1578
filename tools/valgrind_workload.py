"""A short workload for tools/valgrind-test.sh, run with -X perf.

Prints one line per phase, then "workload done"; every result is checked
here, so a wrong answer fails the run as surely as a memcheck error.  It
removes its perf map when it ends: perf reads maps at report time, so the
interpreter leaves them in /tmp.
"""

import os
import sys
import threading
import types

PERF_MAP = f"/tmp/perf-{os.getpid()}.map"


def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def down(n):
    return 0 if n == 0 else down(n - 1) + 1


class Box:
    def __getitem__(self, n):          # BINARY_SUBSCR_GETITEM
        return 0 if n == 0 else self[n - 1] + 1


def defaults(a, b=2, *, c=3):          # CALL_PY_WITH_DEFAULTS, kwargs
    return a + b + c


def gen(n):
    for i in range(n):
        yield fib(i % 10)


def raiser(n):
    if n == 0:
        raise ValueError("bottom")
    return raiser(n - 1)


def check(label, value, expected):
    if value != expected:
        raise SystemExit(f"{label}: {value!r} != {expected!r}")
    print(label, "ok", flush=True)


def main():
    assert sys.is_stack_trampoline_active()
    check("calls", fib(18), 2584)
    check("defaults", sum(defaults(i) + defaults(i, c=0) for i in range(100)),
          2 * 4950 + 500 + 200)
    check("subscript", Box()[500], 500)
    check("generators", sum(gen(200)), 20 * sum(fib(i) for i in range(10)))
    try:
        raiser(100)
    except ValueError as exc:
        check("exceptions", str(exc), "bottom")

    # Past the fast path's C stack budget: the rest inlined, as in 3.11.
    sys.setrecursionlimit(30_000)
    check("deep recursion", down(25_000), 25_000)
    sys.setrecursionlimit(1000)

    # Switch off and on, inside trampolined frames too.
    def toggle_inside(n):
        if n == 0:
            sys.deactivate_stack_trampoline()
            sys.activate_stack_trampoline("perf")
            return 0
        return toggle_inside(n - 1) + 1
    for _ in range(200):
        sys.deactivate_stack_trampoline()
        fib(5)
        sys.activate_stack_trampoline("perf")
        fib(5)
    check("cycles", toggle_inside(50), 50)

    # New code objects: a map line each, names that need escaping or
    # cutting.
    base = fib.__code__
    names = ["plain", "new\nline", "nul\x00", "surrogate\udc80",
             "\u00e9\u6f22", "x" * 5000]
    total = 0
    for i, name in enumerate(names):
        code = base.replace(co_qualname=name, co_filename=name * 2)
        total += types.FunctionType(code, {"fib": fib})(i)
    check("names", total, sum(fib(i) for i in range(len(names))))
    for i in range(300):
        ns = {}
        exec(f"def made_{i}(x):\n    return x + {i}", ns)
        total += ns[f"made_{i}"](0)
    check("made", total - sum(fib(i) for i in range(len(names))),
          sum(range(300)))

    # Threads calling while the main thread toggles.
    results = []
    def worker():
        results.append(sum(fib(12) for _ in range(5)))
    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(50):
        sys.deactivate_stack_trampoline()
        sys.activate_stack_trampoline("perf")
    for t in threads:
        t.join()
    check("threads", results, [5 * 144] * 4)

    with open(PERF_MAP, "rb") as f:
        lines = f.read().split(b"\n")
    check("map", lines[-1] == b"" and all(
        line.count(b" ") >= 2 and line.split(b" ", 2)[2].startswith(b"py::")
        for line in lines[:-1]), True)
    print("workload done")


if __name__ == "__main__":
    try:
        main()
    finally:
        try:
            os.unlink(PERF_MAP)
        except FileNotFoundError:
            pass
