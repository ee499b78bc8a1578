"""Fault injection: what the trampolines do when the system refuses them
something (executable memory, the map's path, space in /tmp) and when
names are hostile.  The program runs on unchanged and is told once."""

import errno
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import unittest

from test.test_perf_profiler import util
from test.test_perf_profiler.stress import (
    PERF, MAX_QUALNAME, MAX_FILENAME, parse_lines, escape_name, only_warning,
    StressTestCase)
from test.test_perf_profiler.util import clean_env, map_path


NOEXEC_SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/types.h>

static int remaining = -1;

static int
refuse(void)
{
    if (remaining < 0) {
        const char *allow = getenv("NOEXEC_SHIM_ALLOW");
        remaining = allow != NULL ? atoi(allow) : 0;
    }
    if (remaining > 0) {
        remaining--;
        return 0;
    }
    errno = EACCES;
    return 1;
}

/* off_t is off64_t on 64-bit Linux: one type serves both. */
typedef void *(*mmap_function)(void *, size_t, int, int, int, off64_t);

static void *
mmap_unless_refused(mmap_function *real, const char *name, void *addr,
                    size_t length, int prot, int flags, int fd,
                    off64_t offset)
{
    if (*real == NULL) {
        *real = (mmap_function)dlsym(RTLD_NEXT, name);
    }
    if ((prot & PROT_EXEC) && (flags & MAP_ANONYMOUS) && refuse()) {
        return MAP_FAILED;
    }
    return (*real)(addr, length, prot, flags, fd, offset);
}

void *
mmap(void *addr, size_t length, int prot, int flags, int fd, off_t offset)
{
    static mmap_function real;
    return mmap_unless_refused(&real, "mmap", addr, length, prot, flags, fd,
                               offset);
}

/* What callers built with _FILE_OFFSET_BITS=64 (CPython) call. */
void *
mmap64(void *addr, size_t length, int prot, int flags, int fd,
       off64_t offset)
{
    static mmap_function real;
    return mmap_unless_refused(&real, "mmap64", addr, length, prot, flags,
                               fd, offset);
}

int
mprotect(void *addr, size_t length, int prot)
{
    static int (*real)(void *, size_t, int);
    if (real == NULL) {
        real = (int (*)(void *, size_t, int))dlsym(RTLD_NEXT, "mprotect");
    }
    if ((prot & PROT_EXEC) && refuse()) {
        return -1;
    }
    return real(addr, length, prot);
}
"""

# Scripts that make new functions: make("p", 3) defines and calls p_0,
# p_1 and p_2.
MAKE_FUNCTIONS = """\
def make(prefix, n):
    total = 0
    for i in range(n):
        ns = {}
        exec(f"def {prefix}_{i}():\\n    return {i}", ns)
        total += ns[f"{prefix}_{i}"]()
    return total
