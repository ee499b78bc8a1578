"""python -m perf_trampoline record (Lib/perf_trampoline/_record.py).

End to end with real perf: a command and a running process, with frame
pointers and with --jit (perf >= 6.1, PERF as in test_jit; the command
runs under PERF_NOFP_PYTHON when set); the Python call chain must be in
perf.data.  The command's stdout and stderr are its own: record's lines
follow on stderr.  Bad input must give one line on stderr and exit
status 2, and leave the named process alone; so must an output directory
that another user could write in, by its mode, its group or an ACL.
"""

import errno
import glob
import grp
import os
import pty
import pwd
import shlex
import shutil
import signal
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
import unittest
from unittest import mock

from test.test_perf_profiler.test_attach import INNER_CHAIN, TARGET
from test.test_perf_profiler.util import (
    NOFP_ONCE, PerfTestCase, TIMEOUT, assert_refused, clean_env, needs_host,
    parse_perf_script, perf_record_works, skip_environment,
    unshare_pid_namespace, write_script)

# Calls top -> mid -> leaf, then exits with status argv[1]; a SIGINT is
# answered with a line, after a pause perf's SIGTERM would cut short.
COMMAND = """\
    import os, signal, sys, time

    def leaf(n):
        total = 0
        for i in range(n):
            total += i
        return total

    def mid(n):
        return leaf(n)

    def top(rounds):
        for _ in range(rounds):
            mid(20000)

    def interrupted(signum, frame):
        time.sleep(0.3)
        # Not print(): the signal may arrive while print("started") is
        # still inside sys.stderr, which is not reentrant.
        os.write(2, b"handled SIGINT\\n")
        sys.exit(5)

    signal.signal(signal.SIGINT, interrupted)
    print("started", file=sys.stderr, flush=True)
    top(int(sys.argv[2]))
    while sys.argv[3] == "forever":
        top(10)
    print("done", file=sys.stderr)
    sys.exit(int(sys.argv[1]))
    """

CHAIN = ["leaf", "mid", "top"]

# What a command writes whose output is data: every byte value, no newline
# at the end.  record adds nothing to its stdout, and to its stderr only
# after it.
STDOUT_BYTES = bytes(range(256)) * 2 + b"\r\n\x00end"
STDERR_BYTES = b"\xff\xfe not text\nno newline"
# Writes them in two parts around calls of spin(), then exits 3.
BYTES_COMMAND = f"""\
    import os, sys

    def spin(n):
        total = 0
        for i in range(n):
            total += i
        return total

    os.write(1, {STDOUT_BYTES[:300]!r})
    os.write(2, {STDERR_BYTES[:10]!r})
    for _ in range(100):
        spin(20000)
    os.write(1, {STDOUT_BYTES[300:]!r})
    os.write(2, {STDERR_BYTES[10:]!r})
    sys.exit(3)
    """

NOBODY = 65534
# A user and a group no database names: an ACL entry takes any id.
STRANGER = 12345
DEFAULT_NAME = "perf-record-%Y%m%d-%H%M%S"

# Runs as pid 1 of a PID namespace of its own, where nothing else takes
# pids: record -p follows test_attach's target, which exits while record
# is stopped; a process started with -X perf then takes its pid.  Prints
# whether it did, record's exit status, and that process's state after.
REUSE_DRIVER = """\
    import os, signal, subprocess, sys, time
    import perf_trampoline
    from perf_trampoline._attach import _SYSCALLS
    python, target, out, stop = sys.argv[1:]

    def start(*options):
        proc = subprocess.Popen([python, *options, target, "busy", stop],
                                stdout=subprocess.PIPE, text=True)
        proc.stdout.readline()
        return proc

    first = start()
    record = subprocess.Popen(
        [python, "-I", "-m", "perf_trampoline", "record", "-p",
         str(first.pid), "--seconds", "60", "-o", out],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # Until record has switched it and waits in its loop (sigtimedwait):
    # stopped while it still switches, it would fail.
    numbers = _SYSCALLS[os.uname().machine]
    sigtimedwait, = [str(n) for n, name in numbers.items()
                     if name == "rt_sigtimedwait"]

    def looping():
        with open(f"/proc/{record.pid}/syscall") as f:
            return f.read().split()[0] == sigtimedwait

    while perf_trampoline.status(first.pid)[0] != "perf" or not looping():
        time.sleep(0.01)
    os.kill(record.pid, signal.SIGSTOP)
    first.kill()
    first.wait()
    with open("/proc/sys/kernel/ns_last_pid", "w") as f:
        f.write(str(first.pid - 1))
    second = start("-X", "perf")
    os.kill(record.pid, signal.SIGCONT)
    _, err = record.communicate()
    print("pid", first.pid, "reused", second.pid == first.pid, "record",
          record.returncode, repr(err))
    print("second", *perf_trampoline.status(second.pid))
    open(stop, "w").close()
    print("second's output", repr(second.communicate()[0]))
    """

