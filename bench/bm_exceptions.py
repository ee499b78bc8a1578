"""Exception-heavy code.

Exceptions raised a few frames deep and caught by a caller (unwinding frames
that were entered by Python-to-Python calls), try/finally, exception
chaining, context managers whose __exit__ swallows errors, and the
EAFP dictionary-lookup idiom.
"""
import harness

LOOPS = 25  # repetitions of work(): about 0.3 s in all


class ParseError(ValueError):
    pass


def parse_digit(ch):
    if not ch.isdigit():
        raise ParseError(ch)
    return ord(ch) - 48


def parse(text):
    try:
        return sum(parse_digit(ch) for ch in text)
    except ParseError as exc:
        raise KeyError(text) from exc


def level3(i):
    if i % 3 == 0:
        raise LookupError(i)
    return i


def level2(i):
    try:
        return level3(i)
    finally:
        pass


def level1(i):
    return level2(i) + 1


class Suppress:
    def __enter__(self):
        return self

    def __exit__(self, typ, value, tb):
        return typ is ZeroDivisionError


def work():
    caught = 0
    for i in range(12000):
        try:
            level1(i)
        except LookupError:
            caught += 1
    texts = ["1234", "12a4", "9876", "x"]
    for i in range(6000):
        try:
            parse(texts[i & 3])
        except KeyError:
            caught += 1
    for i in range(6000):
        with Suppress():
            1 / (i & 1)
    table = {}
    for i in range(12000):
        try:
            table[i % 500] += 1
        except KeyError:
            table[i % 500] = 1
    return caught


def check(result):
    assert result == 4000 + 3000, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
