"""Special methods called from C.

Sorting objects with __lt__, hashing and comparing keys with __hash__ and
__eq__ in dicts and sets, a sequence with __getitem__ and __len__ (iteration
through the old sequence protocol, and BINARY_SUBSCR_GETITEM in 3.11) and
properties.  Most of these calls start in C, not at a CALL instruction, so
they take the eval-frame hook rather than any bytecode fast path.
"""
import harness

LOOPS = 24  # repetitions of work(): about 0.3 s in all


class Key:
    __slots__ = ("a", "b")

    def __init__(self, a, b):
        self.a = a
        self.b = b

    def __lt__(self, other):
        return (self.a, self.b) < (other.a, other.b)

    def __eq__(self, other):
        return self.a == other.a and self.b == other.b

    def __hash__(self):
        return hash((self.a, self.b))


class Ring:
    def __init__(self, items):
        self._items = items

    def __len__(self):
        return len(self._items)

    def __getitem__(self, i):
        if i >= len(self._items):
            raise IndexError(i)
        return self._items[i]


class Temperature:
    def __init__(self, celsius):
        self._c = celsius

    @property
    def fahrenheit(self):
        return self._c * 9 / 5 + 32


def work():
    keys = [Key((i * 7919) % 1013, i % 17) for i in range(2000)]
    total = 0
    for _ in range(3):
        total += sorted(keys)[0].a
    seen = set(keys)
    counts = {}
    for k in keys:
        counts[k] = counts.get(k, 0) + 1
    total += len(seen) + len(counts)
    ring = Ring(list(range(2000)))
    for _ in range(7):
        for value in ring:
            total += value
        total += ring[5] + ring[len(ring) - 1]
    temps = [Temperature(c) for c in range(1000)]
    for _ in range(13):
        total += int(sum(t.fahrenheit for t in temps))
    return total


def check(result):
    assert result > 0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