# The -p tests record test_attach's target, mode "busy".
# What record writes with any perf, in the order it prints them (a perf
# with the gecko script adds gecko.json).
OUTPUTS = ["perf.data", "flamegraph.html", "flamegraph-python.html",
           "stacks.folded", "stacks-python.folded"]


def proc_state(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[0]


class RecordTestCase(PerfTestCase):

    perf = "perf"
    python = sys.executable
    env = {}

    def setUp(self):
        super().setUp()
        self.out = os.path.join(self.tmpdir, "out")
        # perf's build-id cache would be $HOME/.debug: a home of its own
        # shows that record puts nothing there.
        self.home = os.path.join(self.tmpdir, "home")
        os.mkdir(self.home)
        self.env = clean_env(PERF=None, HOME=self.home)
        self.addCleanup(self.remove_jitted)

    def tool(self, *args, timeout=TIMEOUT, cwd=None, text=True, **kwargs):
        """python -I -m perf_trampoline record ARGS, CompletedProcess;
        run in `cwd` (default self.tmpdir)."""
        kwargs = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE,
                  **kwargs}
        return subprocess.run(
            [sys.executable, "-I", "-m", "perf_trampoline", "record",
             *args], text=text, env=self.env, cwd=cwd or self.tmpdir,
            timeout=timeout, **kwargs)

    def command(self, status=0, rounds=100, forever=False):
        path = write_script(self.tmpdir, COMMAND, "command.py")
        return [self.python, path, str(status), str(rounds),
                "forever" if forever else "once"]

    def start_target(self, *python_args):
        """Start test_attach's target; return its pid."""
        path = write_script(self.tmpdir, TARGET, "target.py")
        stop = os.path.join(self.tmpdir, "stop")
        proc = subprocess.Popen([self.python, *python_args, path, "busy",
                                 stop],
                                stdout=subprocess.PIPE, text=True,
                                env=clean_env(), cwd=self.tmpdir)
        self.addCleanup(self.stop_target, proc, stop)
        pid = int(proc.stdout.readline())
        self.files.add_pid(pid)
        return pid

    def stop_target(self, proc, stop):
        open(stop, "w").close()
        try:
            out, _ = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        # It checks every result it computed.
        self.assertEqual(out, "bad 0\n")

    def assertRecorded(self, result, name="command.py", chain=CHAIN):
        """The paths record printed on stderr, perf.data first, and
        `chain` in it: Python frames of the script `name`, innermost
        first.  Returns the chains of the samples."""
        lines = result.stderr.splitlines()
        data = os.path.join(self.out, "perf.data")
        self.assertIn(data, lines, result.stderr)
        # The command's output comes first, then the paths.
        paths = lines[len(lines) - 1 - lines[::-1].index(data):]
        self.assertEqual(paths[:len(OUTPUTS)],
                         [os.path.join(self.out, name) for name in OUTPUTS],
                         result.stderr)
        for path in paths:
            self.assertTrue(os.path.isfile(path), path)
        # The perf report command record printed, from the directory.
        report = lines[lines.index(data) - 1]
        self.assertTrue(report.startswith("perf_trampoline: perf report: "),
                        result.stderr)
        script = subprocess.run(
            [*shlex.split(report.split(": ", 2)[2].replace(" report ",
                                                          " script ")),
             "-F", "pid,ip,sym"], cwd=self.out,
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            errors="backslashreplace", env=self.env, timeout=TIMEOUT)
        samples = parse_perf_script(script.stdout)
        pids = {sample.header.split()[0] for sample in samples}
        for pid in pids:
            self.files.add_pid(pid)
        path = os.path.join(self.tmpdir, name)
        chains = [s.python_frames(path) for s in samples]
        self.assertIn(chain, [c[:len(chain)] for c in chains])
        # Nothing in ~/.debug; no ELF file of perf inject's in /tmp.
        self.assertEqual(os.listdir(self.home), [])
        self.assertEqual([path for pid in pids for path in
                          glob.glob(f"/tmp/jitted-{pid}-*.so")], [])
        return chains

    def check_output_is_the_commands(self, *options):
        """record's stdout is the command's bytes alone, its stderr the
        command's and then record's lines, the paths last; its exit status
        the command's."""
        path = write_script(self.tmpdir, BYTES_COMMAND, "bytes.py")
        result = self.tool(*options, "-o", self.out, "--", self.python,
                           path, text=False)
        err = result.stderr.decode(errors="backslashreplace")
        self.assertEqual(result.returncode, 3, err)
        self.assertEqual(result.stdout, STDOUT_BYTES)
        self.assertEqual(result.stderr[:len(STDERR_BYTES)], STDERR_BYTES,
                         err)
        ours = result.stderr[len(STDERR_BYTES):].decode()
        self.assertTrue(ours.startswith("perf_trampoline: the command "
                                        "exited with status 3\n"), ours)
        self.assertRecorded(subprocess.CompletedProcess(
            result.args, result.returncode, "", ours), "bytes.py", ["spin"])

    def remove_jitted(self):
        for pid in self.files.pids:
            for path in glob.glob(f"/tmp/jitted-{pid}-*.so"):
                os.unlink(path)


