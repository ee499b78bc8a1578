"""python -m perf_trampoline: switching a running process (Lib/perf_trampoline.py).

The targets are started without -X perf; the tool switches them through
gdb and the eval breaker.
"""

import os
import shutil
import subprocess
import sys
import time
import unittest

from test.test_perf_profiler.util import (
    PerfTestCase, TIMEOUT, clean_env, gdb_available, jitdump_path,
    map_written_since, needs_host, perf_record_works, read_map,
    record_samples, skip_environment, write_script)

# The target: work() calls outer -> middle -> inner and now and then
# compiles a new function, until the file argv[2] exists; it checks every
# result and ends by printing how many were wrong.
TARGET = """\
    import ctypes, os, sys, threading

    def inner(n):
        total = 0
        for i in range(n):
            total += i
        return total

    def middle():
        return inner(3000)

    def outer():
        return middle()

    def fresh(k):
        namespace = {}
        exec(compile(f"def fresh_{k}():\\n    return {k}\\n", "generated.py",
                     "exec"), namespace)
        return namespace[f"fresh_{k}"]()

    def work(results, slot):
        bad = k = 0
        while not os.path.exists(sys.argv[2]):
            bad += outer() != 4498500
            if k % 50 == 0:
                bad += fresh(k) != k
            k += 1
        results[slot] = bad

    mode = sys.argv[1]
    results = [None] * 3
    if mode == "busy":
        print(os.getpid(), flush=True)
        work(results, 0)
    elif mode == "threads":
        print(os.getpid(), flush=True)
        threads = [threading.Thread(target=work, args=(results, i))
                   for i in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    elif mode == "sleep":
        print(os.getpid(), flush=True)
        sys.stdin.readline()            # blocked in read()
        results[0] = outer() != 4498500
        print(sys.is_stack_trampoline_active(), flush=True)
        sys.stdin.readline()
    elif mode == "undumpable":
        PR_SET_DUMPABLE = 4
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)
        print(os.getpid(), flush=True)
        work(results, 0)
    elif mode == "fork":
        child = os.fork()
        if child == 0:
            print(os.getpid(), flush=True)
            work(results, 0)
            print("child bad", results[0], flush=True)
            os._exit(0)
        os.waitpid(child, 0)
    print("bad", sum(r for r in results if r is not None), flush=True)
    """

INNER_CHAIN = ["inner", "middle", "outer"]


