"""The static tracing probes (USDT) next to perf trampolines.

Debian builds its python3.11 --with-dtrace: bpftrace and SystemTap scripts
written for the system Python attach to its probes.  Ours keeps them
(the Makefile's BASE_FLAGS), and they fire while trampolines are active.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
import unittest

from test.test_perf_profiler.util import (
    ProfilerFiles, TIMEOUT, clean_env, gdb_available, gdb_backtrace, host_tool,
    needs_host, skip_environment)

# The probes CPython 3.11 defines (Include/pydtrace.d).
PROBES = {"function__entry", "function__return", "line", "gc__start",
          "gc__done", "instance__new__start", "instance__new__end",
          "instance__delete__start", "instance__delete__end",
          "import__find__load__start", "import__find__load__done", "audit"}

DEBIAN_PYTHON = "/usr/bin/python3.11"


def probe_names(path):
    """Names of the "python" provider's stapsdt notes in ELF file
    `path`."""
    proc = subprocess.run(["readelf", "-n", "-W", path],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True, timeout=TIMEOUT)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr)
    names = set()
    provider = None
    for line in proc.stdout.splitlines():
        match = re.search(r"Provider: (\S+)", line)
        if match:
            provider = match.group(1)
        match = re.match(r"\s*Name: (\S+)", line)
        if match and provider == "python":
            names.add(match.group(1))
    return names


def probes_object():
    """The ELF file of this interpreter that holds the probes: libpython
    in a shared build, the executable otherwise."""
    if not sysconfig.get_config_var("Py_ENABLE_SHARED"):
        # Not sys.executable: under qemu-user that is a wrapper script.
        return os.path.realpath("/proc/self/exe")
    with open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if os.path.basename(path).startswith("libpython3"):
                return path
    raise AssertionError("libpython is not mapped")


class ProbeTests(unittest.TestCase):

    def setUp(self):
        if not sysconfig.get_config_var("WITH_DTRACE"):
            skip_environment("this interpreter was configured without "
                             "--with-dtrace (make adds it)")
        if shutil.which("readelf") is None:
            skip_environment("readelf (binutils) is not installed")

    def test_probes_as_debian_has_them(self):
        ours = probe_names(probes_object())
        self.assertTrue(ours, "no stapsdt notes")
        self.assertLessEqual(ours, PROBES)
        self.assertIn("function__entry", ours)
        if not os.path.exists(DEBIAN_PYTHON):
            skip_environment(f"{DEBIAN_PYTHON} (Debian's python3.11) is not "
                             f"installed")
        self.assertEqual(ours, probe_names(DEBIAN_PYTHON))

    @needs_host("gdb")
    def test_probe_fires_through_trampolines(self):
        # gdb sets the probe's semaphore, as bpftrace and SystemTap do, and
        # stops at the function__entry of probe_target (the probe's second
        # argument is the function's name).  In 3.11 the function probes
        # fire only while a trace function is set, as in Debian's build.
        reason = gdb_available()
        if reason:
            skip_environment(reason)
        files = ProfilerFiles()
        self.addCleanup(files.cleanup)
        code = ("import sys\n"
                "def probe_target():\n"
                "    return 1\n"
                "sys.settrace(lambda *args: None)\n"
                "probe_target()\n")
        names, output = gdb_backtrace(
            [sys.executable, "-X", "perf", "-c", code],
            "-probe-stap python:function__entry", files,
            condition='$_streq((char *)$_probe_arg1, "probe_target")',
            env=clean_env())
        self.assertIn("Breakpoint 2, ", output)
        self.assertIn("py_trampoline", names, output)
        self.assertIn("Py_BytesMain", names, output)

    @needs_host("bpftrace")
    def test_bpftrace_through_trampolines(self):
        # A bpftrace one-liner written for Debian's python3.11, on ours
        # with -X perf: it attaches by probe name to a running process and
        # reads the function's name from the probe's second argument.
        # (bpftrace -c attaches before a shared libpython is loaded, and
        # finds no probe there; -p is what users run on a service.)
        host_tool("bpftrace")
        bpftrace = shutil.which("bpftrace")
        if bpftrace is None:
            skip_environment("bpftrace is not installed")
        check = subprocess.run(
            [bpftrace, "-e", 'BEGIN { printf("loaded\\n"); exit(); }'],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            timeout=TIMEOUT)
        if "loaded" not in check.stdout:
            skip_environment("the kernel does not let bpftrace load a "
                             f"program: {check.stderr.strip()[-300:]}")
        program = (f"usdt:{probes_object()}:python:function__entry "
                   '/str(uptr(arg1)) == "probe_target"/ '
                   '{ printf("fired %s\\n", str(uptr(arg1))); exit(); }')
        # Calls probe_target until its standard input is closed.
        code = ("import select, sys\n"
                "def probe_target():\n"
                "    return sys.is_stack_trampoline_active()\n"
                "sys.settrace(lambda *args: None)\n"
                "print('active', probe_target(), flush=True)\n"
                "while not select.select([sys.stdin], [], [], 0.01)[0]:\n"
                "    probe_target()\n")
        files = ProfilerFiles()
        self.addCleanup(files.cleanup)
        target = subprocess.Popen(
            [sys.executable, "-X", "perf", "-c", code],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=clean_env())
        files.add_pid(target.pid)
        try:
            self.assertEqual(target.stdout.readline(), "active True\n")
            proc = subprocess.run(
                [bpftrace, "-p", str(target.pid), "-e", program],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                timeout=TIMEOUT)
        finally:
            target.stdin.close()
            target.wait(timeout=TIMEOUT)
            target.stdout.close()
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("fired probe_target\n", proc.stdout, proc.stderr)
        self.assertEqual(target.returncode, 0)


if __name__ == "__main__":
    unittest.main()
