"""Recursive calls: naive Fibonacci and a recursive tree walk.

Almost nothing but Python-to-Python calls (CALL_PY_EXACT_ARGS) and small
integer arithmetic: the worst case for a per-call profiling cost.
"""
import harness

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


def check(result):
    assert result == 28657 + 3 * 8191, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
