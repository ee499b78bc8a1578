"""perf_trampoline._namespaces: the perf maps of processes in other PID
and mount namespaces, kept where perf on the host reads them once the
processes have exited."""

import glob
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
import unittest
import unittest.mock

import perf_trampoline
from perf_trampoline import _namespaces
from perf_trampoline._namespaces import NamespaceMaps
from test.test_perf_profiler.util import (
    CHAIN, CHAIN_RESULT, CHAIN_SOURCE, PERF_RECORD, PerfTestCase, TIMEOUT,
    clean_env, needs_host, parse_perf_script, perf_record_works,
    script_samples, skip_environment)

# Runs outer -> middle -> inner until its stdin is closed, then makes one
# more function, last_words(), and spends its last moments in it: its map
# line is written after the last update() of a test.  (Compiled only then:
# the module's first run names the functions it defines.)
TARGET = "import os, sys, threading\n\n" + CHAIN_SOURCE + """
LAST_WORDS = '''
def last_words():
    total = 0
    for _ in range(400):
        total += outer()
    return total
'''

done = threading.Event()
threading.Thread(target=lambda: (sys.stdin.read(), done.set())).start()
outer()
print(os.getpid(), flush=True)
while not done.is_set():
    outer()
exec(compile(LAST_WORDS, "<string>", "exec"))
print(last_words(), flush=True)
"""
# Mounted over /tmp in the target's mount namespace, "$0" "$@" exec'd.
PRIVATE_TMP = 'mount -t tmpfs none /tmp && exec "$0" "$@"'


