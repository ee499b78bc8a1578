"""python -I -m perf_trampoline: switching a running process
(Lib/perf_trampoline/).

The targets are started without -X perf; the tool switches them by
writing a request and the eval breaker through /proc/PID/mem.
"""

import errno
import os
import random
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import unittest.mock
from textwrap import dedent

import perf_trampoline
from perf_trampoline import _attach, _elf, _procfs
from perf_trampoline import __main__ as command_line
from test.test_perf_profiler.util import (
    CHAIN, CHAIN_SOURCE, NOFP_ONCE, PerfTestCase, TIMEOUT, assert_refused, clean_env,
    jitdump_path, map_written_since, needs_host, perf_record_works, read_map,
    record_samples, skip_environment, unshare_pid_namespace, write_script)

# The target: work() calls outer -> middle -> inner and now and then
# compiles a new function, until the file argv[2] exists; it checks every
# result and ends by printing how many were wrong.
TARGET = "import ctypes, os, sys, threading\n\n" + CHAIN_SOURCE + dedent("""
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
    elif mode in ("sleep", "time.sleep", "lock"):
        print(os.getpid(), flush=True)
        if mode == "sleep":
            sys.stdin.readline()        # blocked in read()
        elif mode == "time.sleep":
            import time
            time.sleep(float(os.environ.get("SLEEP", "3")))
        else:
            lock = threading.Lock()
            lock.acquire()
            lock.acquire(timeout=float(os.environ.get("SLEEP", "3")))
        results[0] = outer() != 4498500
        print(sys.is_stack_trampoline_active(), flush=True)
        sys.stdin.readline()
    elif mode == "exec":
        print(os.getpid(), flush=True)
        sys.stdin.readline()
        os.execv(sys.executable, [sys.executable, sys.argv[0], "busy",
                                  sys.argv[2]])
    elif mode == "C call":
        print(os.getpid(), flush=True)
        sum(range(10 ** 13))            # never checks the eval breaker
    elif mode == "subinterpreter":
        import _xxsubinterpreters
        print(os.getpid(), flush=True)
        _xxsubinterpreters.run_string(_xxsubinterpreters.create(),
                                      "while True: pass")
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
    """)

INNER_CHAIN = CHAIN