@needs_host("perf")
class RecordTests(RecordTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        reason = perf_record_works()
        if reason:
            skip_environment(reason)

    def test_command(self):
        result = self.tool("-o", self.out, "--", *self.command())
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("started\ndone\n", result.stderr)
        self.assertRecorded(result)
        # A report this perf cannot write is said in --help, not here.
        self.assertNotIn("not written", result.stderr)

    def test_command_output_is_its_own(self):
        self.check_output_is_the_commands()

    def test_command_without_perl(self):
        # The exec helper in Python where there is no perl.
        from perf_trampoline import _record
        perf = shutil.which(self.perf)
        self.env["PATH"] = self.tmpdir
        with mock.patch.dict(os.environ, {"PATH": self.tmpdir}):
            self.assertEqual(_record._exec_helper()[:2],
                             [sys.executable, "-I"])
        result = self.tool("--perf", perf, "-o", self.out, "--",
                           *self.command())
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("started\ndone\n", result.stderr)
        self.assertRecorded(result)

    def test_command_has_no_descriptor_of_the_directory(self):
        # perf has one to write through; the command it runs has not.
        script = write_script(self.tmpdir, """\
            import os
            for fd in os.listdir("/proc/self/fd"):
                try:
                    print(os.readlink(f"/proc/self/fd/{fd}"))
                except OSError:
                    pass        # the descriptor listdir() used
            """, "fds.py")
        result = self.tool("-o", self.out, "--", sys.executable, script)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn(os.path.join(self.out, "perf.data"),
                      result.stderr.splitlines())
        self.assertNotIn(self.out, result.stdout.splitlines())

    def test_command_with_stdout_closed(self):
        # Its stdout is /dev/null, not a descriptor of record's that took
        # the closed one's number (perf's log).
        code = ("import os; os.write(2, os.readlink('/proc/self/fd/1')"
                ".encode() + b'\\n')")
        result = self.tool("-o", self.out, "--", sys.executable, "-c", code,
                           stdout=None, preexec_fn=lambda: os.close(1))
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stderr.splitlines()[0], os.devnull,
                         result.stderr)

    def test_command_fails(self):
        result = self.tool("-o", self.out, "--", *self.command(status=3))
        self.assertEqual(result.returncode, 3, result.stderr)
        self.assertIn("perf_trampoline: the command exited with status 3\n",
                      result.stderr)
        self.assertRecorded(result)

    def test_ctrl_c_reaches_the_command(self):
        # The terminal's Ctrl-C goes to the command, which handles it as it
        # would without perf (perf would end it with SIGTERM); recording
        # ends when it exits.
        master, slave = pty.openpty()
        self.addCleanup(os.close, master)

        def take_terminal():
            import fcntl
            import termios
            fcntl.ioctl(0, termios.TIOCSCTTY, 0)

        proc = subprocess.Popen(
            [sys.executable, "-I", "-m", "perf_trampoline", "record", "-o",
             self.out, "--", *self.command(forever=True)],
            stdin=slave, stdout=slave, stderr=slave, env=self.env,
            cwd=self.tmpdir, start_new_session=True,
            preexec_fn=take_terminal)
        os.close(slave)
        output = self.read_terminal(master, proc, b"started")
        os.write(master, b"\x03")
        output += self.read_terminal(master, proc)
        self.assertEqual(proc.wait(timeout=TIMEOUT), 5, output)
        text = output.decode(errors="replace")
        self.assertIn("handled SIGINT", text)
        self.assertIn("perf_trampoline: the command exited with status 5",
                      text)
        self.assertIn(os.path.join(self.out, "perf.data"), text)

    @staticmethod
    def read_terminal(master, proc, until=None):
        """What the terminal shows, until `until` appears or it closes."""
        output = b""
        deadline = time.monotonic() + TIMEOUT
        while time.monotonic() < deadline:
            try:
                chunk = os.read(master, 4096)
            except OSError:         # EIO: every writer has closed it
                break
            if not chunk:
                break
            output += chunk
            if until is not None and until in output:
                break
        return output

    def record_pid(self, pid, *args):
        result = self.tool("-p", str(pid), "--seconds", "1", "-o", self.out,
                           *args)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, "")
        return self.assertRecorded(result, "target.py", INNER_CHAIN)

    def test_process(self):
        import perf_trampoline
        pid = self.start_target()
        for chain in self.record_pid(pid):
            if "inner" in chain:
                self.assertEqual(chain[:3], INNER_CHAIN)
        # Switched back off.
        self.assertEqual(perf_trampoline.status(pid), (None, False))

    def test_process_already_on_is_left_on(self):
        import perf_trampoline
        pid = self.start_target("-X", "perf")
        self.record_pid(pid)
        self.assertEqual(perf_trampoline.status(pid), ("perf", False))

    def test_process_sigterm_switches_back(self):
        import perf_trampoline
        pid = self.start_target()
        tool = subprocess.Popen(
            [sys.executable, "-I", "-m", "perf_trampoline", "record", "-p",
             str(pid), "-o", self.out], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=self.env,
            cwd=self.tmpdir)
        self.addCleanup(tool.kill)
        deadline = time.monotonic() + TIMEOUT
        while perf_trampoline.status(pid)[0] != "perf":
            self.assertLess(time.monotonic(), deadline, "never attached")
            time.sleep(0.05)
        time.sleep(0.5)
        tool.send_signal(signal.SIGTERM)
        stdout, stderr = tool.communicate(timeout=TIMEOUT)
        self.assertEqual(tool.returncode, 0, stderr)
        self.assertRecorded(subprocess.CompletedProcess(
            tool.args, tool.returncode, stdout, stderr), "target.py",
            INNER_CHAIN)
        self.assertEqual(perf_trampoline.status(pid), (None, False))

    def test_reused_pid_is_left_alone(self):
        unshare = unshare_pid_namespace()
        driver = write_script(self.tmpdir, REUSE_DRIVER, "driver.py")
        target = write_script(self.tmpdir, TARGET, "target.py")
        result = subprocess.run(
            [*unshare, self.python, driver, self.python, target, self.out,
             os.path.join(self.tmpdir, "stop")],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=self.env, cwd=self.tmpdir, timeout=TIMEOUT)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        # Both processes' maps are in the host's /tmp, by their pid in the
        # namespace.
        pid = lines[0].split()[1]
        self.files.add_pid(pid)
        self.assertEqual(lines[0].split()[2:6],
                         ["reused", "True", "record", "0"], lines)
        # record saw its target exit and wrote nothing more: the process
        # that took the pid is still on.
        self.assertEqual(lines[1], "second perf False")
        self.assertEqual(lines[2], "second's output 'bad 0\\n'")

