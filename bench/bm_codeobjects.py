"""Many distinct code objects, each run once.

Generates 190 modules of 50 functions and 10 classes with 5 methods each,
compiles and executes every module, then calls every function and method
exactly once: 21090 distinct code objects (module and class bodies included)
with realistic qualnames and file names, each run once.  With perf on, each
gets a trampoline and a map line; a module's first run writes the lines of
all it defines together (the best case for that: everything defined here
runs).  The chunks (one per module) include compiling it; the units' own
time leaves compile out, so that (time with perf - time without) / 21090
is the per-code-object cost of the profiling support rather than a small
difference of two large times.  Source generation is not timed.
"""
import functools
import time

import harness

MODULES = 190
FUNCTIONS = 50
CLASSES = 10
METHODS = 5
# module body + functions + (class body + methods) per class
CODE_OBJECTS = MODULES * (1 + FUNCTIONS + CLASSES * (1 + METHODS))


def module_source(m):
    lines = []
    for f in range(FUNCTIONS):
        lines.append(f"def handle_request_{m}_{f}(x, y=2):\n"
                     f"    z = x * {f} + y\n"
                     f"    return z - {m}\n")
    for c in range(CLASSES):
        lines.append(f"class Service{m}x{c}:\n"
                     f"    def __init__(self):\n"
                     f"        self.value = {c}\n")
        for k in range(METHODS - 1):
            lines.append(f"    def method_{k}(self, a):\n"
                         f"        return self.value + a + {k}\n")
    return "\n".join(lines)


def run(sources):
    total = 0
    chunks = []
    unit_chunks = []
    for m, (filename, source) in enumerate(sources):
        c0 = time.process_time()
        namespace = {"__name__": f"generated_{m}"}
        code = compile(source, filename, "exec")
        c1 = time.process_time()
        exec(code, namespace)
        for f in range(FUNCTIONS):
            total += namespace[f"handle_request_{m}_{f}"](f)
        for c in range(CLASSES):
            obj = namespace[f"Service{m}x{c}"]()
            for k in range(METHODS - 1):
                total += getattr(obj, f"method_{k}")(k)
        c2 = time.process_time()
        chunks.append(c2 - c0)
        unit_chunks.append(c2 - c1)
    return total, chunks, unit_chunks


def check(total):
    assert total != 0


if __name__ == "__main__":
    sources = [(f"/srv/app/generated/package_{m}/module_{m}.py",
                module_source(m)) for m in range(MODULES)]
    # chunks: CPU time per generated module (all modules are alike);
    # unit chunks: the same without compile.
    harness.measure(functools.partial(run, sources), check,
                    units=CODE_OBJECTS, unit="code object")
