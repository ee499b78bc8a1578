"""Calls from C into Python, and nothing else that is Python-to-Python.

Small module-level functions passed as key, predicate or reducer to
sorted(), list.sort(), min(), max(), map(), filter(), itertools.starmap()
and functools.reduce(), and called through functools.partial: every call
of them enters the evaluator from C (through the eval-frame hook when it
is installed), none comes from a CALL instruction.
"""
import functools
import itertools

import harness

LOOPS = 20  # repetitions of work(): about 0.3 s in all


def neg(v):
    return -v


def odd(v):
    return v & 1


def xor(a, b):
    return a ^ b


def scale(a, b):
    return a * b


def work():
    data = [(i * 7919) % 1000 for i in range(3000)]
    pairs = list(zip(data, range(3000)))
    twice = functools.partial(scale, 2)
    total = 0
    for _ in range(5):
        total += sorted(data, key=neg)[0]
        copy = data[:]
        copy.sort(key=neg)
        total += copy[-1]
        total += min(data, key=neg) + max(data, key=neg)
        total += sum(map(neg, data))
        total += len(list(filter(odd, data)))
        total += sum(itertools.starmap(scale, pairs)) & 0xFFFF
        total += functools.reduce(xor, data)
        total += sum(map(twice, data))
    return total


def check(result):
    # Worked out again without callbacks.
    data = [(i * 7919) % 1000 for i in range(3000)]
    acc = 0
    for v in data:
        acc ^= v
    products = sum(a * b for a, b in zip(data, range(3000))) & 0xFFFF
    odds = sum(v & 1 for v in data)
    once = 2 * max(data) + 2 * min(data) + sum(data) + odds + products + acc
    assert result == 5 * once, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
