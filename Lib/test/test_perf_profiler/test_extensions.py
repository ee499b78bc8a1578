"""Debian's own compiled extension modules under -X perf.

Debian 12's python3-numpy, python3-lxml, python3-yaml, python3-greenlet
and python3-gevent are built for Debian's python3.11.  The patched
interpreter keeps stock 3.11's ABI, so they must import and run in it,
with trampolines on, exactly as without: greenlet and gevent switch C
stacks under the trampolines' frames, numpy calls back and forth between
C and Python.  tools/install-deps.sh installs them.
"""

import glob
import os
import subprocess
import unittest

from test.test_perf_profiler.jitlib import (
    NOFP_PYTHON, PERF, TIMEOUT, perf_jit_skip_reason)
from test.test_perf_profiler.util import (
    DIST_PACKAGES, NOFP_ONCE, PerfTestCase, clean_env, needs_host,
    skip_environment, write_script)

MODULES = ("numpy", "lxml", "yaml", "greenlet", "gevent")

PRELUDE = """\
    import sys
    sys.path.append(sys.argv[1])
"""


def remove_jitted(pid):
    """The ELF files perf inject wrote for process `pid`'s code."""
    for path in glob.glob(f"/tmp/jitted-{pid}-*.so"):
        os.unlink(path)


def setUpModule():
    missing = [name for name in MODULES
               if not os.path.isdir(os.path.join(DIST_PACKAGES, name))]
    if missing:
        skip_environment(f"Debian's {', '.join(missing)} not installed in "
                         f"{DIST_PACKAGES} (tools/install-deps.sh)")


@needs_host("the extension modules of Debian's python3-* packages")
class ExtensionTests(PerfTestCase):

    WORKLOAD = PRELUDE + """\
    import gevent, gevent.pool, greenlet, numpy, yaml
    from lxml import etree

    def numbers():
        values = numpy.arange(100_000, dtype=float)
        return float(numpy.sqrt(values).sum().round(3))

    def markup():
        root = etree.fromstring(b"<r>" + b"<i n='1'/><i/>" * 100 + b"</r>")
        return len(root.xpath("//i[@n='1']"))

    def documents():
        text = yaml.dump({"k": list(range(10))}, Dumper=yaml.CDumper)
        return yaml.load(text, Loader=yaml.CLoader)

    # A greenlet switching out of the bottom of a deep recursion: greenlet
    # saves and restores slices of the C stack that trampolines are on.
    def deep(n):
        if n == 0:
            return greenlet.getcurrent().parent.switch("bottom") + 1
        return deep(n - 1) + 1

    def greenlets():
        g = greenlet.greenlet(deep)
        first = g.switch(900)
        return first, g.switch(0)

    def down(k):
        return 0 if k == 0 else down(k - 1) + 1

    def task(n):
        gevent.sleep(0)
        depth = down(n)
        gevent.sleep(0)
        return depth + down(n)

    def hub():
        pool = gevent.pool.Pool(50)
        return sum(pool.map(task, [400] * 200))

    for work in (numbers, markup, documents, greenlets, hub):
        print(work.__name__, work(), flush=True)
    """

    def test_same_results_with_trampolines(self):
        plain = self.run_script(self.WORKLOAD, script_args=[DIST_PACKAGES])
        perf = self.run_script(self.WORKLOAD, python_args=["-X", "perf"],
                               script_args=[DIST_PACKAGES])
        self.assertEqual(perf.stdout, plain.stdout)
        self.assertEqual((plain.stderr, perf.stderr), ("", ""))
        self.assertEqual(plain.stdout.splitlines(), [
            "numbers 21081692.746", "markup 100",
            "documents {'k': [0, 1, 2, 3, 4, 5, 6, 7, 8, 9]}",
            "greenlets ('bottom', 901)", "hub 160000"])
        names = perf.script_names()
        for name in ("numbers", "deep", "greenlets", "task", "down"):
            self.assertIn(name, names)

    UFUNC = PRELUDE + """\
    import numpy

    def hot(values):
        for _ in range(300):
            numpy.sin(values, out=values)

    hot(numpy.arange(1_000_000, dtype=float))
    """

    @NOFP_ONCE
    def test_perf_shows_the_python_caller_of_a_ufunc(self):
        # Debian builds numpy without frame pointers: perf follows its
        # frames with DWARF unwind tables, and ours come from -X perf_jit.
        reason = perf_jit_skip_reason()
        if reason:
            skip_environment(reason)
        path = write_script(self.tmpdir, self.UFUNC)
        perf = [PERF, "--buildid-dir", os.path.join(self.tmpdir, "debug")]
        data = os.path.join(self.tmpdir, "perf.data")
        injected = os.path.join(self.tmpdir, "perf.jit.data")
        record = subprocess.Popen(
            [*perf, "record", "-q", "--no-buildid-cache", "-k", "1", "-e",
             "cpu-clock", "-F", "999", "--call-graph", "dwarf,32768", "-o",
             data, "--", NOFP_PYTHON, "-X", "perf_jit", path, DIST_PACKAGES],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env(), cwd=self.tmpdir)
        stdout, stderr = record.communicate(timeout=TIMEOUT)
        self.assertEqual(record.returncode, 0, stderr)
        pids = subprocess.run([*perf, "script", "-i", data, "-F", "pid"],
                              capture_output=True, text=True, timeout=TIMEOUT)
        pid = int(pids.stdout.split()[0])
        self.files.add_pid(pid)
        self.addCleanup(remove_jitted, pid)
        inject = subprocess.run(
            [*perf, "inject", "--jit", "-i", data, "-o", injected],
            capture_output=True, text=True, cwd=self.tmpdir, timeout=TIMEOUT)
        self.assertEqual(inject.returncode, 0, inject.stderr)
        script = subprocess.run(
            [*perf, "script", "-i", injected, "-F", "ip,sym,dso"],
            capture_output=True, text=True, errors="backslashreplace",
            timeout=TIMEOUT)
        self.assertEqual(script.returncode, 0, script.stderr)
        # Samples in numpy's C code whose chain goes on to py::hot.
        found = 0
        for sample in script.stdout.split("\n\n"):
            frames = sample.splitlines()
            in_numpy = [i for i, frame in enumerate(frames)
                        if "/numpy/" in frame and frame.endswith(".so)")]
            callers = [i for i, frame in enumerate(frames)
                       if f" py::hot:{path} " in frame]
            if in_numpy and callers and in_numpy[0] < callers[0]:
                found += 1
        self.assertGreaterEqual(found, 20, script.stdout[-3000:])


if __name__ == "__main__":
    unittest.main()
