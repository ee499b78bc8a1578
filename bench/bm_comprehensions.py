"""Comprehensions.

List, set and dict comprehensions and generator expressions.  In 3.11 each
comprehension is a separate code object run as a function call (the
comprehension is not inlined before 3.12), so this exercises one call per
comprehension evaluation plus tight loops inside it.
"""
import harness

LOOPS = 27  # repetitions of work(): about 0.3 s in all


def work():
    total = 0
    words = ["w%d" % (i % 97) for i in range(200)]
    for r in range(500):
        squares = [i * i for i in range(100)]
        odd = {i for i in squares if i & 1}
        index = {w: i for i, w in enumerate(words)}
        nested = [[j for j in range(i % 5)] for i in range(20)]
        total += len(odd) + len(index) + sum(len(row) for row in nested)
        total += sum(x for x in squares if x % 3 == 0)
    return total


def check(result):
    assert result > 0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
