"""Closures and lambdas.

Function factories returning closures over cells, lambdas passed to map(),
sorted() and functools.reduce() (calls from C into Python), and composition
of small closures (Python-to-Python calls through MAKE_FUNCTION'd objects).
"""
import functools

import harness

LOOPS = 16  # repetitions of work(): about 0.3 s in all


def make_adder(n):
    def add(x):
        return x + n
    return add


def make_counter():
    count = 0

    def incr():
        nonlocal count
        count += 1
        return count
    return incr


def compose(f, g):
    return lambda x: f(g(x))


def work():
    adders = [make_adder(i) for i in range(50)]
    total = 0
    for _ in range(750):
        for add in adders:
            total = add(total) & 0xFFFF
    pipeline = compose(make_adder(3), compose(lambda v: v * 2, make_adder(-1)))
    for i in range(30000):
        total += pipeline(i) & 7
    incr = make_counter()
    for _ in range(30000):
        incr()
    data = [(i * 7919) % 1000 for i in range(5000)]
    for _ in range(4):
        total += sorted(data, key=lambda v: -v)[0]
        total += sum(map(lambda v: v + 1, data))
        total += functools.reduce(lambda a, b: a ^ b, data)
    return total, incr()


def check(result):
    _, counted = result
    assert counted == 30001, counted


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
