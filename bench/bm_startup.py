"""Interpreter startup: `python -c pass`, many times.

Each child is a fresh interpreter started with the same interpreter options
as this script (so `-X perf` here means `-X perf` for every child): with perf
on, every code object run during startup (site, encodings, ...) gets a
trampoline and a map line.  The CPU time is the children's (user + system,
from wait4), reported per child; the perf maps the children leave in /tmp
are removed as soon as each one exits.
"""
import harness

RUNS = 36           # about 10 ms each


if __name__ == "__main__":
    harness.run_children(["-c", "pass"], RUNS)