"""

WORKLOAD = """
    import sys

    def fib(n):
        return n if n < 2 else fib(n - 1) + fib(n - 2)

    functions = []
    for i in range(NUMBER):
        ns = {"fib": fib}
        exec(f"def made_{i}(n):\\n    return fib(n) + {i}", ns)
        functions.append(ns[f"made_{i}"])
    print(sum(f(10) for f in functions))
    print(fib(20))
    """


def workload(number=200):
    return textwrap.dedent(WORKLOAD).replace("NUMBER", str(number))


@unittest.skipUnless(sys.platform == "linux", "LD_PRELOAD shim for glibc")
class NoExecTests(StressTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        compiler = sysconfig.get_config_var("CC") or "cc"
        compiler = compiler.split()[0]
        if shutil.which(compiler) is None:
            compiler = "cc"
            if shutil.which(compiler) is None:
                raise unittest.SkipTest("no C compiler to build the "
                                        "LD_PRELOAD shim")
        cls.shim_dir = tempfile.mkdtemp(prefix="perfshim-")
        source = os.path.join(cls.shim_dir, "noexec_shim.c")
        with open(source, "w") as f:
            f.write(NOEXEC_SHIM)
        cls.shim = os.path.join(cls.shim_dir, "noexec_shim.so")
        proc = subprocess.run(
            [compiler, "-shared", "-fPIC", "-o", cls.shim, source, "-ldl"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if proc.returncode != 0:
            shutil.rmtree(cls.shim_dir)
            raise unittest.SkipTest(f"cannot build the LD_PRELOAD shim: "
                                    f"{proc.stdout.strip()[:200]}")

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.shim_dir, ignore_errors=True)
        super().tearDownClass()

    def shim_env(self, **changes):
        if util.under_qemu():
            # For the emulated interpreter only, not for the wrapper's
            # shell and qemu, which are host programs.
            return clean_env(QEMU_SET_ENV=f"LD_PRELOAD={self.shim}",
                             **changes)
        return clean_env(LD_PRELOAD=self.shim, **changes)

    def test_shim_refuses(self):
        # The fault is real: ctypes cannot get executable memory either,
        # but plain runs work.
        result = self.run_script("""
            import mmap
            try:
                mmap.mmap(-1, 4096, prot=mmap.PROT_READ | mmap.PROT_EXEC)
            except OSError as exc:
                print(exc.errno)
            """, env=self.shim_env())
        self.assertEqual(result.stdout, f"{errno.EACCES}\n")

    def test_startup_warns_once_output_unchanged(self):
        source = workload()
        plain = self.run_script(source, env=self.shim_env())
        for args, env in ((PERF, self.shim_env()),
                          ((), self.shim_env(PYTHONPERFSUPPORT="1"))):
            with self.subTest(args=args):
                perf = self.run_script(source, python_args=args, env=env)
                self.assertEqual(perf.stdout, plain.stdout)
                only_warning(self, perf.stderr, "executable memory",
                             "Permission denied")
                # wrote_map(): an older map of a process that had this
                # pid (pids wrap around in a long run) is not this one's.
                self.assertFalse(perf.wrote_map())

    def test_activate_raises(self):
        result = self.run_script("""
            import sys
            for attempt in range(2):        # decided once, same answer
                try:
                    sys.activate_stack_trampoline("perf")
                except OSError as exc:
                    print(type(exc).__name__, exc.errno, exc)
            print(sys.is_stack_trampoline_active())
            """, env=self.shim_env())
        lines = result.stdout.splitlines()
        self.assertEqual(len(lines), 3)
        self.assertEqual(lines[0], lines[1])
        name, number, message = lines[0].split(" ", 2)
        self.assertEqual((name, int(number)),
                         ("PermissionError", errno.EACCES))
        self.assertIn("executable memory", message)
        self.assertIn("Permission denied", message)
        self.assertEqual(lines[2], "False")
        self.assertEqual(result.stderr, "")

    def test_refused_after_first_arena(self):
        # The first arena is granted, later ones refused: more functions
        # than one arena holds.  One warning, same output, a sound map.
        source = workload(6000)
        env = self.shim_env(NOEXEC_SHIM_ALLOW="1")
        plain = self.run_script(source, env=env)
        perf = self.run_script(source, python_args=PERF, env=env)
        self.assertEqual(perf.stdout, plain.stdout)
        only_warning(self, perf.stderr, "executable memory",
                     "Permission denied")
        entries = parse_lines(self.map_lines(perf.pid))
        self.assertUniqueAddresses(entries)
        self.assertLess(len(entries), 6000)


# ----------------------------------------------------------------------
# The map's path

class MapFaultTests(StressTestCase):

    def test_unusable_path_on_activation(self):
        # The script puts something at its own map path before activating:
        # activation fails with OSError, nothing is followed or written.
        result = self.run_script("""
            import os, sys

            path = f"/tmp/perf-{os.getpid()}.map"
            target = os.path.abspath("target")
            with open(target, "w") as f:
                f.write("original\\n")
            # A map left by an earlier process that had our pid.
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)
            elif os.path.lexists(path):
                os.unlink(path)

            def attempt(kind):
                try:
                    sys.activate_stack_trampoline("perf")
                except OSError as exc:
                    print(kind, type(exc).__name__, exc.errno,
                          exc.filename == path)
                else:
                    print(kind, "activated")
                    sys.deactivate_stack_trampoline()

            os.mkdir(path)
            attempt("directory")
            os.rmdir(path)

            os.symlink(target, path)
            attempt("symlink")
            os.unlink(path)

            os.symlink("/nonexistent/perf.map", path)
            attempt("dangling-symlink")
            os.unlink(path)

            os.link(target, path)
            attempt("hardlink")
            os.unlink(path)

            os.mkfifo(path)                 # opening must not block
            attempt("fifo")
            os.unlink(path)

            if os.geteuid() == 0:
                with open(path, "w") as f:
                    f.write("someone else's\\n")
                os.chown(path, 65534, 65534)
                os.chmod(path, 0o644)
                attempt("foreign")
                with open(path) as f:
                    print("foreign content", repr(f.read()))
                os.unlink(path)

            with open(target) as f:
                print("target", repr(f.read()))
            print(os.path.exists("/nonexistent/perf.map"))
            attempt("clean")
            print(sys.is_stack_trampoline_active())
            """)
        lines = result.stdout.splitlines()
        expected = [
            f"directory IsADirectoryError {errno.EISDIR} True",
            f"symlink OSError {errno.ELOOP} True",
            f"dangling-symlink OSError {errno.ELOOP} True",
            f"hardlink PermissionError {errno.EPERM} True",
            f"fifo OSError {errno.ENXIO} True",
        ]
        if os.geteuid() == 0:
            expected += [
                f"foreign PermissionError {errno.EPERM} True",
                "foreign content \"someone else's\\n\"",
            ]
        expected += ["target 'original\\n'", "False", "clean activated",
                     "False"]
        self.assertEqual(lines, expected)
        self.assertEqual(result.stderr, "")

    def run_with_path_blocked(self, kind):
        """Exec an interpreter with -X perf in the same process (same pid)
        after putting `kind` at its map path."""
        result = self.run_script("""
            import os, sys
            kind, script = sys.argv[1], sys.argv[2]
            path = f"/tmp/perf-{os.getpid()}.map"
            if os.path.isdir(path) and not os.path.islink(path):
                os.rmdir(path)              # left by an earlier process
            elif os.path.lexists(path):
                os.unlink(path)
            if kind == "directory":
                os.mkdir(path)
            elif kind == "symlink":
                os.symlink(os.path.abspath("target"), path)
            sys.stdout.flush()
            os.execv(sys.executable, [sys.executable, "-X", "perf", script])
            """, script_args=(kind, "workload.py"))
        path = map_path(result.pid)
        if kind == "directory":
            self.addCleanup(os.rmdir, path)
        else:
            self.addCleanup(os.unlink, path)
        return result, path

    def test_blocked_path_at_startup(self):
        util.write_script(self.tmpdir, workload(), "workload.py")
        target = os.path.join(self.tmpdir, "target")
        plain = self.run_script(workload(), name="workload.py")
        for kind, error in (("directory", "Is a directory"),
                            ("symlink", "Too many levels of symbolic")):
            with self.subTest(kind=kind):
                with open(target, "w") as f:
                    f.write("original\n")
                result, path = self.run_with_path_blocked(kind)
                self.assertEqual(result.stdout, plain.stdout)
                only_warning(self, result.stderr, error, path)
                with open(target) as f:
                    self.assertEqual(f.read(), "original\n")

    def run_in_private_tmp(self, shell, source, *args, size="64k"):
        """Run source with `args` in a mount namespace whose /tmp is a
        fresh tmpfs of `size` prepared by `shell`; skip if that is not
        permitted here."""
        for path in (sys.executable, sysconfig.get_paths()["stdlib"]):
            real = os.path.realpath(path)
            if real == "/tmp" or real.startswith("/tmp/"):
                util.skip_environment(f"the interpreter is under /tmp ({real}), "
                              f"which a private tmpfs on /tmp would hide")
        unshare = shutil.which("unshare")
        if unshare is None:
            util.skip_environment("unshare(1) is not installed")
        probe = subprocess.run(
            [unshare, "--mount", "--propagation", "private", "sh", "-c",
             "mount -t tmpfs -o size=64k tmpfs /tmp"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if probe.returncode != 0:
            util.skip_environment(f"cannot mount a private /tmp here: "
                          f"{probe.stdout.strip()[:200]}")
        # The script is passed with -c: the test's directory is under the
        # /tmp that the new mount hides.
        command = (f"mount -t tmpfs -o size={size} tmpfs /tmp && " + shell
                   + ' && exec "$0" "$@"')
        return subprocess.run(
            [unshare, "--mount", "--propagation", "private", "sh", "-c",
             command, sys.executable, *args, "-c",
             textwrap.dedent(source)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env(), timeout=util.TIMEOUT)

    CHECK_OWN_MAP = """
        import os, re
        with open(f"/tmp/perf-{os.getpid()}.map", "rb") as f:
            data = f.read()
        *lines, rest = data.split(b"\\n")
        bad = [line for line in lines if not re.fullmatch(
            rb"[0-9a-f]{1,16} [0-9a-f]{1,8} py::.*", line)]
        # The start of a line that did not fit (cut anywhere), or nothing.
        unfinished = re.fullmatch(
            rb"([0-9a-f]{1,16}( [0-9a-f]{0,8}( (p(y(:(:.*)?)?)?)?)?)?)?", rest)
        print("map", rest == b"", unfinished is not None, b"\\0" in data,
              len(bad), bad[:1])
        """

    def test_full_tmp(self):
        # The map fills a 64 KiB /tmp: the program goes on unchanged, the
        # user is told once, and the map holds whole lines, and perhaps
        # the start of the line that did not fit (never cut back: others
        # may write the file too).
        source = workload(3000)
        plain = self.run_script(source)
        result = self.run_in_private_tmp(
            "true", source + textwrap.dedent(self.CHECK_OWN_MAP), *PERF)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = result.stdout.splitlines()
        self.assertEqual(lines[:-1], plain.stdout.splitlines())
        self.assertRegex(lines[-1], r"^map (True|False) True False 0 \[\]$")
        only_warning(self, result.stderr, "No space left on device")

    def test_full_tmp_then_space_again(self):
        # After a failed write, space comes back and writing resumes: the
        # line cut short is finished first, and the new lines follow it.
        # Functions whose definer's lines failed are named on their first
        # call after that.  (re is imported first, with room for the
        # lines of what its modules define: the check's import would
        # otherwise make them at the end.)
        source = MAKE_FUNCTIONS + textwrap.dedent("""
            import os, re
            with open("/tmp/filler", "wb", buffering=0) as f:
                try:
                    while True:
                        f.write(b"x" * 4096)
                except OSError:
                    pass                # all that is left is the map's
            print(make("before", 1000))
            pending = {}
            exec("".join(f"def pending_{i}(): return {i}\\n"
                         for i in range(50)), pending)
            os.unlink("/tmp/filler")
            print(make("after", 20),
                  sum(pending[f"pending_{i}"]() for i in range(50)))
            with open(f"/tmp/perf-{os.getpid()}.map", "rb") as f:
                print(f.read().count(b" py::pending_"))
            """) + textwrap.dedent(self.CHECK_OWN_MAP)
        result = self.run_in_private_tmp("true", source, *PERF,
                                         size="256k")
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout.splitlines(),
                         ["499500", "190 1225", "50",
                          "map True True False 0 []"])
        only_warning(self, result.stderr, "No space left on device")

    # Daemons close every descriptor they did not open (python-daemon,
    # hand-written double forks) and the next open() gets the map's old
    # number back.  The trampolines must neither write into that file nor
    # close it in a forked child.
    CLOSE_ALL_FDS = """
        import os, sys

        def before():
            return 1

        # Functions defined in functions are named on their first call
        # (the module's first run names only what it defines).
        def parent():
            def after():
                return 2
            after()

        def child():
            def in_child():
                return 3
            in_child()

        before()
        os.closerange(3, 65536)
        fd = os.open("data.txt", os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
                     0o600)
        os.write(fd, b"parent\\n")
        parent()                     # a new trampoline: a map line
        if sys.argv[1] == "fork":
            pid = os.fork()
            if pid == 0:
                child()
                try:
                    os.write(fd, b"child\\n")
                except OSError as exc:
                    os.write(1, f"child: {exc}\\n".encode())
                os._exit(0)
            os.waitpid(pid, 0)
            print("child", pid)
        os.close(fd)
        with open("data.txt", "rb") as f:
            print(f.read())
        """

    def test_program_closes_map_descriptor(self):
        for mode in ("plain", "fork"):
            with self.subTest(mode=mode):
                plain = self.run_script(self.CLOSE_ALL_FDS,
                                        script_args=(mode,))
                perf = self.run_script(self.CLOSE_ALL_FDS, python_args=PERF,
                                       script_args=(mode,))
                strip = lambda text: re.sub(r"child \d+", "child", text)
                self.assertEqual(strip(perf.stdout), strip(plain.stdout))
                self.assertEqual(plain.stderr, "")
                # Names may be lost (then the user is told, once), the
                # program's own file never touched.
                if perf.stderr:
                    only_warning(self, perf.stderr)
                self.map_lines(perf.pid)
                if mode == "fork":
                    child = int(perf.stdout.split()[1])
                    self.files.add_pid(child)
                    if os.path.exists(map_path(child)):
                        self.map_lines(child)

    DAEMON = """
        import os

        def before():
            return 1

        # Functions defined in functions are named on their first call
        # (the module's first run names only what it defines).
        def closed():
            def after():
                return 2
            after()

        def reopened():
            def later():
                return 3
            later()

        before()
        # A daemon's start: close every descriptor, then reopen the
        # standard ones on a file of its own, expecting 0, 1 and 2.
        out = os.path.abspath("out.txt")
        os.closerange(0, 65536)
        closed()                    # a new trampoline: the map reopens
        fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        numbers = [fd, os.dup2(fd, 1), os.dup2(fd, 2)]
        reopened()
        os.write(1, f"{numbers}\\n".encode())
        """

    def test_daemon_gets_the_standard_descriptors(self):
        # The map, reopened after the program closed everything, never
        # takes 0, 1 or 2: the program's own file does, as on stock 3.11,
        # and its output stays out of the map.
        outputs = []
        for args in ((), PERF):
            result = self.run_script(self.DAEMON, python_args=args)
            with open(os.path.join(self.tmpdir, "out.txt")) as f:
                outputs.append(f.read())
        self.assertEqual(outputs, ["[0, 1, 2]\n"] * 2)
        names = [line.split(b" ", 2)[2].decode()
                 for line in self.map_lines(result.pid)]
        for name in ("before", "closed.<locals>.after",
                     "reopened.<locals>.later"):
            self.assertIn(f"py::{name}:{self.tmpdir}/script.py", names)

    @unittest.skipUnless(hasattr(signal, "SIGXFSZ"), "needs RLIMIT_FSIZE")
    def test_write_cut_short(self):
        # The map cannot grow (RLIMIT_FSIZE here, a full disk alike), then
        # it can again: every line in the map stays whole.
        result = self.run_script(MAKE_FUNCTIONS + textwrap.dedent("""
            import os, re, resource, signal, sys

            signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
            path = f"/tmp/perf-{os.getpid()}.map"

            print(make("warm", 5))
            soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
            # Room for 10 more bytes: the map cannot grow for the lines
            # that do not fit what it has.
            resource.setrlimit(resource.RLIMIT_FSIZE,
                               (os.path.getsize(path) + 10, hard))
            print(make("cut", 500))
            resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
            print(make("after", 5))
            """), python_args=PERF)
        self.assertEqual(result.stdout.split(), ["10", "124750", "10"])
        only_warning(self, result.stderr, "File too large")
        lines = self.map_lines(result.pid)
        self.assertUniqueAddresses(parse_lines(lines))

    # qemu-user does not apply RLIMIT_AS to the guest (its own mappings
    # would not fit).
    @util.needs_host("RLIMIT_AS applied by the kernel")
    def test_no_address_space_for_the_map(self):
        # RLIMIT_AS leaves little address space: the map needs none, its
        # lines are written, and nothing is said.
        result = self.run_script("""
            import os, re, resource, sys

            with open("/proc/self/status") as f:
                size = int(re.search(r"VmSize:\\s+(\\d+)", f.read())[1])
            hard = resource.getrlimit(resource.RLIMIT_AS)[1]
            resource.setrlimit(resource.RLIMIT_AS,
                               (size * 1024 + 512 * 1024, hard))
            sys.activate_stack_trampoline("perf")
            def first():
                return 1
            first()
            def second():
                return 2
            second()
            with open(f"/tmp/perf-{os.getpid()}.map", "rb") as f:
                data = f.read()
            print(data.count(b" py::first:"), data.count(b" py::second:"),
                  b"\\0" in data)
            """)
        self.assertEqual(result.stdout, "1 1 False\n")
        self.assertEqual(result.stderr, "")
        self.map_lines(result.pid)      # well-formed

    def test_read_only_tmp(self):
        source = workload()
        plain = self.run_script(source)
        result = self.run_in_private_tmp("mount -o remount,ro /tmp",
                                         source, *PERF)
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertEqual(result.stdout, plain.stdout)
        only_warning(self, result.stderr, "Read-only file system")


# ----------------------------------------------------------------------
# Hostile names

class HostileNameTests(StressTestCase):

    CASES = [
        ("newline\nfake 10 py::injected:x", "file\n1234 10 py::also:x"),
        ("carriage\rreturn", "tab\there"),
        ("nul\x00byte", "nul\x00file"),
        ("controls\x01\x1b[31m\x7f\x85\x9f", "bell\x07"),
        ("surrogate\udc80\ud800", "file\udcff.py"),
        ("non-ascii é ß 漢字 \U0001f600", "/tmp/ファイル.py"),
        ("line\u2028separator\u2029", "next\x85line"),
        ("q" * 100_000, "f" * 100_000),
        ("é" * 100_000, "\n" * 100_000),
        ("x" * 1021, "y" * 2045),          # just fits
        ("x" * 1022, "y" * 2046),          # just does not
        ("", ""),
    ]

    def test_hostile_names(self):
        result = self.run_script("""
            import sys, types

            def victim():
                return 1

            total = 0
            for qualname, filename in CASES:
                code = victim.__code__.replace(co_qualname=qualname,
                                               co_filename=filename)
                total += types.FunctionType(code, {})()
            print(total)
            """.replace("CASES", repr(self.CASES)), python_args=PERF)
        self.assertEqual(result.stdout, f"{len(self.CASES)}\n")
        lines = self.map_lines(result.pid)
        names = [name for _, _, name in parse_lines(lines)]
        for qualname, filename in self.CASES:
            expected = (b"py::" + escape_name(qualname, MAX_QUALNAME) + b":"
                        + escape_name(filename, MAX_FILENAME))
            with self.subTest(qualname=qualname[:30]):
                self.assertEqual(names.count(expected), 1,
                                 expected[:100])
        # Nothing injected: every line is an entry of a real code object.
        self.assertFalse(any(name.startswith((b"py::injected",
                                              b"py::also"))
                             for name in names))
        long_entry = b"py::" + b"q" * (MAX_QUALNAME - 3) + b"...:"
        self.assertEqual(sum(name.startswith(long_entry) for name in names),
                         1)
        self.assertTrue(all(len(name) <= 4 + MAX_QUALNAME + 1 + MAX_FILENAME
                            for name in names))


if __name__ == "__main__":
    unittest.main()
