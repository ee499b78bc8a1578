"""Fork, threads and subinterpreters: each process and interpreter gets
the trampolines and map lines it should, and no others."""

import unittest

from test.test_perf_profiler.util import (
    PerfTestCase, clean_env)


class ForkTests(PerfTestCase):
    """A forked child writes a map of its own."""

    # The module's first run names what it defines, so the functions
    # only one side makes (child_only, parent_after) are defined in
    # functions: each is named on its first call, on that side.
    SCRIPT = """\
        import os, sys
        def before_fork():
            return 1
        def child():
            def child_only():
                return 2
            child_only()
            before_fork()
            os._exit(0 if sys.is_stack_trampoline_active() else 3)
        def parent():
            def parent_after():
                return 3
            parent_after()
        before_fork()
        pid = os.fork()
        if pid == 0:
            child()
        _, status = os.waitpid(pid, 0)
        parent()
        print(pid, os.waitstatus_to_exitcode(status))
        """
    # What the module's first run names.
    DEFINED = ["<module>", "before_fork", "child", "parent"]
    CHILD_ONLY = "child.<locals>.child_only"
    PARENT_AFTER = "parent.<locals>.parent_after"

    def run_fork(self, python_args=("-X", "perf"), env=None):
        result = self.run_script(self.SCRIPT, python_args=python_args,
                                 env=env)
        child, status = map(int, result.stdout.split())
        self.files.add_pid(child)
        self.assertEqual(status, 0)
        return result, child

    def test_child_map_covers_inherited_trampolines(self):
        result, child = self.run_fork()
        parent_entries = result.map_entries()
        child_entries = result.map_entries(child)
        # Everything the parent had at the fork, at the same addresses.
        fork_index = [e.qualname for e in parent_entries].index(
            self.PARENT_AFTER)
        inherited = parent_entries[:fork_index]
        self.assertGreater(len(inherited), 10)
        self.assertEqual(child_entries[:len(inherited)], inherited)
        child_script = result.script_names(child)
        self.assertEqual(child_script, self.DEFINED + [self.CHILD_ONLY])

    def test_parent_map_lacks_child_entries(self):
        result, child = self.run_fork()
        self.assertEqual(result.script_names(),
                         self.DEFINED + [self.PARENT_AFTER])

    def test_child_of_sys_api_activation(self):
        result = self.run_script("""\
            import os, sys
            sys.activate_stack_trampoline("perf")
            def before_fork():
                return 1
            before_fork()
            pid = os.fork()
            if pid == 0:
                def child_only():
                    return 2
                child_only()
                os._exit(0)
            os.waitpid(pid, 0)
            print(pid)
            """)
        child = int(result.stdout)
        self.files.add_pid(child)
        self.assertEqual(result.script_names(child),
                         ["before_fork", "child_only"])
        self.assertEqual(result.script_names(), ["before_fork"])


    def test_copy_off_child_names_what_it_calls(self):
        # -X perf_fork_copy=0: the child's map starts empty, and every
        # function gets a new trampoline on its first call in the child.
        cases = {
            "xoption": (["-X", "perf", "-X", "perf_fork_copy=0"], None),
            "env": (["-X", "perf"], clean_env(PYTHON_PERF_FORK_COPY="0")),
        }
        for case, (python_args, env) in cases.items():
            with self.subTest(case=case):
                result, child = self.run_fork(python_args, env)
                self.assertEqual(result.stderr, "")
                # child() names what it defines on its first call.
                self.assertEqual(result.script_names(child),
                                 ["child", self.CHILD_ONLY, "before_fork"])
                child_entries = result.map_entries(child)
                self.assertLess(len(child_entries), 30)
                parent = result.map_entries()
                names = [e.qualname for e in parent]
                inherited = parent[:names.index(self.PARENT_AFTER)]
                self.assertFalse({e.start for e in inherited}
                                 & {e.start for e in child_entries})
                self.assertEqual(result.script_names(),
                                 self.DEFINED + [self.PARENT_AFTER])

    def test_child_trampolines_outside_parent_arenas(self):
        # perf names the memory a child inherited from the parent's map,
        # where the parent goes on naming the free slots of its arena: the
        # child's new trampolines lie outside every arena the parent had
        # at the fork, and so at no address of a line of the parent's.
        # Also in a child of C's fork(), which Python is not told about.
        script = """\
            import ctypes, os, sys
            def run():
                def new_code():
                    return 1
                new_code()
            with open("/proc/self/maps") as f:
                fields = [line.split() for line in f]
            # Executable anonymous mappings: the arenas.
            arenas = [f[0] for f in fields if f[1] == "r-xp" and len(f) == 5]
            fork = os.fork if sys.argv[1] == "os" else ctypes.CDLL(None).fork
            pid = fork()
            if pid == 0:
                run()
                os._exit(0)
            os.waitpid(pid, 0)
            run()
            print(pid, *arenas)
            """
        cases = [("os", "1"), ("os", "0"), ("c", "1")]
        for fork, copy in cases:
            with self.subTest(fork=fork, perf_fork_copy=copy):
                result = self.run_script(
                    script, script_args=[fork],
                    python_args=["-X", "perf", "-X", f"perf_fork_copy={copy}"])
                child, *arenas = result.stdout.split()
                self.files.add_pid(int(child))
                ranges = [tuple(int(n, 16) for n in arena.split("-"))
                          for arena in arenas]
                self.assertTrue(ranges)
                parent = result.map_entries()
                names = [e.qualname for e in parent]
                at_fork = parent[:names.index("run.<locals>.new_code")]
                new = [e for e in result.map_entries(int(child))
                       if e not in at_fork]
                self.assertIn("run.<locals>.new_code",
                              [e.qualname for e in new])
                for entry in new:
                    self.assertFalse(
                        [r for r in ranges if r[0] <= entry.start < r[1]],
                        entry)
                self.assertFalse({e.start for e in new}
                                 & {e.start for e in parent})

    def test_fork_copy_switch_values(self):
        # Only the value 0 turns copying off; a value that is not
        # understood warns and never stops the program.
        cases = [
            (["-X", "perf_fork_copy=1"], {}, True, None),
            (["-X", "perf_fork_copy"], {}, True, None),
            (["-X", "perf_fork_copy=2"], {}, True, "-X perf_fork_copy"),
            ([], {"PYTHON_PERF_FORK_COPY": "1"}, True, None),
            ([], {"PYTHON_PERF_FORK_COPY": "no"}, False,
             "PYTHON_PERF_FORK_COPY"),
            (["-E"], {"PYTHON_PERF_FORK_COPY": "0"}, True, None),
        ]
        for args, env, copied, warning in cases:
            with self.subTest(args=args, env=env):
                result, child = self.run_fork(["-X", "perf", *args],
                                              clean_env(**env))
                self.assertEqual("<module>" in result.script_names(child),
                                 copied)
                if warning is None:
                    self.assertEqual(result.stderr, "")
                else:
                    self.assertEqual(len(result.stderr.splitlines()), 1)
                    self.assertIn(warning, result.stderr)

    def test_child_of_deactivated_parent_writes_nothing(self):
        # Trampolines are off in the child: no copy, no file.  If it turns
        # them on, its functions get new trampolines in a map of its own.
        result = self.run_script("""\
            import os, sys, time
            def before_fork():
                return 1
            before_fork()
            sys.deactivate_stack_trampoline()
            r, w = os.pipe()
            forked = time.time()
            pid = os.fork()
            if pid == 0:
                os.close(w)
                os.read(r, 1)
                sys.activate_stack_trampoline("perf")
                before_fork()
                os._exit(0)
            os.close(r)
            print(pid, flush=True)
            time.sleep(0.2)
            # (A map an earlier process with the child's pid left is older.)
            try:
                mtime = os.stat(f"/tmp/perf-{pid}.map").st_mtime
                print(mtime >= forked - 0.05)
            except FileNotFoundError:
                print(False)
            os.close(w)
            os.waitpid(pid, 0)
            """, python_args=["-X", "perf"])
        pid, exists = result.stdout.split()
        child = int(pid)
        self.files.add_pid(child)
        self.assertEqual(exists, "False")
        self.assertEqual(result.script_names(child), ["before_fork"])
        parent = [e for e in result.script_entries()
                  if e.qualname == "before_fork"]
        self.assertNotEqual(result.script_entries(child)[0].start,
                            parent[0].start)

    def test_subprocess_with_preexec_fn_writes_nothing(self):
        # The child execs right after preexec_fn: no copy of the parent's
        # map, and no map at all for the child's pid.  set_flag() first
        # runs there (the module's first run named hook()).
        result = self.run_script("""\
            import os, subprocess, sys
            def hook():
                def set_flag():
                    os.environ["HOOK_RAN"] = "1"
                set_flag()
            out = subprocess.run(
                [sys.executable, "-c",
                 "import os; print(os.getpid(), os.environ['HOOK_RAN'])"],
                preexec_fn=hook, capture_output=True, text=True, check=True)
            print(out.stdout, end="")
            """, python_args=["-X", "perf"])
        pid, ran = result.stdout.split()
        self.files.add_pid(int(pid))
        self.assertEqual(ran, "1")
        self.assertFalse(result.wrote_map(int(pid)))
        self.assertEqual(result.script_names(), ["<module>", "hook"])