@needs_host("perf, unshare and /proc/PID/root")
class NamespaceMapsTest(PerfTestCase):

    def setUp(self):
        super().setUp()
        self.unshare = shutil.which("unshare")
        if os.geteuid() != 0 or self.unshare is None:
            skip_environment("needs root and unshare (util-linux) for a "
                             "process in its own PID and mount namespaces")
        probe = subprocess.run([self.unshare, "-pfm", "--mount-proc", "sh",
                                "-c", PRIVATE_TMP, "true"],
                               stderr=subprocess.PIPE, text=True)
        if probe.returncode != 0:
            skip_environment(f"unshare -pfm --mount-proc with a tmpfs on "
                             f"/tmp fails here: {probe.stderr.strip()}")

    def start(self, private_tmp=True, pid_namespace=True, backend="perf"):
        """Start TARGET in its own mount namespace, and PID namespace if
        `pid_namespace` (with a tmpfs of its own on /tmp if
        `private_tmp`), with trampolines of `backend` (None: off); return
        (Popen, host pid, pid in its namespace) once it runs."""
        shell = ["sh", "-c", PRIVATE_TMP] if private_tmp else []
        spaces = ["-pfm", "--mount-proc"] if pid_namespace else ["-fm"]
        options = ["-X", backend] if backend else []
        proc = subprocess.Popen(
            [self.unshare, *spaces, *shell, sys.executable, *options,
             "-c", TARGET],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, env=clean_env())
        self.addCleanup(self.finish, proc)
        nspid = int(proc.stdout.readline())
        with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
            pid, = map(int, f.read().split())
        self.assertEqual(pid != nspid, pid_namespace)
        self.files.add_pid(pid)
        self.files.add_pid(nspid)
        return proc, pid, nspid

    def finish(self, proc):
        """Close the target's stdin, which ends it; return its (stdout,
        stderr)."""
        if proc.returncode is not None:
            return "", ""
        try:
            out, err = proc.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        self.assertEqual(proc.returncode, 0, err)
        return out, err

    def record(self, command, data):
        """Start perf `command` (perf record ... -o `data`); return it once
        it has opened its events (it writes the header then)."""
        record = subprocess.Popen(command, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        self.addCleanup(record.kill)
        while record.poll() is None and not (
                os.path.exists(data) and os.path.getsize(data) > 0):
            time.sleep(0.05)
        return record

    def warnings(self):
        found = []
        return found, found.append

    def check_profile(self, private_tmp):
        reason = perf_record_works()
        if reason:
            skip_environment(reason)
        proc, pid, nspid = self.start(private_tmp)
        their_map = f"/proc/{pid}/root/tmp/perf-{nspid}.map"
        # The container's file, through a descriptor of our own, to look
        # at after the exit.
        theirs = os.open(their_map, os.O_RDONLY)
        self.addCleanup(os.close, theirs)
        warnings, warn = self.warnings()
        maps = NamespaceMaps(warn)
        self.assertTrue(maps.watch(pid))
        self.addCleanup(maps.close)
        data = os.path.join(self.tmpdir, "perf.data")
        record = self.record([*PERF_RECORD, "-p", str(pid), "-o", data],
                             data)
        # Samples of the loop, then of last_words().
        for _ in range(4):
            time.sleep(0.25)
            maps.update()
        out, _ = self.finish(proc)
        self.assertEqual(out.strip(), str(400 * CHAIN_RESULT))
        _, err = record.communicate(timeout=TIMEOUT)
        self.assertEqual(record.returncode, 0, err)
        self.assertFalse(os.path.exists(f"/proc/{pid}"))

        # Until close(), the copy lacks last_words(), which the process
        # made after the last update(): perf cannot name it.
        chains = [sample.python_frames() for sample in script_samples(data)]
        self.assertIn(CHAIN + ["<module>"], chains)
        self.assertFalse(any("last_words" in chain for chain in chains))

        before = os.fstat(theirs)
        content = os.pread(theirs, before.st_size, 0)
        self.assertEqual(maps.close(), [f"/tmp/perf-{pid}.map"])
        self.assertEqual(warnings, [])
        # The container's file is as the process left it.
        after = os.fstat(theirs)
        self.assertEqual((after.st_mtime_ns, after.st_size),
                         (before.st_mtime_ns, before.st_size))
        self.assertEqual(os.pread(theirs, after.st_size + 1, 0), content)
        # The copy holds all of it, last_words() included (a clean exit
        # cut the NULs off).
        with open(f"/tmp/perf-{pid}.map", "rb") as f:
            self.assertEqual(f.read(), content)
        self.assertIn(b" py::last_words:<string>\n", content)

        chains = [sample.python_frames("<string>")
                  for sample in script_samples(data)]
        self.assertIn(CHAIN + ["<module>"], chains)
        self.assertIn(CHAIN + ["last_words", "<module>"], chains)

    def test_private_tmp(self):
        # The container's /tmp is gone with it: the copy is read through
        # the descriptor kept since the process lived.
        self.check_profile(private_tmp=True)

    def test_shared_tmp(self):
        # It wrote the host's /tmp/perf-NSPID.map: perf looks for
        # /tmp/perf-PID.map once the process is gone.
        self.check_profile(private_tmp=False)

    def test_jitdump(self):
        # In our PID namespace with a private /tmp (systemd's PrivateTmp):
        # record -p --jit switches perf_jit on once perf runs, copies the
        # dump, and perf inject reads the copy once the process is gone.
        # (Switched on before perf starts, the dump would be described
        # from /proc/PID/maps, which names it from perf's root: in a
        # chroot, as in make test-fresh, a path perf inject cannot open.)
        from test.test_perf_profiler.jitlib import (
            PERF, perf_jit_skip_reason)
        reason = perf_jit_skip_reason()
        if reason:
            skip_environment(reason)
        proc, pid, _ = self.start(pid_namespace=False, backend=None)
        self.addCleanup(lambda: [os.unlink(path) for path in glob.glob(
            f"/tmp/jitted-{pid}-*.so")])
        out = os.path.join(self.tmpdir, "out")
        tool = subprocess.Popen(
            [sys.executable, "-I", "-m", "perf_trampoline", "record",
             "--jit", "--perf", PERF, "-o", out, "-p", str(pid)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env())
        self.addCleanup(tool.kill)
        theirs = f"/proc/{pid}/root/tmp/jit-{pid}.dump"
        deadline = time.monotonic() + TIMEOUT
        while not os.path.exists(theirs) and tool.poll() is None:
            self.assertLess(time.monotonic(), deadline)
            time.sleep(0.05)
        time.sleep(0.5)
        self.finish(proc)
        stdout, stderr = tool.communicate(timeout=TIMEOUT)
        self.assertEqual(tool.returncode, 0, stderr)
        # The copy perf inject read is kept in the output directory, not
        # in /tmp.
        self.assertFalse(os.path.exists(f"/tmp/jit-{pid}.dump"))
        copy = os.path.join(out, f"jit-{pid}.dump")
        self.assertIn(copy, stderr.splitlines())
        with open(copy, "rb") as f:
            dump = f.read()
        self.assertEqual(dump[:4], _namespaces.JITDUMP_MAGIC.to_bytes(
            4, sys.byteorder))
        self.assertIn(b"py::last_words:<string>\0", dump)
        def script(fields):
            return subprocess.run(
                [PERF, "--buildid-dir", os.path.join(out, "debug"), "script",
                 "-i", os.path.join(out, "perf.data"), "-F", fields],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                errors="backslashreplace", timeout=TIMEOUT).stdout
        if f"({os.path.realpath(sys.executable)})" not in script("ip,dso"):
            # perf names the target's files from outside our root (a
            # chroot, as in make test-fresh, when the target has a mount
            # namespace of its own): perf inject looks for the dump there,
            # and only the copy itself can be checked.
            return
        chains = [sample.python_frames("<string>")
                  for sample in parse_perf_script(script("pid,ip,sym"))]
        # <module> was entered before the switch: it has no trampoline.
        self.assertIn(CHAIN + ["last_words"], chains)

    def test_symlink_not_followed(self):
        proc, pid, _ = self.start()
        victim = os.path.join(self.tmpdir, "victim")
        with open(victim, "w") as f:
            f.write("unchanged\n")
        os.symlink(victim, f"/tmp/perf-{pid}.map")
        warnings, warn = self.warnings()
        with NamespaceMaps(warn) as maps:
            self.assertTrue(maps.watch(pid))
            self.finish(proc)
            self.assertEqual(maps.close(), [])
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn(f"/tmp/perf-{pid}.map exists and is not ours to "
                      f"replace", warnings[0])
        self.assertTrue(os.path.islink(f"/tmp/perf-{pid}.map"))
        with open(victim) as f:
            self.assertEqual(f.read(), "unchanged\n")

    def test_stale_file_replaced(self):
        # Left by a host process that had the pid before: older than the
        # target.  One written since that is not a copy is refused.
        for age, replaced in ((3600, True), (0, False)):
            with self.subTest(age=age):
                proc, pid, _ = self.start()
                path = f"/tmp/perf-{pid}.map"
                with open(path, "w") as f:
                    f.write("1000 10 py::someone_else:old.py\n")
                when = time.time() - age
                os.utime(path, (when, when))
                warnings, warn = self.warnings()
                with NamespaceMaps(warn) as maps:
                    self.assertTrue(maps.watch(pid))
                    self.finish(proc)
                    paths = maps.close()
                with open(path) as f:
                    copy = f.read()
                if replaced:
                    self.assertEqual((paths, warnings), ([path], []))
                    self.assertNotIn("someone_else", copy)
                    self.assertIn("py::last_words:<string>\n", copy)
                else:
                    self.assertEqual(paths, [])
                    self.assertIn("written since the process started",
                                  warnings[0])
                    self.assertIn("someone_else", copy)

    def test_copy_is_bounded(self):
        # A container can write a map as large as it likes; the host's
        # /tmp (often memory) gets whole lines up to MAX_COPY.
        proc, pid, _ = self.start()
        warnings, warn = self.warnings()
        with unittest.mock.patch.object(_namespaces, "MAX_COPY", 100):
            with NamespaceMaps(warn) as maps:
                self.assertTrue(maps.watch(pid))
                self.finish(proc)
                self.assertEqual(maps.close(), [f"/tmp/perf-{pid}.map"])
        with open(f"/tmp/perf-{pid}.map", "rb") as f:
            copy = f.read()
        self.assertLessEqual(len(copy), 100)
        self.assertTrue(copy.endswith(b"\n"), copy)
        self.assertEqual(len(warnings), 1, warnings)
        self.assertIn("larger than 100 bytes: copy stopped", warnings[0])

    def test_hostile_files_not_read(self):
        # What the container puts at its map's name: a FIFO (an open for
        # reading would wait for a writer), a symlink to a host file, a
        # device node.  None is copied, and the FIFO does not block.
        secret = os.path.join(self.tmpdir, "secret")
        with open(secret, "w") as f:
            f.write("1000 10 py::host_secret:x.py\n")
        for kind in ("fifo", "symlink", "device"):
            with self.subTest(kind=kind):
                proc, pid, nspid = self.start()
                theirs = f"/proc/{pid}/root/tmp/perf-{nspid}.map"
                os.unlink(theirs)
                if kind == "fifo":
                    os.mkfifo(theirs)
                elif kind == "symlink":
                    os.symlink(secret, theirs)
                else:
                    os.mknod(theirs, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
                warnings, warn = self.warnings()
                with NamespaceMaps(warn) as maps:
                    self.assertTrue(maps.watch(pid))
                    self.finish(proc)
                    self.assertEqual(maps.close(), [])
                self.assertEqual(warnings, [])
                self.assertFalse(os.path.lexists(f"/tmp/perf-{pid}.map"))

    def test_save_maps_command(self):
        proc, pid, _ = self.start()
        tool = subprocess.Popen(
            [sys.executable, "-I", "-m", "perf_trampoline", "save-maps",
             str(pid)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True)
        time.sleep(0.5)
        self.finish(proc)
        out, err = tool.communicate(timeout=TIMEOUT)
        self.assertEqual((tool.returncode, out, err),
                         (0, f"/tmp/perf-{pid}.map\n", ""))
        with open(f"/tmp/perf-{pid}.map") as f:
            self.assertIn("py::last_words:<string>\n", f.read())


    def test_save_maps_stopped_by_signal(self):
        # The process goes on; the tool stops, copies the rest once and
        # prints the copy.
        for signum in (signal.SIGINT, signal.SIGTERM):
            with self.subTest(signal=signum.name):
                proc, pid, _ = self.start()
                tool = subprocess.Popen(
                    [sys.executable, "-I", "-m", "perf_trampoline",
                     "save-maps", str(pid)], stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, text=True)
                # It has watched the process once the copy exists.
                copy = f"/tmp/perf-{pid}.map"
                while tool.poll() is None and not os.path.exists(copy):
                    time.sleep(0.05)
                tool.send_signal(signum)
                out, err = tool.communicate(timeout=TIMEOUT)
                self.assertEqual((tool.returncode, out, err),
                                 (0, f"{copy}\n", ""))
                with open(copy) as f:
                    lines = f.read().splitlines()
                self.assertIn(" py::outer:<string>", "\n".join(lines))
                self.assertEqual(len(lines), len(set(lines)), lines)
                self.finish(proc)

class OwnNamespacesTest(unittest.TestCase):

    def test_watch_own_process(self):
        with NamespaceMaps() as maps:
            self.assertFalse(maps.watch(os.getpid()))
            self.assertEqual(maps.close(), [])

    def run_tool(self, *pids):
        proc = subprocess.run(
            [sys.executable, "-I", "-m", "perf_trampoline", "save-maps",
             *map(str, pids)], stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, timeout=TIMEOUT)
        return proc.returncode, proc.stdout, proc.stderr

    def test_save_maps_nothing_needed(self):
        pid = os.getpid()
        self.assertEqual(self.run_tool(pid), (
            0, f"process {pid} shares our PID and mount namespaces: perf "
               f"reads its /tmp/perf-{pid}.map itself, nothing to save\n",
            ""))

    def test_save_maps_no_such_process(self):
        self.assertEqual(self.run_tool(0), (
            2, "", "perf_trampoline: no such process: 0\n"))


if __name__ == "__main__":
    unittest.main()
