"""The perf map as a file: when lines are written, what readers see, and
what other writers of the file can do to it.

The map is plain text appended with one write per line (several lines
in one where several exist before any is used).  Others can open it by
name: a profiler that rewrites it, a process with the same pid number in
another PID namespace sharing /tmp, the program itself.  None of them
may stop the process or make it lose a name.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import unittest

from test.test_perf_profiler.util import (
    MAP_LINE_RE, TIMEOUT, PerfTestCase, before_and_later, clean_env,
    map_path, needs_host, parse_map, read_map, skip_environment,
    write_script)

# Writes a 9 KB line as another writer of a map would: a whole line,
# appended, longer than any name the interpreter makes (3200 bytes).
LONG_NAME = "py::" + "long" * 2250 + ":<other>"


class MapWriteTests(PerfTestCase):
    """Every line is in the file before its trampoline first runs, and
    readers never see a torn one."""

    def start(self, source):
        """Start `source` with -X perf; return the process (killed at the
        end of the test)."""
        path = write_script(self.tmpdir, source)
        proc = subprocess.Popen(
            [sys.executable, "-X", "perf", path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=clean_env(), cwd=self.tmpdir)
        self.files.add_pid(proc.pid)
        self.addCleanup(proc.stdout.close)
        self.addCleanup(proc.stdin.close)
        self.addCleanup(proc.wait, TIMEOUT)
        self.addCleanup(proc.kill)
        self.path = path
        return proc

    def wait_for_names(self, pid, names):
        """Wait until the map of the running process `pid` names every
        function of `names` defined in the script."""
        deadline = time.monotonic() + TIMEOUT
        while True:
            try:
                found = {e.qualname for e in read_map(pid)
                         if e.filename == self.path}
            except FileNotFoundError:
                found = set()
            if set(names) <= found:
                return
            if time.monotonic() > deadline:
                self.fail(f"{sorted(set(names) - found)} not in the map "
                          f"of the running process")
            time.sleep(0.05)

    def test_written_while_python_code_runs(self):
        # Nothing but Python code after the first calls: no I/O, no
        # allocation of tracked objects, one thread.
        proc = self.start("""\
            import sys
            sys.stdout.write("started\\n")
            sys.stdout.flush()
            def busy_inner(x):
                return (x * 3 + 1) & 0xffff
            def busy_outer(x):
                return busy_inner(x) ^ 5
            x = 1
            while True:
                x = busy_outer(x)
            """)
        self.assertEqual(proc.stdout.readline(), b"started\n")
        self.wait_for_names(proc.pid, ["busy_inner", "busy_outer"])

    def test_written_when_the_program_blocks(self):
        proc = self.start("""\
            import sys
            def before_blocking():
                return 1
            before_blocking()
            sys.stdin.read()
            """)
        self.wait_for_names(proc.pid, ["before_blocking"])
        proc.stdin.close()
        self.assertEqual(proc.wait(TIMEOUT), 0)

    def check_written_at_exit(self, source):
        result = self.run_script(source, python_args=["-X", "perf"],
                                 check=False)
        self.assertEqual(result.returncode, 7, result.stderr)
        self.assertIn("finish.<locals>.last_new_function",
                      result.script_names())

    def test_written_at_os_exit(self):
        self.check_written_at_exit("""\
            import os
            def finish():            # names it on its first call
                def last_new_function():
                    pass
                last_new_function()
            finish()
            os._exit(7)
            """)

    def test_written_at_exit_from_c(self):
        # exit() from C (ctypes.PyDLL keeps the GIL: nothing blocks
        # between the call and the exit).
        self.check_written_at_exit("""\
            import ctypes
            c_exit = ctypes.PyDLL(None).exit
            def finish():            # names it on its first call
                def last_new_function():
                    pass
                last_new_function()
            finish()
            c_exit(7)
            """)


    # The process dies in `last`, called from `middle`, called from
    # `first`, right after their first calls, and nothing in between lets
    # the GIL go: their lines were written when they were made, or never.
    # first() is named with the module, middle() (and with it, what it
    # defines) on its first call.
    DIES = """\
        import faulthandler, os, signal, sys

        def first():
            def middle():
                def last():
                    {die}
                last()
            middle()

        first()
        """
    NAMES = ("first", "first.<locals>.middle",
             "first.<locals>.middle.<locals>.last")

    def check_named_after(self, die, returncode):
        result = self.run_script(self.DIES.format(die=die),
                                 python_args=["-X", "perf"], check=False)
        self.assertEqual(result.returncode, returncode, result.stderr)
        names = result.script_names()
        for name in self.NAMES:
            self.assertEqual(names.count(name), 1, names)
        data = self.map_bytes(result.pid)
        self.assertNotIn(b"\0", data)
        self.assertTrue(data.endswith(b"\n"), data[-100:])
        return result

    def test_named_after_sigkill(self):
        self.check_named_after("os.kill(os.getpid(), signal.SIGKILL)",
                               -signal.SIGKILL)

    def test_named_after_abort(self):
        self.check_named_after("os.abort()", -signal.SIGABRT)

    def test_named_after_segfault(self):
        self.check_named_after("faulthandler._sigsegv()", -signal.SIGSEGV)

    # qemu-user reports a new start time after an exec (its own), which
    # makes the map look older than the process.
    @needs_host("the kernel's process start time across exec")
    def test_named_after_exec(self):
        # A launcher that execs the real program (with the same pid): the
        # map keeps what the image before wrote and goes on after it.
        code = "def after_exec():\n    pass\nafter_exec()\nprint('ran')"
        result = self.check_named_after(
            "os.execv(sys.executable, [sys.executable, '-X', 'perf', "
            f"'-c', {code!r}])", 0)
        self.assertEqual(result.stdout, "ran\n")
        symbols = [e.symbol for e in result.map_entries()]
        self.assertEqual(symbols.count("py::after_exec:<string>"), 1)
        self.assertLess(symbols.index(f"py::{self.NAMES[-1]}:{result.path}"),
                        symbols.index("py::after_exec:<string>"))
        self.assertNotIn(b"\0", self.map_bytes(result.pid))

    @needs_host("the kernel's process start time across exec")
    def test_named_after_fork_from_c_then_exec(self):
        # A child forked by C (no PyOS_AfterFork_Child()) holds the map's
        # descriptor, and with it the lock, while the parent execs: the
        # lock is this process's own, not another's claim on the file.
        result = self.run_script("""\
            import ctypes, fcntl, os, sys
            def before_exec():
                def before_exec_marker():   # named on its first call
                    pass
                before_exec_marker()
            def after_exec():
                def after_exec_marker():
                    pass
                after_exec_marker()
            if len(sys.argv) > 1:
                # Once the child has let go, a write takes the lock.
                child, w = map(int, sys.argv[1:])
                os.close(w)
                os.waitpid(child, 0)
                after_exec()
                fd = os.open(f"/tmp/perf-{os.getpid()}.map", os.O_RDONLY)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    print("unlocked")
                except BlockingIOError:
                    print("locked")
                sys.exit()
            before_exec()
            r, w = os.pipe()
            child = ctypes.CDLL(None).fork()
            if child == 0:
                os.close(w)
                os.read(r, 1)           # until the exec'd image closes w
                os._exit(0)
            os.close(r)
            os.set_inheritable(w, True)
            os.execv(sys.executable, [sys.executable, "-X", "perf",
                                      __file__, str(child), str(w)])
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "locked\n")
        names = result.script_names()
        before = "before_exec.<locals>.before_exec_marker"
        after = "after_exec.<locals>.after_exec_marker"
        self.assertEqual(names.count(before), 1, names)
        self.assertEqual(names.count(after), 1, names)
        self.assertLess(names.index(before), names.index(after))

    def map_bytes(self, pid):
        with open(map_path(pid), "rb") as f:
            return f.read()

    def test_reader_never_sees_a_torn_line(self):
        # 8 threads make new functions while this process reads the map
        # over and over.  Every line a read holds up to its last newline
        # is one the finished map holds too, at the same address; what
        # follows the last newline is the start of a line being written.
        threads, per_thread = 8, 1500
        proc = self.start(f"""\
            import sys, threading
            go = threading.Event()
            def storm(k):
                go.wait()
                for i in range({per_thread}):
                    ns = {{}}
                    exec(f"def t{{k}}_f{{i}}():\\n    return {{i}}", ns)
                    ns[f"t{{k}}_f{{i}}"]()
            threads = [threading.Thread(target=storm, args=(k,))
                       for k in range({threads})]
            for t in threads:
                t.start()
            sys.stdin.readline()
            go.set()
            for t in threads:
                t.join()
            """)
        path = map_path(proc.pid)
        self.wait_for_names(proc.pid, ["storm"])
        proc.stdin.write(b"go\n")
        proc.stdin.flush()
        seen = {}
        rests = set()
        partial_reads = 0
        while True:
            done = proc.poll() is not None
            with open(path, "rb") as f:
                data = f.read()
            self.assertNotIn(b"\0", data)
            *lines, rest = data.split(b"\n")
            if rest:
                rests.add(rest)
            storm_lines = 0
            for line in lines:
                match = MAP_LINE_RE.match(line.decode())
                self.assertIsNotNone(match, line)
                start, _, symbol = match.groups()
                self.assertEqual(seen.setdefault(start, symbol), symbol)
                storm_lines += re.match(r"py::t\d+_f\d+:", symbol) is not None
            if 0 < storm_lines < threads * per_thread:
                partial_reads += 1
            if done:
                break
        self.assertEqual(proc.returncode, 0)
        self.assertTrue(data.endswith(b"\n"), data[-100:])
        final = {f"{e.start:x}": e.symbol for e in read_map(proc.pid)}
        self.assertEqual(final, final | seen)
        self.assertEqual(sum(re.match(r"py::t\d+_f\d+:", symbol) is not None
                             for symbol in final.values()),
                         threads * per_thread)
        # A line caught being written is the start of a whole one.
        whole = set(data.split(b"\n"))
        for rest in rests:
            self.assertTrue(any(line.startswith(rest) for line in whole),
                            rest)
        # The reads overlapped the writes.
        self.assertGreater(partial_reads, 0)


    def io_writes_script(self, body):
        """A script that makes 3000 new functions, then runs `body`, in
        which writes() counts the process's write() calls so far
        (/proc/self/io), and `defining` is how many the module that
        defines the functions made."""
        return textwrap.dedent("""\
            import os, sys
            def writes():
                with open("/proc/self/io", encoding="ascii") as f:
                    for line in f:
                        if line.startswith("syscw:"):
                            return int(line.split()[1])
            n = 3000
            source = "".join(f"def handler_{i}(x):\\n    return x\\n"
                             for i in range(n))
            code = compile(source, "handlers.py", "exec")
            namespace = {}
            defining = writes()
            exec(code, namespace)
            defining = writes() - defining
            functions = [namespace[f"handler_{i}"] for i in range(n)]
            """) + textwrap.dedent(body)

    def check_handlers(self, pid):
        handlers = {e.qualname for e in read_map(pid)
                    if e.filename == "handlers.py"}
        self.assertEqual(handlers,
                         {"<module>"} | {f"handler_{i}" for i in range(3000)})

    def test_definitions_written_together_before_they_run(self):
        # The module's first run writes its own line and those of the
        # 3000 functions it defines, in a few writes of many lines: all
        # are in the file before any of the functions runs, and their
        # calls write nothing.
        result = self.run_script(self.io_writes_script("""\
            with open(f"/tmp/perf-{os.getpid()}.map") as f:
                named = sum(" py::handler_" in line for line in f)
            before = writes()
            for function in functions:
                function(1)
            print(defining, named, writes() - before)
            """), python_args=["-X", "perf"])
        defining, named, calling = map(int, result.stdout.split())
        self.assertEqual(named, 3000)
        self.assertGreaterEqual(defining, 1)
        self.assertLess(defining, 100)
        self.assertEqual(calling, 0)
        self.check_handlers(result.pid)

    def test_classes_named_with_their_module(self):
        # A class body runs as soon as it is defined: the module's first
        # run also names what its classes (and theirs) define.  A
        # function's own definitions wait for its first call.
        result = self.run_script("""\
            import os
            class Outer:
                def method(self):
                    def local():
                        pass
                class Inner:
                    def deep(self):
                        pass
            with open(f"/tmp/perf-{os.getpid()}.map") as f:
                print(sum(f" py::{name}:" in line for line in f
                          for name in ("Outer", "Outer.method",
                                       "Outer.Inner", "Outer.Inner.deep")),
                      end=" ")
            with open(f"/tmp/perf-{os.getpid()}.map") as f:
                print(sum(" py::Outer.method.<locals>.local:" in line
                          for line in f))
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "4 0\n")

    def test_one_write_per_function_defined_by_a_function(self):
        # What a function defines is named on its own first call, one
        # write each: a closure may first run long after its definer,
        # or never.
        result = self.run_script(self.io_writes_script("""\
            def factory(n):
                def made():
                    return n
                return made
            factory(0)
            with open(f"/tmp/perf-{os.getpid()}.map") as f:
                named = sum("py::factory.<locals>.made" in line for line in f)
            before = writes()
            factory(1)()
            print(named, writes() - before)
            """), python_args=["-X", "perf"])
        self.assertEqual(result.stdout.split(), ["0", "1"])
        self.assertIn("factory.<locals>.made", result.script_names())

    def test_fork_copies_lines_in_few_writes(self):
        # A new task's I/O counters start at zero: what the child counts
        # first is what the fork's copy of the parent's lines took.
        result = self.run_script(self.io_writes_script("""\
            for function in functions:
                function(1)
            writes()                # its functions' lines, before the fork
            pid = os.fork()
            if pid == 0:
                w = writes()
                os.write(1, f"{os.getpid()} {w}\\n".encode())
                os._exit(0)
            os.waitpid(pid, 0)
            """), python_args=["-X", "perf"])
        child, writes = map(int, result.stdout.split())
        self.files.add_pid(child)
        # 3000 lines of about 50 bytes: a write per 64 KiB read.
        self.assertLess(writes, 5)
        self.check_handlers(child)

    def test_each_line_moves_size_and_mtime(self):
        # Readers that re-read a map when its size or mtime changes learn
        # of every new function at once.
        proc = self.start("""\
            import sys
            def ready():
                pass
            ready()
            for line in sys.stdin:
                ns = {}
                exec(f"def {line.strip()}():\\n    pass", ns)
                ns[line.strip()]()
                sys.stdout.write("done\\n")
                sys.stdout.flush()
            """)
        self.wait_for_names(proc.pid, ["ready"])
        path = map_path(proc.pid)
        for i in range(3):
            before = os.stat(path)
            # File times come from a clock that ticks every few ms.
            time.sleep(0.05)
            proc.stdin.write(f"new_{i}\n".encode())
            proc.stdin.flush()
            self.assertEqual(proc.stdout.readline(), b"done\n")
            after = os.stat(path)
            self.assertGreater(after.st_size, before.st_size)
            self.assertGreater(after.st_mtime_ns, before.st_mtime_ns)
            with open(path, "rb") as f:
                f.seek(before.st_size)
                added = f.read()
            # (Reading stdin may have made a few functions first.)
            self.assertRegex(added, rb"(^|\n)[0-9a-f]+ [0-9a-f]+ "
                                    rb"py::new_%d:<string>\n$" % i)


class OtherWritersTests(PerfTestCase):
    """Others truncate, rewrite, replace or delete the map: the process
    goes on, and so does its map."""

    TRUNCATES = before_and_later("""\
        import os
        # What Node's --perf-basic-prof and perf-map-agent do first to
        # /tmp/perf-<their pid>.map.
        fd = os.open(f"/tmp/perf-{os.getpid()}.map", os.O_WRONLY | os.O_TRUNC)
        later()
        os.close(fd)
        print("survived")
        """)

    def test_program_truncates_its_map(self):
        result = self.run_script(self.TRUNCATES, python_args=["-X", "perf"],
                                 check=False)
        self.assertEqual((result.returncode, result.stdout, result.stderr),
                         (0, "survived\n", ""))
        self.assertEqual(result.script_names(), ["later.<locals>.after"])

    # Waits for a line on stdin, then makes new functions: one named on
    # its first call (a write of one line), then a module and what it
    # defines (one write of three lines).
    WAITS = """\
        import sys
        def later():
            def after():
                return 1
            after()
        print("ready", flush=True)
        sys.stdin.readline()
        later()
        exec(compile("def one():\\n    pass\\ndef two():\\n    pass\\none()",
                     "<defined-later>", "exec"), {})
        """

    def check_new_lines_after(self, other_writer):
        """Run WAITS with -X perf, calling other_writer(path) on its map
        while it waits; check that every line of the map parses and that
        each new function has a line of its own.  Returns the entries."""
        path = write_script(self.tmpdir, self.WAITS)
        proc = subprocess.Popen(
            [sys.executable, "-X", "perf", path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, env=clean_env(), cwd=self.tmpdir)
        self.files.add_pid(proc.pid)
        with proc:
            self.assertEqual(proc.stdout.readline(), b"ready\n")
            other_writer(map_path(proc.pid))
            out, _ = proc.communicate(b"go\n", TIMEOUT)
        self.assertEqual((proc.returncode, out), (0, b""))
        with open(map_path(proc.pid), "rb") as f:
            self.assertTrue(f.read().endswith(b"\n"))
        entries = self.assertMapWellFormed(proc.pid)
        symbols = [e.symbol for e in entries]
        for symbol in (f"py::later.<locals>.after:{path}",
                       "py::<module>:<defined-later>",
                       "py::one:<defined-later>",
                       "py::two:<defined-later>"):
            self.assertEqual(symbols.count(symbol), 1, symbols[-10:])
        return entries

    def assertLineOf(self, entries, line):
        lines = [f"{e.start:x} {e.size:x} {e.symbol}" for e in entries]
        if line not in lines:
            self.fail(f"{line!r} is not a line of the map, which ends "
                      f"{lines[-8:]}")

    def test_line_another_writer_left_unfinished(self):
        # A tool appending to the map, killed in the middle of its line.
        def append_unfinished(path):
            with open(path, "ab") as f:
                f.write(b"deadbeef 10 py::unfinished")
        entries = self.check_new_lines_after(append_unfinished)
        self.assertLineOf(entries, "deadbeef 10 py::unfinished")

    def test_map_cut_in_the_middle_of_a_line(self):
        cut = []
        def truncate_mid_line(path):
            with open(path, "rb") as f:
                data = f.read()
            # Halfway into the name of the last line.
            start = data.rindex(b"\n", 0, len(data) - 1) + 1
            name = data.index(b" py::", start) + len(b" py::")
            size = name + (len(data) - name) // 2
            cut.append(data[start:size].decode())
            os.truncate(path, size)
        entries = self.check_new_lines_after(truncate_mid_line)
        self.assertLineOf(entries, cut[0])

    @needs_host("unshare, and a PID namespace of the host's kernel")
    def test_same_pid_in_another_namespace_truncates(self):
        # Two containers sharing /tmp both have a process with pid N: the
        # other one (not ours: any program) rewrites /tmp/perf-N.map.
        unshare = shutil.which("unshare")
        if os.geteuid() != 0 or unshare is None:
            skip_environment("needs root and unshare (util-linux) for "
                             "processes in PID namespaces of their own")
        nspid = 300000 + os.getpid() % 100000

        def in_namespace(args, **kwargs):
            # The namespace's init makes the next pid nspid, then waits.
            script = (f"echo {nspid - 1} > /proc/sys/kernel/ns_last_pid"
                      ' && "$@"; exit $?')
            return subprocess.Popen(
                [unshare, "-pf", "--mount-proc", "sh", "-c", script, "sh",
                 *args], env=clean_env(), cwd=self.tmpdir, **kwargs)

        self.files.add_pid(nspid)
        path = write_script(self.tmpdir, before_and_later("""\
            import os, sys
            print(os.getpid(), flush=True)
            sys.stdin.readline()
            later()
            print("survived", flush=True)
            """))
        proc = in_namespace([sys.executable, "-X", "perf", path],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.addCleanup(proc.kill)
        with proc:
            self.assertEqual(int(proc.stdout.readline()), nspid)
            neighbour = in_namespace([sys.executable, "-c", textwrap.dedent(
                f"""\
                import os
                assert os.getpid() == {nspid}
                with open(f"/tmp/perf-{{os.getpid()}}.map", "w") as f:
                    f.write("2000 20 py::neighbour:<other>\\n")
                """)])
            self.assertEqual(neighbour.wait(TIMEOUT), 0)
            proc.stdin.write(b"go\n")
            proc.stdin.close()
            self.assertEqual(proc.stdout.read(), b"survived\n")
            self.assertEqual(proc.wait(TIMEOUT), 0)
        entries = read_map(nspid)
        self.assertEqual(entries[0].symbol, "py::neighbour:<other>")
        self.assertEqual([e.qualname for e in entries[1:]
                          if e.filename == path], ["later.<locals>.after"])

    def test_deleted_and_replaced(self):
        # A deleted map is gone for readers that look by name; the lines
        # go on into the file the process has open.  A file put under the
        # name later is someone else's: never written.
        result = self.run_script("""\
            import os
            path = f"/tmp/perf-{os.getpid()}.map"
            def ours():
                for fd in os.listdir("/proc/self/fd"):
                    try:
                        link = os.readlink(f"/proc/self/fd/{fd}")
                    except OSError:
                        continue
                    if link.startswith(path):
                        return f"/proc/self/fd/{fd}", link
            # Functions defined in functions are named on their first
            # call (the module's first run names only what it defines).
            def deleted():
                def after_delete():
                    return 1
                after_delete()
            def replaced():
                def after_replace():
                    return 2
                after_replace()
            before = ours()
            os.unlink(path)
            deleted()
            with open(path, "w") as f:
                f.write("3000 30 py::replacement:<other>\\n")
            replaced()
            fd_path, link = ours()
            print(link.endswith(" (deleted)"))
            with open(fd_path) as f:
                print(f.read().count("<locals>.after_"))
            with open(path) as f:
                print(f.read(), end="")
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout.splitlines(),
                         ["True", "2", "3000 30 py::replacement:<other>"])

    EXEC = """\
        import os, sys
        def before_exec():
            return 1
        before_exec()
        sys.stdout.flush()
        os.execv(sys.executable, [sys.executable, "-c", {other!r}])
        """

    # The exec'd image writes its own lines (appending, as upstream's
    # writer does), then execs an interpreter with -X perf again.
    OTHER = """\
        import os, sys
        with open(f"/tmp/perf-{{os.getpid()}}.map", "a") as f:
            f.write({text!r})
        code = "def after_exec():\\n    pass\\nafter_exec()\\nprint('ran')"
        os.execv(sys.executable, [sys.executable, "-X", "perf", "-c", code])
        """

    def run_exec_chain(self, text):
        other = textwrap.dedent(self.OTHER.format(text=text))
        result = self.run_script(self.EXEC.format(other=other),
                                 python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "ran\n")
        with open(map_path(result.pid), "rb") as f:
            data = f.read()
        self.assertNotIn(b"\0", data)
        self.assertTrue(data.endswith(b"\n"), data[-100:])
        symbols = [e.symbol for e in parse_map(data.decode())]
        start = symbols.index(f"py::before_exec:{result.path}")
        end = symbols.index("py::after_exec:<string>")
        # The lines between: the other writer's, then what the new image
        # made before after_exec() (site, codecs).
        return symbols[start + 1:end]

    # qemu-user reports a new start time after an exec (its own), which
    # makes the map look older than the process.
    @needs_host("the kernel's process start time across exec")
    def test_exec_with_another_writer(self):
        text = "4000 40 py::appended:<other>\n" f"5000 50 {LONG_NAME}\n"
        between = self.run_exec_chain(text)
        self.assertEqual(between[:2], ["py::appended:<other>", LONG_NAME])

    @needs_host("the kernel's process start time across exec")
    def test_exec_after_an_unfinished_line(self):
        # A writer killed in the middle of a line: ours start on a line of
        # their own.
        between = self.run_exec_chain("6000 60 py::unfinished")
        self.assertEqual(between[0], "py::unfinished")
        self.assertGreater(len(between), 1)


if __name__ == "__main__":
    unittest.main()