def proc_stat(pid):
    """(state letter, flags) of process `pid` from /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return fields[0], int(fields[6])


# The tool reads and writes the target through /proc/PID/mem: under
# qemu-user that is qemu, not the interpreter.
@needs_host("/proc/PID/mem")
class AttachTestCase(PerfTestCase):

    def setUp(self):
        super().setUp()
        self.target_path = write_script(self.tmpdir, TARGET, "target.py")
        self.targets = 0

    def start(self, mode, python=sys.executable, env=None, prefix=()):
        """Start the target; return (Popen, pid of the process to attach
        to)."""
        self.targets += 1
        stop_path = os.path.join(self.tmpdir, f"stop{self.targets}")
        proc = subprocess.Popen(
            [*prefix, python, self.target_path, mode, stop_path],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            env=clean_env() if env is None else env, cwd=self.tmpdir)
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

    def tool(self, *args, env=None, prefix=(), timeout=TIMEOUT):
        """Run python -I -m perf_trampoline ARGS; return
        CompletedProcess."""
        return subprocess.run(
            [*prefix, sys.executable, "-I", "-m", "perf_trampoline", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env() if env is None else env, timeout=timeout)

    def switch(self, command, pid, *args):
        result = self.tool(command, str(pid), *args)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr, "")
        return result.stdout

    def script_names(self, pid):
        return [e.qualname for e in read_map(pid)
                if e.filename == self.target_path]


class AttachTests(AttachTestCase):

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

    # Finding 5 of issue 37: nothing can wake a blocked thread without a
    # signal it would see, so the tool says within a second what the
    # target is blocked in, and that the request is pending.
    def test_blocked_target_answers_within_a_second(self):
        for mode, blocked in (("sleep", "blocked in read()"),
                              ("time.sleep", "blocked in "),
                              ("lock", "blocked in ")):
            with self.subTest(mode=mode):
                proc, pid = self.start(mode, env=clean_env(SLEEP="30"))
                time.sleep(0.1)             # into the blocking call
                started = time.monotonic()
                result = self.tool("attach", str(pid), "--timeout", "30",
                                   timeout=TIMEOUT)
                self.assertLess(time.monotonic() - started, 1.0)
                self.assertEqual((result.returncode, result.stderr),
                                 (1, ""))
                self.assertIn(f"process {pid}: request pending: its main "
                              f"thread is {blocked}", result.stdout)
                self.assertIn("takes effect when it next runs Python code",
                              result.stdout)
                status = self.switch("status", pid)
                self.assertIn("off; a request is pending", status)
                if mode != "sleep":
                    proc.kill()
                    continue
                proc.stdin.write("\n")
                proc.stdin.flush()
                self.assertEqual(proc.stdout.readline(), "True\n")
                self.assertIn("on (backend perf)",
                              self.switch("status", pid))
                self.assertEqual(self.script_names(pid)[:3],
                                 ["outer", "middle", "inner"])
                self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_blocked_target_no_wait_withdraws(self):
        proc, pid = self.start("sleep")
        started = time.monotonic()
        result = self.tool("attach", str(pid), "--no-wait")
        self.assertLess(time.monotonic() - started, 1.0)
        self.assertEqual((result.returncode, result.stderr), (1, ""))
        self.assertIn(f"process {pid}: request withdrawn (its main thread "
                      f"is blocked in read()", result.stdout)
        self.assertIn("it changed nothing", result.stdout)
        self.assertEqual(self.switch("status", pid),
                         f"process {pid}: perf trampolines are off\n")
        proc.stdin.write("\n")
        proc.stdin.flush()
        self.assertEqual(proc.stdout.readline(), "False\n")
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_long_c_call_is_pending(self):
        proc, pid = self.start("C call")
        self.addCleanup(proc.kill)
        result = self.tool("attach", str(pid), "--timeout", "0.3")
        self.assertEqual((result.returncode, result.stderr), (1, ""))
        self.assertIn(f"process {pid}: request pending: its main thread is "
                      f"running, but not the main interpreter's Python code",
                      result.stdout)
        proc.kill()

    def test_subinterpreter_is_pending(self):
        # Python code, but a subinterpreter's: status says which.
        proc, pid = self.start("subinterpreter")
        self.addCleanup(proc.kill)
        result = self.tool("attach", str(pid), "--timeout", "0.3")
        self.assertEqual((result.returncode, result.stderr), (1, ""))
        self.assertIn("running, but not the main interpreter's Python code "
                      "(a long call into C, or a subinterpreter)",
                      result.stdout)
        self.assertEqual(perf_trampoline.status(pid), (None, True))
        proc.kill()

    def test_threads(self):
        # The main thread waits in join(): a worker acts on the request.
        proc, pid = self.start("threads")
        self.assertIn("on (backend perf)", self.switch("attach", pid))
        time.sleep(0.2)
        self.assertIn("inner", self.script_names(pid))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    @NOFP_ONCE
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

    @NOFP_ONCE
    def test_shared_libpython_without_cap_sys_admin(self):
        # Without CAP_SYS_ADMIN (nor CAP_CHECKPOINT_RESTORE), the tool
        # cannot open /proc/PID/map_files: it reads libpython's dynamic
        # symbols where the target has it loaded.  (Root without them, not
        # another user: that one may not read a tree under /root.)
        nofp = os.environ.get("PERF_NOFP_PYTHON")
        setpriv = shutil.which("setpriv")
        if not nofp or os.geteuid() != 0 or setpriv is None:
            skip_environment("needs PERF_NOFP_PYTHON (a --enable-shared "
                             "build, make nofp), root and setpriv "
                             "(util-linux) to drop capabilities")
        caps = "-sys_admin,-checkpoint_restore"
        without = [setpriv, f"--bounding-set={caps}", f"--inh-caps={caps}",
                   "--"]
        proc, pid = self.start("busy", python=nofp)
        for command, state in (("attach", "on (backend perf)"),
                               ("detach", "off")):
            result = self.tool(command, str(pid), prefix=without)
            self.assertEqual((result.returncode, result.stderr), (0, ""))
            self.assertIn(state, result.stdout)
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
    """Each error is one line on stderr and exit status 2, and leaves the
    target alone."""

    def assertRefused(self, result, message):
        assert_refused(self, result, message)

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
                result = self.tool(command, str(pid))
                self.assertRefused(result, f"runs {stock}, which has no "
                                           f"perf trampolines")
                # What to do instead (issue 53: the extension).
                self.assertIn("perftramp311 installed and "
                              "PYTHONPERFSUPPORT=1", result.stderr)
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_needs_no_gdb(self):
        # Nor anything else on PATH.
        proc, pid = self.start("busy")
        env = clean_env(PATH=os.path.join(self.tmpdir, "empty"))
        result = self.tool("attach", str(pid), env=env)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("on (backend perf)", self.tool("status", str(pid),
                                                    env=env).stdout)
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

    def test_not_python(self):
        proc = subprocess.Popen(["sleep", "30"])
        self.addCleanup(proc.wait)
        self.addCleanup(proc.kill)
        for command in ("attach", "status"):
            with self.subTest(command=command):
                self.assertRefused(self.tool(command, str(proc.pid)),
                                   "which has no perf trampolines")
        self.assertIsNone(proc.poll())

    def test_kernel_thread(self):
        PF_KTHREAD = 0x00200000
        for name in os.listdir("/proc"):
            if name.isdigit() and not os.path.exists(f"/proc/{name}/exe"):
                try:
                    if proc_stat(name)[1] & PF_KTHREAD:
                        break
                except OSError:
                    continue
        else:
            skip_environment("no kernel thread is visible in /proc")
        for command in ("attach", "detach", "status"):
            with self.subTest(command=command):
                self.assertRefused(self.tool(command, name),
                                   "is a kernel thread")

    def test_zombie(self):
        proc = subprocess.Popen(["true"])
        self.addCleanup(proc.wait)
        while proc_stat(proc.pid)[0] != "Z":
            time.sleep(0.01)
        for command in ("attach", "detach", "status"):
            with self.subTest(command=command):
                self.assertRefused(self.tool(command, str(proc.pid)),
                                   "has exited (a zombie")


# ----------------------------------------------------------------------
# Issue 37: an attach that is safe to run as root

def copy_of_interpreter(directory):
    """(path, env) of a copy of sys.executable in `directory` that runs
    with this interpreter's standard library and extension modules (the
    directories of sys.path: a build tree's or an installation's)."""
    path = os.path.join(directory, "python")
    shutil.copy(sys.executable, path)
    search = [entry for entry in sys.path if entry and os.path.isdir(entry)]
    return path, clean_env(PYTHONHOME=os.path.join(directory, "nohome"),
                           PYTHONPATH=os.pathsep.join(search))


def elf_file(path, *, data=None, **fields):
    """Write a copy of sys.executable to `path` with ELF header `fields`
    (e_shoff, e_shentsize, e_shnum) replaced."""
    if data is None:
        with open(sys.executable, "rb") as f:
            data = bytearray(f.read())
    offsets = {"e_shoff": (40, "<Q"), "e_shentsize": (58, "<H"),
               "e_shnum": (60, "<H")}
    for name, value in fields.items():
        offset, fmt = offsets[name]
        struct.pack_into(fmt, data, offset, value)
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, 0o755)
    return path


# The interpreter's own file is the sample ELF, and its image in memory:
# under qemu-user, sys.executable is the wrapper script that runs it, and
# /proc/self/mem is the host's view, where the guest's addresses need not
# be.
@needs_host("the interpreter's ELF file and /proc/self/mem")
class ELFReaderTests(unittest.TestCase):
    """perf_trampoline._elf.dynamic_symbol() reads only what it needs,
    checks every offset, and refuses what is not a regular ELF file."""

    def setUp(self):
        self.tmpdir = os.path.realpath(self.enterContext(
            tempfile.TemporaryDirectory()))

    def symbol(self, path, flags=os.O_RDONLY | os.O_NONBLOCK):
        fd = os.open(path, flags)
        try:
            return _elf.dynamic_symbol(fd, b"_PyPerf_remote")
        finally:
            os.close(fd)

    def assertMalformed(self, path, message):
        with self.assertRaisesRegex(_elf.ELFError, message):
            self.symbol(path)

    def test_interpreter(self):
        found = self.symbol(sys.executable)
        if found is None:           # a shared libpython build
            import _ctypes
            self.assertIsNotNone(_ctypes.dlsym(_ctypes.dlopen(None),
                                               "_PyPerf_remote"))
        else:
            self.assertIn(found[1], (2, 3))     # ET_EXEC, ET_DYN

    def test_fifo(self):
        path = os.path.join(self.tmpdir, "fifo")
        os.mkfifo(path)
        started = time.monotonic()
        self.assertMalformed(path, "not a regular file")
        self.assertLess(time.monotonic() - started, 2.0)

    def test_device(self):
        path = os.path.join(self.tmpdir, "libpython3.11.so")
        os.symlink("/dev/zero", path)
        self.assertMalformed(path, "not a regular file")

    def test_not_elf(self):
        path = os.path.join(self.tmpdir, "script")
        with open(path, "wb") as f:
            f.write(b"#!/bin/sh\n" * 10)
        self.assertMalformed(path, "not an ELF file")
        with open(path, "wb") as f:
            f.write(b"\x7fELF")
        self.assertMalformed(path, "the ELF header: beyond the end")
        with open(path, "wb") as f:
            f.write(b"\x7fELF\x01\x01" + bytes(58))
        self.assertMalformed(path, "not a 64-bit little-endian")

    def test_bad_section_headers(self):
        path = os.path.join(self.tmpdir, "python")
        with open(sys.executable, "rb") as f:
            data = bytearray(f.read())
        for fields, message in (
                ({"e_shoff": len(data) - 10}, "section headers: beyond"),
                ({"e_shoff": 2 ** 64 - 64}, "section headers: beyond"),
                ({"e_shentsize": 40}, "section header size 40"),
                ({"e_shnum": 0xffff}, "section headers: beyond")):
            with self.subTest(fields=fields):
                elf_file(path, data=bytearray(data), **fields)
                self.assertMalformed(path, message)

    def test_bad_dynsym(self):
        path = os.path.join(self.tmpdir, "python")
        with open(sys.executable, "rb") as f:
            data = bytearray(f.read())
        shoff, = struct.unpack_from("<Q", data, 40)
        shnum, = struct.unpack_from("<H", data, 60)
        for i in range(shnum):
            at = shoff + i * 64
            if struct.unpack_from("<I", data, at + 4)[0] == 11:
                break
        else:
            self.skipTest("the interpreter has no .dynsym")
        for offset, fmt, value, message in (
                (24, "<Q", len(data) + 1, ".dynsym: beyond"),   # sh_offset
                (32, "<Q", 2 ** 40 * 24, "too large"),          # sh_size
                (40, "<I", 0xffff, "no string table"),          # sh_link
                (56, "<Q", 16, "not 24 bytes")):                # entsize
            with self.subTest(field=offset):
                bad = bytearray(data)
                struct.pack_into(fmt, bad, at + offset, value)
                elf_file(path, data=bad)
                self.assertMalformed(path, message)

    def own_memory(self):
        """read(address, size) of this process's memory."""
        fd = os.open("/proc/self/mem", os.O_RDONLY)
        self.addCleanup(os.close, fd)
        return lambda address, size: os.pread(fd, size, address)

    def test_loaded_symbol(self):
        # This process's own image, read where it is loaded.
        import ctypes
        expected = ctypes.addressof(
            ctypes.c_int.in_dll(ctypes.pythonapi, "_PyPerf_remote"))
        mappings = _procfs._mappings(os.getpid())
        with open("/proc/self/maps") as f:
            for line in f:
                fields = line.split(maxsplit=5)
                start, end = (int(x, 16) for x in fields[0].split("-"))
                if start <= expected < end:
                    path = fields[5].rstrip("\n")
                    break
        base = min(m[0] for m in mappings if m[2] == path)
        read = self.own_memory()
        self.assertEqual(_elf.loaded_symbol(
            read, base, b"_PyPerf_remote"), expected)
        self.assertIsNone(_elf.loaded_symbol(
            read, base, b"_PyPerf_no_such_symbol"))
        with self.assertRaisesRegex(_elf.ELFError,
                                    "the ELF header is not mapped"):
            _elf.loaded_symbol(lambda a, n: b"", base, b"x")
        with self.assertRaisesRegex(_elf.ELFError,
                                    "not a 64-bit little-endian"):
            _elf.loaded_symbol(lambda a, n: bytes(n), base,
                                          b"x")

    def test_loaded_symbol_of_the_executable(self):
        # An executable linked not position-independent (ET_EXEC: the
        # Debian and release builds) is loaded at its own addresses, a
        # PIE (ET_DYN) at an offset: the file's reader says which.
        name = b"_IO_stdin_used"    # glibc's, in every executable
        exe = os.readlink("/proc/self/exe")
        base = min(m[0] for m in _procfs._mappings(os.getpid())
                   if m[2] == exe)
        fd = os.open("/proc/self/exe", os.O_RDONLY)
        try:
            found = _elf.dynamic_symbol(fd, name)
        finally:
            os.close(fd)
        if found is None:
            self.skipTest(f"{exe} does not export {name.decode()}")
        value, e_type = found
        ET_DYN = 3
        expected = value + base if e_type == ET_DYN else value
        self.assertEqual(
            _elf.loaded_symbol(self.own_memory(), base, name), expected)

    def test_reads_little(self):
        # A terabyte (a hole) is not read whole: only the headers, whose
        # section headers (zeros) have no .dynsym.
        path = os.path.join(self.tmpdir, "sparse")
        with open(sys.executable, "rb") as f:
            head = f.read(64)
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(1 << 40)
        self.assertIsNone(self.symbol(path))


