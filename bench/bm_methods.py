"""Small methods and object construction.

A 2-D vector and a particle class: __init__ on every construction, short
methods calling other short methods, attribute loads and stores.  Typical of
object-oriented application code (CALL on bound methods, LOAD_ATTR,
STORE_ATTR, class instantiation going through type.__call__).
"""
import harness

LOOPS = 26  # repetitions of work(): about 0.3 s in all


class Vec:
    __slots__ = ("x", "y")

    def __init__(self, x, y):
        self.x = x
        self.y = y

    def add(self, other):
        return Vec(self.x + other.x, self.y + other.y)

    def scale(self, k):
        return Vec(self.x * k, self.y * k)

    def dot(self, other):
        return self.x * other.x + self.y * other.y

    def norm2(self):
        return self.dot(self)


class Particle:
    def __init__(self, pos, vel):
        self.pos = pos
        self.vel = vel
        self.steps = 0

    def step(self, dt):
        self.pos = self.pos.add(self.vel.scale(dt))
        self.steps += 1

    def energy(self):
        return 0.5 * self.vel.norm2()


class Counter:
    def __init__(self):
        self.n = 0

    def incr(self):
        self.n += 1
        return self

    def value(self):
        return self.n


def work():
    particles = [Particle(Vec(i, -i), Vec(1.0, 0.5 * i)) for i in range(100)]
    for _ in range(200):
        for p in particles:
            p.step(0.01)
    energy = sum(p.energy() for p in particles)
    c = Counter()
    for _ in range(50000):
        c.incr().incr()
    return energy, c.value()


def check(result):
    energy, count = result
    assert count == 100000 and energy > 0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
