"""Recursive calls: naive Fibonacci and a recursive tree walk.

Almost nothing but Python-to-Python calls (CALL_PY_EXACT_ARGS) and small
integer arithmetic: the worst case for a per-call profiling cost.
"""
import json
import time

LOOPS = 36  # repetitions of work(): about 0.3 s in all


def fib(n):
    if n < 2:
        return n
    return fib(n - 1) + fib(n - 2)


def make_tree(depth):
    if depth == 0:
        return None
    return (make_tree(depth - 1), make_tree(depth - 1))


def count_nodes(node):
    if node is None:
        return 0
    return 1 + count_nodes(node[0]) + count_nodes(node[1])


def work():
    total = fib(23)
    for _ in range(3):
        total += count_nodes(make_tree(13))
    return total


def main():
    # CPU time of each repetition: the driver can use the fastest one.
    chunks = []
    for _ in range(LOOPS):
        c0 = time.process_time()
        result = work()
        chunks.append(time.process_time() - c0)
    return result, chunks


if __name__ == "__main__":
    t0 = time.perf_counter()
    c0 = time.process_time()
    result, chunks = main()
    elapsed = time.perf_counter() - t0
    cpu = time.process_time() - c0
    assert result == 28657 + 3 * 8191, result
    print(json.dumps({"seconds": elapsed, "cpu": cpu,
                      "chunks": chunks}))