# The tool reads the target through /proc/PID/{maps,mem} and writes it
# through gdb: under qemu-user that is qemu, not the interpreter.
@needs_host("gdb", "/proc/PID/mem")
class AttachTestCase(PerfTestCase):

    def setUp(self):
        super().setUp()
        self.target_path = write_script(self.tmpdir, TARGET, "target.py")
        self.targets = 0

    def start(self, mode, python=sys.executable):
        """Start the target; return (Popen, pid of the process to attach
        to)."""
        self.targets += 1
        stop_path = os.path.join(self.tmpdir, f"stop{self.targets}")
        proc = subprocess.Popen(
            [python, self.target_path, mode, stop_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=clean_env(),
            cwd=self.tmpdir)
        proc.stop_path = stop_path
        self.addCleanup(self.finish, proc)
        pid = int(proc.stdout.readline())
        self.files.add_pid(proc.pid)
        self.files.add_pid(pid)
        return proc, pid

    def finish(self, proc, timeout=TIMEOUT):
        """Stop the target; return (stdout, stderr) after the pid."""
        open(proc.stop_path, "w").close()
        if proc.stdin and not proc.stdin.closed:
            try:
                proc.stdin.write("\n\n")
                proc.stdin.flush()
            except BrokenPipeError:
                pass
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        return out, err

    def tool(self, *args, env=None, prefix=()):
        """Run python -m perf_trampoline ARGS; return CompletedProcess."""
        return subprocess.run(
            [*prefix, sys.executable, "-m", "perf_trampoline", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env() if env is None else env, timeout=TIMEOUT)

    def switch(self, command, pid, *args):
        result = self.tool(command, str(pid), *args)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        return result.stdout

    def script_names(self, pid):
        return [e.qualname for e in read_map(pid)
                if e.filename == self.target_path]


class AttachTests(AttachTestCase):

    def setUp(self):
        super().setUp()
        reason = gdb_available()
        if reason:
            skip_environment(reason)

    def test_attach_profile_detach(self):
        proc, pid = self.start("busy")
        self.assertIn("perf trampolines are off", self.switch("status", pid))
        out = self.switch("attach", pid)
        self.assertIn(f"process {pid}: perf trampolines are on (backend "
                      f"perf)", out)
        self.assertIn(f"perf record -g -p {pid}", out)
        self.assertIn("on (backend perf)", self.switch("status", pid))
        # Functions called from now on have trampolines; work() and the
        # module were running already and stay unnamed.  fresh() may come
        # first when the switch lands on a round that calls it.
        time.sleep(0.2)
        names = self.script_names(pid)
        chain = [name for name in names if name != "fresh"]
        self.assertEqual(chain[:3], ["outer", "middle", "inner"])
        self.assertNotIn("work", names)

        reason = perf_record_works()
        if reason:
            skip_environment(reason)
        record, samples = record_samples(["sleep", "1"], self.tmpdir,
                                         options=["-p", str(pid)])
        self.assertEqual(record.returncode, 0, record.stderr)
        chains = [s.python_frames(self.target_path) for s in samples]
        self.assertIn(INNER_CHAIN, chains)
        for chain in chains:
            if "inner" in chain:
                self.assertEqual(chain, INNER_CHAIN)

        self.assertIn("perf trampolines are off",
                      self.switch("detach", pid))
        # New code objects get no trampoline any more.
        lines = len(read_map(pid))
        time.sleep(0.3)
        self.assertEqual(len(read_map(pid)), lines)
        out, err = self.finish(proc)
        self.assertEqual((out, err), ("bad 0\n", ""))

    def test_perf_jit_backend(self):
        proc, pid = self.start("busy")
        self.assertIn("on (backend perf_jit)",
                      self.switch("attach", pid, "--backend", "perf_jit"))
        time.sleep(0.1)
        self.assertTrue(os.path.exists(jitdump_path(pid)))
        self.assertIn("off", self.switch("detach", pid))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_many_cycles_leave_output_identical(self):
        untouched, _ = self.start("busy")
        time.sleep(0.2)
        expected = self.finish(untouched)
        proc, pid = self.start("busy")
        for i in range(4):
            backend = ("perf", "perf_jit")[i % 2]
            self.assertIn(f"on (backend {backend})",
                          self.switch("attach", pid, "--backend", backend))
            self.assertIn("off", self.switch("detach", pid))
        self.assertEqual(self.finish(proc), expected)
        self.assertEqual(expected, ("bad 0\n", ""))

    def test_sleeping_target_switches_when_it_runs_python(self):
        proc, pid = self.start("sleep")
        out = self.switch("attach", pid, "--timeout", "0.5")
        self.assertIn(f"process {pid}: request pending", out)
        self.assertIn("request pending", self.switch("status", pid))
        proc.stdin.write("\n")
        proc.stdin.flush()
        self.assertEqual(proc.stdout.readline(), "True\n")
        self.assertIn("on (backend perf)", self.switch("status", pid))
        self.assertEqual(self.script_names(pid)[:3],
                         ["outer", "middle", "inner"])
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_threads(self):
        # The main thread waits in join(): a worker acts on the request.
        proc, pid = self.start("threads")
        self.assertIn("on (backend perf)", self.switch("attach", pid))
        time.sleep(0.2)
        self.assertIn("inner", self.script_names(pid))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_shared_libpython_target(self):
        # The control block lives in libpython3.11.so, not the executable.
        nofp = os.environ.get("PERF_NOFP_PYTHON")
        if not nofp:
            skip_environment("PERF_NOFP_PYTHON (a --enable-shared build, "
                             "make nofp) is not set")
        proc, pid = self.start("busy", python=nofp)
        self.assertIn("on (backend perf)", self.switch("attach", pid))
        time.sleep(0.2)
        self.assertIn("inner", self.script_names(pid))
        self.assertIn("off", self.switch("detach", pid))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_forked_child(self):
        started = time.time()
        proc, child = self.start("fork")
        self.assertIn("on (backend perf)", self.switch("attach", child))
        time.sleep(0.2)
        self.assertIn("inner", self.script_names(child))
        out, err = self.finish(proc)
        self.assertEqual((out, err), ("child bad 0\nbad 0\n", ""))
        # (An older map of a process that had the parent's pid is not its.)
        self.assertFalse(map_written_since(proc.pid, started))


class AttachErrorTests(AttachTestCase):
    """Each error exits 1 with a message and leaves the target alone."""

    def assertRefused(self, result, message):
        self.assertEqual(result.returncode, 1, result.stdout)
        self.assertEqual(result.stdout, "")
        self.assertTrue(result.stderr.startswith("perf_trampoline: "),
                        result.stderr)
        self.assertIn(message, result.stderr)

    def test_no_such_process(self):
        done = subprocess.run(["true"])
        pid = subprocess.Popen(["true"])
        pid.wait()
        for command in ("attach", "detach", "status"):
            with self.subTest(command=command):
                self.assertRefused(self.tool(command, str(pid.pid)),
                                   f"no such process: {pid.pid}")
        self.assertEqual(done.returncode, 0)

    def test_not_this_interpreter(self):
        stock = "/usr/bin/python3.11"
        if not os.path.exists(stock):
            skip_environment(f"{stock} (Debian's python3.11) is not "
                             f"installed")
        proc, pid = self.start("busy", python=stock)
        for command in ("attach", "status"):
            with self.subTest(command=command):
                self.assertRefused(self.tool(command, str(pid)),
                                   "this interpreter has no perf "
                                   "trampolines")
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_gdb_missing(self):
        proc, pid = self.start("busy")
        env = clean_env(PATH=os.path.join(self.tmpdir, "empty"))
        self.assertRefused(self.tool("attach", str(pid), env=env),
                           "gdb is needed")
        self.assertIn("off", self.tool("status", str(pid)).stdout)
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_not_permitted(self):
        # Without CAP_SYS_PTRACE, root may not trace a process that made
        # itself undumpable.
        setpriv = shutil.which("setpriv")
        if os.geteuid() != 0 or setpriv is None:
            skip_environment("needs root and setpriv (util-linux) to drop "
                             "CAP_SYS_PTRACE")
        proc, pid = self.start("undumpable")
        prefix = [setpriv, "--bounding-set", "-sys_ptrace", "--"]
        for command in ("attach", "status"):
            with self.subTest(command=command):
                self.assertRefused(self.tool(command, str(pid),
                                             prefix=prefix),
                                   f"not permitted to attach to process "
                                   f"{pid}")
        self.assertIn("off", self.tool("status", str(pid)).stdout)
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_bad_arguments(self):
        for args in ([], ["attach"], ["attach", "x"], ["frobnicate", "1"],
                     ["attach", "1", "--backend", "nope"]):
            with self.subTest(args=args):
                result = self.tool(*args)
                self.assertEqual(result.returncode, 2)
                self.assertIn("usage:", result.stderr)


if __name__ == "__main__":
    unittest.main()
