"""Generators.

A pipeline of generator functions (each next() resumes a frame), yield from
delegation through a recursive tree walk, send() into a coroutine-style
generator, and a generator closed early (GeneratorExit through finally).
"""
import harness

LOOPS = 24  # repetitions of work(): about 0.3 s in all


def numbers(n):
    for i in range(n):
        yield i


def squares(it):
    for x in it:
        yield x * x


def evens(it):
    for x in it:
        if not x & 1:
            yield x


def walk(node):
    if node is None:
        return
    left, value, right = node
    yield from walk(left)
    yield value
    yield from walk(right)


def build(lo, hi):
    if lo >= hi:
        return None
    mid = (lo + hi) // 2
    return (build(lo, mid), mid, build(mid + 1, hi))


def averager():
    total = 0.0
    count = 0
    average = None
    while True:
        value = yield average
        total += value
        count += 1
        average = total / count


def closed_early(n):
    cleaned = 0
    for _ in range(n):
        def gen():
            nonlocal cleaned
            try:
                yield 1
                yield 2
            finally:
                cleaned += 1
        g = gen()
        next(g)
        g.close()
    return cleaned


def work():
    total = sum(evens(squares(numbers(37500))))
    tree = build(0, 2500)
    for _ in range(5):
        total += sum(walk(tree))
    avg = averager()
    next(avg)
    for i in range(12500):
        avg.send(i)
    total += closed_early(3750)
    return total


def check(result):
    assert result > 0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