class AttachSafetyTests(AttachTestCase):
    """What issue 37 found in the attach, each shown fixed."""

    def control(self, pid):
        with _attach._Control(pid, writable=False) as control:
            return control.address, control.read()

    # Finding 1: a write after exec or exit fails instead of landing in
    # whatever runs under the pid now.
    def test_mem_descriptor_dies_with_exec(self):
        # The kernel's behaviour the tool relies on.
        proc, pid = self.start("exec")
        fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        self.addCleanup(os.close, fd)
        address = _attach._control_address(pid, fd)
        self.assertEqual(len(os.pread(fd, 4, address)), 4)
        proc.stdin.write("\n")
        proc.stdin.flush()
        self.assertEqual(int(proc.stdout.readline()), pid)
        for access in (lambda: os.pread(fd, 4, address),
                       lambda: os.pwrite(fd, b"\1\0\0\0", address)):
            try:
                result = access()
            except OSError as exc:
                self.assertIn(exc.errno, (errno.EIO, errno.ESRCH))
            else:
                self.assertIn(result, (b"", 0))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_exec_between_check_and_write(self):
        proc, pid = self.start("exec")

        def exec_now(stage):
            if stage == "checked":
                proc.stdin.write("\n")
                proc.stdin.flush()
                # The new image is running Python code.
                self.assertEqual(int(proc.stdout.readline()), pid)

        with self.assertRaisesRegex(perf_trampoline.RemoteError,
                                    "exited or exec'd another program "
                                    "while the tool looked at it: nothing "
                                    "was written"):
            _attach._request(pid, _attach.REQUESTS["perf"],
                                     2.0, _hook=exec_now)
        _, (request, _, handled, active, taken) = self.control(pid)
        self.assertEqual((request, handled, active, taken), (0, 0, 0, 0))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_exit_between_check_and_write(self):
        proc, pid = self.start("busy")

        def exit_now(stage):
            if stage == "checked":
                proc.kill()
                proc.wait()

        with self.assertRaisesRegex(perf_trampoline.RemoteError,
                                    "nothing was written"):
            _attach._request(pid, _attach.REQUESTS["perf"],
                                     2.0, _hook=exit_now)

    # Finding 2: the tool killed at any instant never leaves the target
    # stopped, nor a request it cannot see.
    def test_sigkill_at_any_instant(self):
        proc, pid = self.start("busy")
        rng = random.Random(37)

        def run_tool(command):
            child = os.fork()
            if child == 0:
                code = 3
                try:
                    os.setpgid(0, 0)
                    null = os.open(os.devnull, os.O_WRONLY)
                    os.dup2(null, 1)
                    os.dup2(null, 2)
                    code = command_line.main([command, str(pid)])
                finally:
                    os._exit(code)
            return child

        # How long a whole switch takes here: the kills fall within it.
        started = time.monotonic()
        for command in ("attach", "detach"):
            _, code = os.waitpid(run_tool(command), 0)
            self.assertEqual(os.waitstatus_to_exitcode(code), 0)
        whole = (time.monotonic() - started) / 2
        for i in range(100):
            child = run_tool(("attach", "detach")[i % 2])
            time.sleep(rng.uniform(0, whole * 1.2))
            try:
                os.killpg(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(child, 0)
            # (A tracer that was just killed may still be detaching.)
            deadline = time.monotonic() + 1.0
            while (proc_stat(pid)[0] in "tT"
                   and time.monotonic() < deadline):
                time.sleep(0.01)
            self.assertNotIn(proc_stat(pid)[0], "tT",
                             f"left stopped in cycle {i}")
            # Whatever it left (on, off, a request pending), status
            # tells.
            self.assertIn(perf_trampoline.status(pid)[0], (None, "perf"))
        self.assertIn("off", self.switch("detach", pid))
        self.assertEqual(self.switch("status", pid),
                         f"process {pid}: perf trampolines are off\n")
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_interrupted_withdraws(self):
        for signum in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=signum):
                proc, pid = self.start("sleep")
                tool = subprocess.Popen(
                    [sys.executable, "-I", "-m", "perf_trampoline",
                     "attach", str(pid), "--timeout", "30"],
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                    text=True)
                # Until the request is written.
                while not perf_trampoline.status(pid)[1]:
                    time.sleep(0.005)
                tool.send_signal(signum)
                out, err = tool.communicate(timeout=TIMEOUT)
                self.assertEqual((tool.returncode, err), (1, ""))
                self.assertIn("request withdrawn (interrupted); it "
                              "changed nothing", out)
                self.assertEqual(perf_trampoline.status(pid),
                                 (None, False))
                proc.stdin.write("\n")
                proc.stdin.flush()
                self.assertEqual(proc.stdout.readline(), "False\n")
                self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    # Issue 50: two tools at once each report what the target did with
    # their own request.
    def test_replaced_request_is_not_reported_done(self):
        # Stopped, the target takes neither request until both are
        # written: the second replaces the first, deterministically.
        proc, pid = self.start("busy")
        os.kill(pid, signal.SIGSTOP)
        while proc_stat(pid)[0] != "T":
            time.sleep(0.001)
        first_written = threading.Event()
        outcomes = {}

        def first(stage):
            if stage == "armed":
                first_written.set()

        def second(stage):
            if stage == "armed":
                os.kill(pid, signal.SIGCONT)

        def send(name, hook):
            outcomes[name] = _attach._request(
                pid, _attach.REQUESTS[name], TIMEOUT, _hook=hook)

        # A stopped target is not blocked for this test's purpose.
        with unittest.mock.patch.object(_attach, "BLOCKED_AFTER",
                                        TIMEOUT):
            thread = threading.Thread(target=send, args=("perf", first))
            thread.start()
            try:
                self.assertTrue(first_written.wait(TIMEOUT))
                send("off", second)
            finally:
                os.kill(pid, signal.SIGCONT)
                thread.join()
        self.assertEqual(outcomes["perf"].state, "replaced")
        self.assertEqual(outcomes["perf"].now, 0)
        self.assertEqual((outcomes["off"].state, outcomes["off"].active,
                          outcomes["off"].error), ("done", 0, 0))
        self.assertEqual(perf_trampoline.status(pid), (None, False))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_concurrent_attach_and_detach_tell_the_truth(self):
        proc, pid = self.start("busy")
        said = {"attach": "on (backend perf)", "detach": "off"}
        since = "another request has been acted on since: perf " \
                "trampolines are now "
        for i in range(20):
            # (A loaded machine may keep the target from running for a
            # while: only a replaced request may make a tool exit 1.)
            tools = {command: subprocess.Popen(
                [sys.executable, "-I", "-m", "perf_trampoline", command,
                 str(pid), "--timeout", str(TIMEOUT)],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                env=clean_env()) for command in said}
            reports = {}
            for command, tool in tools.items():
                out, err = tool.communicate(timeout=TIMEOUT)
                self.assertEqual(err, "", f"round {i}")
                reports[command] = (tool.returncode, out.splitlines())
            # The target's own state, now that both tools are done.
            final = "on (backend perf)" if perf_trampoline.status(pid)[0] \
                else "off"
            done = [command for command, (code, _) in reports.items()
                    if code == 0]
            self.assertTrue(done, f"round {i}: {reports}")
            for command, (code, lines) in reports.items():
                other = "detach" if command == "attach" else "attach"
                if code != 0:
                    # Its request never ran: the other one's did, last.
                    self.assertEqual(code, 1, f"round {i}: {lines}")
                    self.assertIn("another tool's request replaced this "
                                  "one", lines[0])
                    self.assertEqual(final, said[other], f"round {i}")
                    continue
                # Done: what its own request left, never the other's.
                self.assertEqual(lines[0], f"process {pid}: perf "
                                 f"trampolines are {said[command]}",
                                 f"round {i}: {reports}")
                if len(lines) > 1 and lines[1].startswith(since):
                    # The other request ran after this one: last.
                    self.assertEqual(lines[1], since + final)
                    self.assertEqual(final, said[other], f"round {i}")
                elif other not in done:
                    self.assertEqual(final, said[command], f"round {i}")
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_older_control_block(self):
        # Version 1 (an interpreter from before the tags), read from a
        # file standing in for the process's memory: status reads it,
        # attach refuses it with one line and writes nothing.
        path = os.path.join(self.tmpdir, "memory")
        block = struct.pack("<IIiiQIii", _attach.MAGIC, 1, 0, 0,
                            0x1000, 3, 1, 0)
        with open(path, "wb") as f:
            f.write(block)
        control = object.__new__(_attach._Control)
        control.pid, control.address = 4242, 0
        control.pidfd = control.proc = None
        control.fd = os.open(path, os.O_RDWR)
        self.addCleanup(control.close)
        control.version = control._check()
        self.assertEqual(perf_trampoline.status(control), ("perf", False))
        with self.assertRaisesRegex(
                perf_trampoline.RemoteError,
                r"^process 4242 runs an older build of perf trampolines "
                r"\(control block version 1\), whose answers cannot be "
                r"told apart: switch it with the perf_trampoline tool of "
                r"the Python it runs$"):
            perf_trampoline.detach(control)
        with open(path, "rb") as f:
            self.assertEqual(f.read(), block)

    # Finding 3: the images are read through /proc, never by a path the
    # target controls.
    def test_path_replaced(self):
        directory = os.path.join(self.tmpdir, "bin")
        os.mkdir(directory)
        python, env = copy_of_interpreter(directory)
        for replacement in ("fifo", "/dev/zero", "malformed"):
            with self.subTest(replacement=replacement):
                if not os.path.isfile(python):
                    os.unlink(python)
                    shutil.copy(sys.executable, python)
                proc, pid = self.start("busy", python=python, env=env)
                os.unlink(python)
                if replacement == "fifo":
                    os.mkfifo(python)
                elif replacement == "/dev/zero":
                    os.symlink("/dev/zero", python)
                else:
                    with open(python, "wb") as f:
                        f.write(b"\x7fELF\2\1" + bytes(100))
                started = time.monotonic()
                result = self.tool("attach", str(pid), timeout=2.0)
                self.assertLess(time.monotonic() - started, 2.0)
                self.assertEqual((result.returncode, result.stderr),
                                 (0, ""))
                self.assertIn("on (backend perf)", result.stdout)
                self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    def test_malformed_image(self):
        directory = os.path.join(self.tmpdir, "bin")
        os.mkdir(directory)
        python, env = copy_of_interpreter(directory)
        size = os.path.getsize(python)
        elf_file(python, e_shoff=size - 10)     # exec does not read them
        proc, pid = self.start("busy", python=python, env=env)
        started = time.monotonic()
        result = self.tool("attach", str(pid), timeout=2.0)
        self.assertLess(time.monotonic() - started, 2.0)
        self.assertEqual((result.returncode, result.stdout), (2, ""))
        self.assertEqual(result.stderr,
                         f"perf_trampoline: process {pid}: cannot read "
                         f"{python}: the section headers: beyond the end "
                         f"of the file\n")
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    # Finding 4: a recompute of the eval breaker that drops the tool's
    # wake-up: the tool sets it again while the request is pending.
    def test_lost_wakeup(self):
        proc, pid = self.start("busy")
        _, (_, breaker, _, _, _) = self.control(pid)
        fd = os.open(f"/proc/{pid}/mem", os.O_RDWR)
        self.addCleanup(os.close, fd)

        def recompute(stage):
            if stage == "armed":
                os.pwrite(fd, b"\0\0\0\0", breaker)

        outcome = _attach._request(
            pid, _attach.REQUESTS["perf"], TIMEOUT, _hook=recompute)
        self.assertEqual((outcome.state, outcome.active, outcome.error),
                         ("done", 1, 0))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))

    # Targets in another PID and mount namespace, by their host pid.
    def test_other_namespace(self):
        proc, nspid = self.start("busy", prefix=unshare_pid_namespace())
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            pid, = map(int, f.read().split())
        self.assertNotEqual(pid, nspid)
        self.files.add_pid(nspid)
        started = time.time()
        out = self.switch("attach", str(pid))
        self.assertIn(f"process {pid}: perf trampolines are on", out)
        self.assertIn(f"it is pid {nspid} in its own PID namespace", out)
        # --mount-proc makes only /proc private: the map is the host's
        # /tmp/perf-NSPID.map, where the host's perf looks for it.
        time.sleep(0.2)
        self.assertTrue(map_written_since(nspid, started))
        self.assertIn("inner", self.script_names(nspid))
        self.assertIn("off", self.switch("detach", str(pid)))
        self.assertEqual(self.finish(proc), ("bad 0\n", ""))


if __name__ == "__main__":
    unittest.main()