class ThreadTests(PerfTestCase):

    def test_threads_create_code_concurrently(self):
        result = self.run_script("""\
            import sys, threading
            sys.setswitchinterval(1e-6)
            THREADS, FUNCS = 8, 150
            barrier = threading.Barrier(THREADS)
            def work(t):
                source = "".join(f"def f_{t}_{i}(): return {i}\\n"
                                 for i in range(FUNCS))
                namespace = {}
                exec(compile(source, __file__, "exec"), namespace)
                barrier.wait()
                for _ in range(3):
                    for i in range(FUNCS):
                        namespace[f"f_{t}_{i}"]()
            threads = [threading.Thread(target=work, args=(t,))
                       for t in range(THREADS)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            print("ok")
            """, python_args=["-X", "perf"])
        self.assertEqual(result.stdout, "ok\n")
        entries = self.assertMapWellFormed(result.pid)
        starts = [e.start for e in entries]
        self.assertEqual(len(starts), len(set(starts)))
        names = [e.qualname for e in entries if e.filename == result.path]
        expected = {f"f_{t}_{i}" for t in range(8) for i in range(150)}
        funcs = [n for n in names if n.startswith("f_")]
        self.assertEqual(len(funcs), len(set(funcs)))
        self.assertEqual(set(funcs), expected)
        self.assertEqual(names.count("work"), 1)