class FollowTests(unittest.TestCase):
    """record -- COMMAND follows the command's processes."""

    def test_descendants_read_only_their_tree(self):
        from perf_trampoline import _record
        code = ("import subprocess, sys\n"
                "child = subprocess.Popen([sys.executable, '-c', "
                "'import sys; sys.stdin.read()'], stdin=subprocess.PIPE)\n"
                "print(child.pid, flush=True)\n"
                "sys.stdin.read()\n"
                "child.stdin.close()\n"
                "child.wait()\n")
        proc = subprocess.Popen([sys.executable, "-c", code],
                                stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
        self.addCleanup(proc.wait)
        self.addCleanup(proc.stdin.close)
        grandchild = int(proc.stdout.readline())
        opened = []
        real_open, real_listdir = os.open, os.listdir

        def spy_open(path, *args, **kwargs):
            opened.append(os.fsdecode(path))
            return real_open(path, *args, **kwargs)

        def spy_listdir(path="."):
            opened.append(os.fsdecode(path))
            return real_listdir(path)

        with mock.patch("os.open", spy_open), \
                mock.patch("os.listdir", spy_listdir):
            found = _record.descendants(proc.pid)
        self.assertEqual(found, [grandchild])
        # Only the tree's own /proc entries: the cost does not grow with
        # the host's processes.
        tree = {str(proc.pid), str(grandchild)}
        self.assertTrue(opened)
        for path in opened:
            self.assertEqual(path.split("/")[:2], ["", "proc"], path)
            self.assertIn(path.split("/")[2:3], [[pid] for pid in tree],
                          path)


@needs_host("/proc/PID/mem")
class RecordErrorTests(RecordTestCase):
    """One line on stderr, exit status 2, nothing written, the process
    named left alone.  A fake perf stands in where none runs."""

    def setUp(self):
        super().setUp()
        self.fake_perf = self.make_perf("6.12.0")

    def make_perf(self, version):
        """A perf that says it is `version` and notes in self.perf_ran
        that it was asked to record."""
        self.perf_ran = os.path.join(self.tmpdir, "perf-ran")
        path = os.path.join(self.tmpdir, f"perf-{version}")
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\n"
                    f"[ \"$1\" = record ] && echo \"$@\" >> {self.perf_ran}\n"
                    f"echo 'perf version {version}'\n")
        os.chmod(path, 0o755)
        return path

    def assertRefused(self, result, message):
        assert_refused(self, result, message)
        self.assertFalse(os.path.exists(self.out))

    def test_no_perf(self):
        self.assertRefused(self.tool("--perf", "/nonexistent", "-o",
                                     self.out, "--", "true"),
                           "no perf found ('/nonexistent' from --perf)")
        # (Without PERF, the repository's build/perf comes before PATH:
        # test_cli's FindPerfTests.)
        self.env["PERF"] = "/nonexistent/perf"
        self.assertRefused(self.tool("-o", self.out, "--", "/bin/true"),
                           "no perf found ('/nonexistent/perf' from $PERF)")

    def test_perf_too_old_for_jit(self):
        old = self.make_perf("6.0")
        self.assertRefused(self.tool("--jit", "--perf", old, "-o",
                                     self.out, "--", "true"),
                           f"--jit needs perf >= 6.1 (perf inject --jit "
                           f"of DWARF-unwound frames; older ones were not "
                           f"tried); {old} is 6.0: name a newer one with "
                           f"--perf PATH or PERF=PATH")
        self.env["PERF"] = old
        self.assertRefused(self.tool("--jit", "-o", self.out, "--", "true"),
                           f"{old} is 6.0")

    def test_not_python(self):
        sleep = subprocess.Popen(["sleep", "60"])
        self.addCleanup(sleep.wait)
        self.addCleanup(sleep.kill)
        deadline = time.monotonic() + TIMEOUT
        while proc_state(sleep.pid) != "S":     # in nanosleep()
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.01)
        with open(f"/proc/{sleep.pid}/stat") as f:
            before = f.read().rpartition(")")[2].split()[:8]
        self.assertRefused(self.tool("-p", str(sleep.pid), "--perf",
                                     self.fake_perf, "-o", self.out),
                           "which has no perf trampolines")
        self.assertIsNone(sleep.poll())
        self.assertNotIn(proc_state(sleep.pid), ("T", "t"))
        with open(f"/proc/{sleep.pid}/stat") as f:
            self.assertEqual(f.read().rpartition(")")[2].split()[:8],
                             before)

    def test_no_such_process(self):
        gone = subprocess.Popen(["true"])
        gone.wait()
        self.assertRefused(self.tool("-p", str(gone.pid), "--perf",
                                     self.fake_perf, "-o", self.out),
                           f"no such process: {gone.pid}")

    def test_bad_arguments(self):
        for args, message in (
                ([], "needs a COMMAND (after --) or -p PID"),
                (["-p", "1", "--", "true"], "-p PID or a COMMAND, not both"),
                (["--seconds", "1", "--", "true"], "goes with -p PID"),
                (["-p", "1", "--seconds", "nan"], "(N > 0)"),
                (["-p", "1", "--seconds", "inf"], "(N > 0)"),
                (["-p", "1", "--seconds", "0"], "(N > 0)"),
                (["-F", "0", "--", "true"], "-F HZ must be a positive")):
            with self.subTest(args=args):
                self.assertRefused(self.tool("--perf", self.fake_perf, "-o",
                                             self.out, *args), message)

    def test_log_cannot_be_written(self):
        log = os.path.join(self.out, "perf-record.log")
        os.makedirs(log)
        result = self.tool("--perf", self.fake_perf, "-o", self.out, "--",
                           "true")
        self.assertEqual((result.returncode, result.stdout, result.stderr),
                         (2, "", f"perf_trampoline: cannot write {log}: Is "
                                 f"a directory\n"))

    def test_output_directory_others_can_write(self):
        # record writes there by name, as root too: someone who could
        # put a link in it could have it write anywhere.
        shared = os.path.join(self.tmpdir, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        for out, message in (
                (os.path.join(shared, "out"),
                 f"others may write in {shared}"),
                (shared, f"others may write in {shared}")):
            with self.subTest(out=out):
                result = self.tool("--perf", self.fake_perf, "-o", out,
                                   "--", "true")
                assert_refused(self, result, message)
                self.assertEqual(os.listdir(shared), [])
        # A sticky directory protects what is ours in it, not itself.
        os.chmod(shared, 0o1777)
        assert_refused(self, self.tool("--perf", self.fake_perf, "-o",
                                       shared, "--", "true"),
                       f"others may write in {shared}")

    @unittest.skipUnless(os.geteuid() == 0, "needs root (chown)")
    def test_output_directory_of_another_user(self):
        theirs = os.path.join(self.tmpdir, "theirs")
        os.mkdir(theirs, 0o755)
        os.chown(theirs, 65534, 65534)
        for out in (theirs, os.path.join(theirs, "out")):
            with self.subTest(out=out):
                result = self.tool("--perf", self.fake_perf, "-o", out,
                                   "--", "true")
                assert_refused(self, result, f"{theirs} belongs to another "
                                             f"user (uid 65534)")
                self.assertEqual(os.listdir(theirs), [])

    def assertDirectoryRefused(self, out, message):
        """record -o `out` refused for `message`, perf not run."""
        assert_refused(self, self.tool("--perf", self.fake_perf, "-o", out,
                                       "--", "true"), message)
        self.assertFalse(os.path.exists(self.perf_ran))

    def assertDirectoryTaken(self, out):
        """record -o `out` ran perf (the fake one, which records
        nothing: record fails then)."""
        result = self.tool("--perf", self.fake_perf, "-o", out, "--", "true")
        self.assertIn("perf record failed", result.stderr)
        self.assertTrue(os.path.exists(self.perf_ran))
        os.unlink(self.perf_ran)

    def set_acl(self, path, entries, default=False):
        """Give `path` the ACL `entries` ((tag, permissions, id)) in the
        kernel's format, as setfacl would."""
        # The kernel takes the entries in the order of their tags.
        data = struct.pack("<I", 2) + b"".join(
            struct.pack("<HHI", *entry)
            for entry in sorted(entries, key=lambda entry: entry[0]))
        name = "system.posix_acl_" + ("default" if default else "access")
        try:
            os.setxattr(path, name, data)
        except OSError as exc:
            if exc.errno == errno.ENOTSUP:
                self.skipTest(f"the file system of {path} keeps no ACLs")
            raise

    def test_output_directory_acl_lets_another_user_write(self):
        # drwxrwx---+ whose ACL lets another user write: they could plant
        # perf.data -> /root/victim for root's perf to create.
        shared = os.path.join(self.tmpdir, "shared")
        os.mkdir(shared, 0o700)
        uid = os.geteuid()
        for entries, message in (
                ([(ACL_USER, 7, STRANGER)],
                 f"user {STRANGER} may write in {shared} (its ACL)"),
                ([(ACL_GROUP, 3, STRANGER)],
                 f"group {STRANGER} may write in {shared} (its ACL)"),
                ([(ACL_USER, 6, uid), (ACL_USER, 3, STRANGER)],
                 f"user {STRANGER} may write"),
                # (An ACL the mode can say is kept as the mode.)
                ([], f"others may write in {shared}")):
            other = 7 if not entries else 0
            with self.subTest(entries=entries):
                self.set_acl(shared, [(ACL_USER_OBJ, 7, 0), *entries,
                                      (ACL_GROUP_OBJ, 5, 0),
                                      *[(ACL_MASK, 7, 0)] * bool(entries),
                                      (ACL_OTHER, other, 0)])
                for out in (shared, os.path.join(shared, "out")):
                    self.assertDirectoryRefused(out, message)
                    self.assertEqual(os.listdir(shared), [])
        # The mask limits the named entries: none may write.
        self.set_acl(shared, [(ACL_USER_OBJ, 7, 0), (ACL_USER, 7, STRANGER),
                              (ACL_GROUP, 7, STRANGER),
                              (ACL_GROUP_OBJ, 5, 0), (ACL_MASK, 5, 0),
                              (ACL_OTHER, 0, 0)])
        self.assertDirectoryTaken(shared)

    def test_output_directory_default_acl_lets_another_user_write(self):
        # What perf and its scripts make in it would be theirs to change.
        out = os.path.join(self.tmpdir, "out")
        os.mkdir(out, 0o700)
        self.set_acl(out, [(ACL_USER_OBJ, 7, 0), (ACL_USER, 7, STRANGER),
                           (ACL_GROUP_OBJ, 5, 0), (ACL_MASK, 7, 0),
                           (ACL_OTHER, 0, 0)], default=True)
        self.assertDirectoryRefused(out, f"user {STRANGER} may write in "
                                         f"what is made in {out} (its "
                                         f"default ACL)")
        # One that lets only us and the owner write is fine.
        self.set_acl(out, [(ACL_USER_OBJ, 7, 0),
                           (ACL_USER, 7, os.geteuid()),
                           (ACL_GROUP_OBJ, 5, 0), (ACL_MASK, 7, 0),
                           (ACL_OTHER, 5, 0)], default=True)
        self.assertDirectoryTaken(out)

    @unittest.skipUnless(os.geteuid() == 0, "needs root (chown)")
    def test_output_directory_group_may_write(self):
        # A group no database names: who is in it is unknown.
        shared = os.path.join(self.tmpdir, "shared")
        os.mkdir(shared)
        os.chown(shared, 0, STRANGER)
        os.chmod(shared, 0o770)
        for out in (shared, os.path.join(shared, "out")):
            with self.subTest(out=out):
                self.assertDirectoryRefused(out, f"group {STRANGER} may "
                                                 f"write in {shared}")
                self.assertEqual(os.listdir(shared), [])
        os.chmod(shared, 0o750)
        self.assertDirectoryTaken(shared)

    def sticky_dir(self):
        """A directory like /tmp (root's, sticky, writable by all) in
        self.tmpdir, and a directory of ours beside it."""
        os.chmod(self.tmpdir, 0o755)        # others may pass through
        sticky = os.path.join(self.tmpdir, "sticky")
        os.mkdir(sticky)
        os.chmod(sticky, 0o1777)
        ours = os.path.join(self.tmpdir, "ours")
        os.mkdir(ours, 0o755)
        return sticky, ours

    def plant_links(self, target, paths):
        """Links to `target` at `paths`, put there by user nobody: in a
        forked child, since nobody may not run this interpreter (it can
        live below root's 0700 home)."""
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                for path in paths:
                    os.symlink(target, path)
                status = 0
            finally:
                os._exit(status)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        for path in paths:
            self.assertEqual(os.lstat(path).st_uid, NOBODY)

    @unittest.skipUnless(os.geteuid() == 0, "needs root (to be nobody)")
    def test_link_planted_by_another_user(self):
        # nobody: ln -s /root/somedir /tmp/out; root: record -o /tmp/out.
        # The link leads to a directory root may write in: only who put
        # it there tells that it is not root's choice.
        sticky, ours = self.sticky_dir()
        link = os.path.join(sticky, "out")
        self.plant_links(ours, [link])
        for out in (link, os.path.join(link, "below")):
            with self.subTest(out=out):
                result = self.tool("--perf", self.fake_perf, "-o", out,
                                   "--", "true")
                assert_refused(self, result, f"{link} is a symbolic link")
                self.assertIn("choose a directory that only you can write "
                              "in", result.stderr)
                self.assertEqual(os.listdir(ours), [])
                self.assertEqual(os.listdir(sticky), ["out"])

    @unittest.skipUnless(os.geteuid() == 0, "needs root (to be nobody)")
    def test_default_name_planted_by_another_user(self):
        # The default name is the time: anyone can put links at the
        # names of the coming minutes in /tmp, where root runs record.
        sticky, ours = self.sticky_dir()
        now = time.time()
        names = {time.strftime(DEFAULT_NAME, time.localtime(now + seconds))
                 for seconds in range(-1, 2 * int(TIMEOUT))}
        self.plant_links(ours, [os.path.join(sticky, name)
                                for name in names])
        result = self.tool("--perf", self.fake_perf, "--", "true",
                           cwd=sticky)
        assert_refused(self, result, " is a symbolic link")
        self.assertRegex(result.stderr,
                         rf"{sticky}/perf-record-\d{{8}}-\d{{6}} is a "
                         rf"symbolic link")
        self.assertEqual(os.listdir(ours), [])
        self.assertEqual(set(os.listdir(sticky)), names)

    @unittest.skipUnless(os.geteuid() == 0, "needs root (chown)")
    def test_sticky_directory_of_another_user(self):
        # Sticky keeps what is ours in it ours only if its owner cannot
        # take it: theirs is no better than writable.
        sticky, _ = self.sticky_dir()
        os.chown(sticky, NOBODY, NOBODY)
        assert_refused(self, self.tool("--perf", self.fake_perf, "-o",
                                       os.path.join(sticky, "out"), "--",
                                       "true"),
                       f"{sticky} belongs to another user (uid {NOBODY})")
        self.assertEqual(os.listdir(sticky), [])

    def test_files_are_made_anew(self):
        # --force replaces the files of an earlier recording; one that
        # is a hard link to a file elsewhere is left alone.
        os.mkdir(self.out)
        open(os.path.join(self.out, "perf.data"), "w").close()
        elsewhere = os.path.join(self.tmpdir, "elsewhere")
        with open(elsewhere, "w") as f:
            f.write("kept\n")
        os.link(elsewhere, os.path.join(self.out, "perf-record.log"))
        self.tool("--force", "--perf", self.fake_perf, "-o", self.out,
                  "--", "true")
        with open(elsewhere) as f:
            self.assertEqual(f.read(), "kept\n")
        self.assertEqual(os.stat(elsewhere).st_nlink, 1)

    def test_output_is_a_file(self):
        path = os.path.join(self.tmpdir, "file")
        open(path, "w").close()
        for out, message in (
                (path, f"cannot create {path}: Not a directory"),
                (os.path.join(path, "out"),
                 f"cannot create {path}/out: {path}: Not a directory")):
            with self.subTest(out=out):
                assert_refused(self, self.tool("--perf", self.fake_perf,
                                               "-o", out, "--", "true"),
                               message)

    def test_existing_perf_data(self):
        os.mkdir(self.out)
        data = os.path.join(self.out, "perf.data")
        open(data, "w").close()
        result = self.tool("--perf", self.fake_perf, "-o", self.out, "--",
                           "true")
        self.assertEqual(result.returncode, 2)
        self.assertIn("holds a perf.data already", result.stderr)
        self.assertIn("--force", result.stderr)
        self.assertEqual(os.listdir(self.out), ["perf.data"])


ACL_USER_OBJ, ACL_USER, ACL_GROUP_OBJ, ACL_GROUP, ACL_MASK, ACL_OTHER = (
    0x01, 0x02, 0x04, 0x08, 0x10, 0x20)


class PrivateGroupTests(unittest.TestCase):
    """A directory its group may write in is ours alone if the group is
    our user private group: named as we are, with no other member and no
    other user's primary group.  The user and group databases are
    stand-ins here, the directory (mode 0770) a real one."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = os.path.join(tmp.name, "out")
        os.mkdir(self.dir)
        os.chmod(self.dir, 0o770)
        self.gid = os.stat(self.dir).st_gid
        self.me = pwd.struct_passwd(("me", "x", os.geteuid(), self.gid, "",
                                     "/", "/bin/sh"))

    def open(self, group, users=()):
        """Open self.dir (an UnsafeError if refused) with `group` the
        group database's entry of its group, `users` the other users."""
        from perf_trampoline import _output
        users = [self.me, *users]

        def getpwuid(uid):
            for user in users:
                if user.pw_uid == uid:
                    return user
            raise KeyError(uid)

        def getgrgid(gid):
            return grp.struct_group((group[0], "x", gid, group[1]))

        with mock.patch("pwd.getpwuid", getpwuid), \
                mock.patch("pwd.getpwall", lambda: users), \
                mock.patch("grp.getgrgid", getgrgid):
            _output.OutputDir.open(self.dir).close()

    def assertRefused(self, group, users, who):
        from perf_trampoline import _output
        with self.assertRaises(_output.UnsafeError) as caught:
            self.open(group, users)
        self.assertIn(f"{who} may write in {self.dir}", str(caught.exception))

    def test_our_private_group(self):
        self.open(("me", []))
        self.open(("me", ["me"]))

    def test_a_shared_group(self):
        other = pwd.struct_passwd(("you", "x", os.geteuid() + 1,
                                   self.gid, "", "/", "/bin/sh"))
        for group, users in ((("me", ["me", "you"]), ()),
                             (("me", []), [other]),
                             (("staff", []), ())):
            with self.subTest(group=group, users=users):
                self.assertRefused(group, users,
                                   f"group {group[0]} (gid {self.gid})")


class InjectTests(unittest.TestCase):
    """perf inject --jit runs in the output directory, by names relative
    to it; a fake perf that copies its input stands in."""

    def test_inject_in_the_directory(self):
        from perf_trampoline import _output, _record
        with tempfile.TemporaryDirectory() as tmp:
            perf = write_script(tmp, """\
                #!/bin/sh
                # --buildid-dir DIR inject --jit -i RAW -o DATA, in the
                # current directory, DIR its "debug"
                [ "$(dirname "$2")" -ef . ] && [ "${2##*/}" = debug ] || exit 4
                shift 2
                [ "$1 $2 $3 $5" = "inject --jit -i -o" ] || exit 3
                cp "$4" "$6"
                """, "perf")
            os.chmod(perf, 0o755)
            out_path = os.path.join(tmp, "out")
            with _output.OutputDir.open(out_path) as out:
                with open(os.path.join(out_path, _record.RAW_NAME),
                          "w") as f:
                    f.write("recorded\n")
                _record.inject(perf, out)
            self.assertEqual(os.listdir(out_path), ["perf.data"])
            with open(os.path.join(out_path, "perf.data")) as f:
                self.assertEqual(f.read(), "recorded\n")


@needs_host("perf")
@NOFP_ONCE
class RecordJitTests(RecordTestCase):
    """--jit: DWARF unwinding, perf inject --jit, on the interpreter
    without frame pointers where there is one (PERF_NOFP_PYTHON)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        if not sysconfig.get_config_var("PY_HAVE_PERF_JIT_TRAMPOLINE"):
            raise unittest.SkipTest("this Python was built without the "
                                    "perf_jit backend")
        from test.test_perf_profiler import jitlib
        reason = jitlib.perf_jit_skip_reason()
        if reason:
            skip_environment(reason)
        cls.perf = jitlib.PERF
        cls.python = jitlib.NOFP_PYTHON

    def test_command(self):
        result = self.tool("--jit", "--perf", self.perf, "-o", self.out,
                           "--", *self.command())
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRecorded(result)
        # The output is the injected data; the recording is gone.
        self.assertFalse(os.path.exists(os.path.join(self.out,
                                                     "perf.raw.data")))

    def test_command_output_is_its_own(self):
        self.check_output_is_the_commands("--jit", "--perf", self.perf)

    def test_files_of_others_are_left_alone(self):
        # A jitdump made meanwhile by a process outside the recording
        # (another recording's, say) is not record's to remove.
        started = os.path.join(self.tmpdir, "started")
        go = os.path.join(self.tmpdir, "go")
        path = write_script(self.tmpdir, f"""\
            import os, time
            open({started!r}, "w").close()
            while not os.path.exists({go!r}) or time.process_time() < 0.5:
                pass
            """, "spin_until.py")
        record = subprocess.Popen(
            [sys.executable, "-I", "-m", "perf_trampoline", "record",
             "--jit", "--perf", self.perf, "-o", self.out, "--",
             self.python, path], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=self.env,
            cwd=self.tmpdir)
        try:
            deadline = time.monotonic() + TIMEOUT
            while not os.path.exists(started):
                self.assertLess(time.monotonic(), deadline,
                                "the command did not start")
                time.sleep(0.01)
            other = subprocess.run(
                [self.python, "-X", "perf_jit", "-c",
                 "import os; print(os.getpid())"], capture_output=True,
                text=True, env=clean_env(), timeout=TIMEOUT, check=True)
            pid = int(other.stdout)
            self.files.add_pid(pid)
            dump = f"/tmp/jit-{pid}.dump"
            self.assertTrue(os.path.isfile(dump))
        finally:
            open(go, "w").close()
            _, err = record.communicate(timeout=TIMEOUT)
        self.assertEqual(record.returncode, 0, err)
        self.assertTrue(os.path.isfile(dump))
        # Its own are gone.
        self.assertRecorded(subprocess.CompletedProcess(
            record.args, 0, "", err), "spin_until.py", ["<module>"])

    def test_process(self):
        import perf_trampoline
        pid = self.start_target()
        result = self.tool("--jit", "--perf", self.perf, "-p", str(pid),
                           "--seconds", "1", "-o", self.out)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertRecorded(result, "target.py", INNER_CHAIN)
        self.assertEqual(perf_trampoline.status(pid), (None, False))


if __name__ == "__main__":
    unittest.main()
