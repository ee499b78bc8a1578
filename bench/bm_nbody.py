"""Float arithmetic: an n-body simulation.

A handful of bodies with pairwise gravitational forces, integrated with a
fixed time step.  Tight float loops in one function with no calls inside the
hot loop: the -X perf hook should cost nothing here.
"""
import math

import harness

LOOPS = 25  # repetitions of work(): about 0.3 s in all


def make_bodies(n):
    bodies = []
    for i in range(n):
        angle = 2.0 * math.pi * i / n
        radius = 1.0 + 0.3 * i
        pos = [radius * math.cos(angle), radius * math.sin(angle), 0.01 * i]
        speed = 1.0 / math.sqrt(radius)
        vel = [-speed * math.sin(angle), speed * math.cos(angle), 0.0]
        bodies.append((pos, vel, 1.0 / (i + 1)))
    return bodies


def pairs_of(bodies):
    return [(bodies[i], bodies[j])
            for i in range(len(bodies)) for j in range(i + 1, len(bodies))]


def advance(pairs, bodies, dt, steps):
    for _ in range(steps):
        for (p1, v1, m1), (p2, v2, m2) in pairs:
            dx = p1[0] - p2[0]
            dy = p1[1] - p2[1]
            dz = p1[2] - p2[2]
            d2 = dx * dx + dy * dy + dz * dz + 0.01
            mag = dt / (d2 * math.sqrt(d2))
            b1 = m1 * mag
            b2 = m2 * mag
            v1[0] -= dx * b2
            v1[1] -= dy * b2
            v1[2] -= dz * b2
            v2[0] += dx * b1
            v2[1] += dy * b1
            v2[2] += dz * b1
        for pos, vel, _ in bodies:
            pos[0] += dt * vel[0]
            pos[1] += dt * vel[1]
            pos[2] += dt * vel[2]


def energy(pairs, bodies):
    e = 0.0
    for (p1, v1, m1), (p2, v2, m2) in pairs:
        d = math.dist(p1, p2)
        e -= m1 * m2 / math.sqrt(d * d + 0.01)
    for _, vel, m in bodies:
        e += 0.5 * m * (vel[0] ** 2 + vel[1] ** 2 + vel[2] ** 2)
    return e


def work():
    bodies = make_bodies(6)
    pairs = pairs_of(bodies)
    before = energy(pairs, bodies)
    advance(pairs, bodies, 0.001, 2000)
    after = energy(pairs, bodies)
    return before, after


def check(result):
    before, after = result
    assert math.isfinite(after) and abs(after - before) < 1.0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