class SubinterpreterTests(PerfTestCase):

    def test_activate_in_subinterpreter(self):
        result = self.run_script("""\
            import os, sys, _testcapi
            code = '''if 1:
                import sys
                sys.activate_stack_trampoline("perf")
                active = sys.is_stack_trampoline_active()
                exec(compile("def sub_fn():\\\\n    return 1\\\\nsub_fn()",
                             FILE, "exec"))
                with open("sub.txt", "w") as f:
                    f.write(str(active))
                '''.replace("FILE", repr(__file__))
            print(_testcapi.run_in_subinterp(code))
            with open("sub.txt") as f:
                print(f.read())
            print(sys.is_stack_trampoline_active())
            def main_fn():
                return 2
            main_fn()
            """)
        self.assertEqual(result.stdout, "0\nTrue\nFalse\n")
        self.assertEqual(result.script_names(), ["<module>", "sub_fn"])

    def test_subinterpreter_deactivation_leaves_main_active(self):
        result = self.run_script("""\
            import os, sys, _testcapi
            code = '''if 1:
                import sys
                before = sys.is_stack_trampoline_active()
                sys.deactivate_stack_trampoline()
                with open("sub.txt", "w") as f:
                    f.write(f"{before} {sys.is_stack_trampoline_active()}")
                '''
            print(_testcapi.run_in_subinterp(code))
            with open("sub.txt") as f:
                print(f.read())
            def main_fn():
                return 2
            main_fn()
            print(sys.is_stack_trampoline_active())
            """, python_args=["-X", "perf"])
        # The subinterpreter starts with the same configuration (-X perf).
        self.assertEqual(result.stdout, "0\nTrue False\nTrue\n")
        self.assertIn("main_fn", result.script_names())


if __name__ == "__main__":
    unittest.main()
