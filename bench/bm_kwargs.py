"""Keyword and default arguments.

Calls that fill in defaults (CALL_PY_WITH_DEFAULTS), calls with keyword
arguments (CALL with kwnames), keyword-only parameters, and *args/**kwargs
forwarding wrappers (CALL_FUNCTION_EX).
"""
import harness

LOOPS = 25  # repetitions of work(): about 0.3 s in all


def area(w, h=1, scale=1.0):
    return w * h * scale


def fmt(value, *, width=8, fill=" ", upper=False):
    if upper:
        return value
    return width


def forward(*args, **kwargs):
    return area(*args, **kwargs)


class Box:
    def __init__(self, w=1, h=1, depth=1, label=None):
        self.w = w
        self.h = h
        self.depth = depth
        self.label = label

    def volume(self, unit=1):
        return self.w * self.h * self.depth * unit


def work():
    total = 0.0
    for i in range(24000):
        total += area(i)
        total += area(i, 2)
        total += area(w=i, h=3, scale=0.5)
        total += fmt(i, width=4)
        total += fmt(i, upper=True)
    for i in range(8000):
        total += forward(i, h=2)
        total += Box(i, h=2, label="b").volume()
    return total


def check(result):
    assert result > 0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
