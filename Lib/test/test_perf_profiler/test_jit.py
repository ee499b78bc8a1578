"""The perf_jit backend (Python/perf_jit_trampoline.c).

-X perf_jit writes /tmp/jit-<pid>.dump: perf's jitdump format, one
unwinding record (.eh_frame + .eh_frame_hdr) and one code load record per
trampoline.  These tests

* parse whole dumps written by a child interpreter (header, every record,
  names, code bytes, thread ids, fork, the PROT_EXEC marker mapping);
* decode the unwind tables with readelf and compare their CFA rules, at
  every instruction boundary, with rules derived independently from the
  template's disassembly (objdump) -- for the running template, for the
  dump's own records, for x86_64 with and without CET and for aarch64
  with and without BTI/PAC, cross-assembled from Python/asm_trampoline.S;
* run the real workflow: perf record --call-graph dwarf, perf inject
  --jit, perf script, and look for the Python call chain in order.

The dumps and the perf workflow use the interpreter named by the
environment variable PERF_NOFP_PYTHON (a build configured
--without-frame-pointers, where only this backend can show Python frames),
or sys.executable.  perf inject --jit needs perf >= 6.1 (the environment
variable PERF may name the perf binary; default: "perf" on PATH).
"""

import errno
import os
import platform
import shutil
import sysconfig
import tempfile
import textwrap
import time
import unittest

from test.test_perf_profiler.jitlib import (
    NOFP_PYTHON, TEMPLATE_SOURCE, EM_X86_64, EM_AARCH64, HOST_MACHINE,
    TOOL_PREFIX, run, gnu_tool, JITDUMP_MAGIC, HEADER, CodeLoad, Unwinding,
    parse_jitdump, read_jitdump, disassemble_functions, unwind_info_from_c,
    running_template, UnwindCheck, perf_jit_skip_reason, record_jit,
    jitted_files)
from test.test_perf_profiler.util import (
    NOFP_ONCE, PerfTestCase, clean_env, jitdump_path, map_written_since, needs_host,
    parse_perf_script, skip_environment, write_script)

if not sysconfig.get_config_var("PY_HAVE_PERF_JIT_TRAMPOLINE"):
    raise unittest.SkipTest("this Python was built without the perf_jit "
                            "backend (PY_HAVE_PERF_JIT_TRAMPOLINE is not set)")


# ----------------------------------------------------------------------
# The unwind description, for each template variant

@unittest.skipIf(HOST_MACHINE is None, "not an x86_64 or aarch64 host")
class UnwindDescriptionTests(UnwindCheck, unittest.TestCase):
    """_testinternalcapi.perf_unwind_tables() on real template bytes."""

    def assemble(self, machine, *flags):
        """Assemble Python/asm_trampoline.S for `machine`: (the template's
        bytes, readelf -sn output)."""
        if not os.path.exists(TEMPLATE_SOURCE):
            skip_environment(f"needs the source tree ({TEMPLATE_SOURCE})")
        cc = gnu_tool(machine, "gcc")
        objcopy = gnu_tool(machine, "objcopy")
        if cc is None or objcopy is None:
            skip_environment(f"no assembler for ELF machine {machine} "
                          f"({TOOL_PREFIX[machine]}gcc)")
        tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, tmp)
        obj = os.path.join(tmp, "asm_trampoline.o")
        text = os.path.join(tmp, "text.bin")
        proc = run([cc, "-c", *flags, TEMPLATE_SOURCE, "-o", obj])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        proc = run([objcopy, "-O", "binary", "--only-section=.text", obj,
                    text])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        with open(text, "rb") as f:
            code = f.read()
        symbols = run(["readelf", "-sn", "-W", obj])
        self.assertEqual(symbols.returncode, 0, symbols.stderr)
        self.check_symbols(symbols.stdout, len(code))
        return code, symbols.stdout

    def check_symbols(self, readelf_output, text_size):
        found = {}
        for line in readelf_output.splitlines():
            words = line.split()
            if len(words) == 8 and words[7].startswith("_PyPerf_Template"):
                found[words[7]] = (int(words[1], 16), int(words[2]), words[3])
        self.assertEqual(found["_PyPerf_TemplateStart"],
                         (0, text_size, "FUNC"))
        self.assertEqual(found["_PyPerf_TemplateEnd"][0], text_size)

    def check_variant(self, machine, flags, expected_size, first_insns,
                      note):
        code, symbols = self.assemble(machine, *flags)
        self.assertEqual(len(code), expected_size)
        if note is None:
            self.assertNotIn("feature:", symbols)
        else:
            self.assertIn(note, symbols)
        data, hdr_size = unwind_info_from_c(machine, code)
        insns = self.check_unwind_info(machine, code, data, hdr_size)
        self.assertEqual([text for _, _, text in insns[:len(first_insns)]],
                         first_insns)

    def test_x86_64(self):
        self.check_variant(EM_X86_64, ["-fcf-protection=none"], 30,
                           ["push %rbp"], None)

    def test_x86_64_cet(self):
        self.check_variant(EM_X86_64, ["-fcf-protection=full"], 34,
                           ["endbr64", "push %rbp"],
                           "x86 feature: IBT, SHSTK")

    def test_aarch64(self):
        self.check_variant(EM_AARCH64, ["-mbranch-protection=none"], 36,
                           ["sub sp, sp, #0xa0"], None)

    def test_aarch64_bti_pac(self):
        self.check_variant(EM_AARCH64, ["-mbranch-protection=standard"], 48,
                           ["bti c", "paciasp"], "AArch64 feature: BTI, PAC")

    def test_aarch64_bti_only(self):
        self.check_variant(EM_AARCH64, ["-mbranch-protection=bti"], 40,
                           ["bti c", "sub sp, sp, #0xa0"],
                           "AArch64 feature: BTI")

    def test_running_template(self):
        code = running_template()
        data, hdr_size = unwind_info_from_c(HOST_MACHINE, code)
        self.check_unwind_info(HOST_MACHINE, code, data, hdr_size)

    def test_rejects_other_code(self):
        code = bytearray(running_template())
        code[-1] ^= 0xff                    # not the template's "ret"
        with self.assertRaises(OSError) as cm:
            unwind_info_from_c(HOST_MACHINE, bytes(code))
        self.assertEqual(cm.exception.errno, errno.ENOEXEC)
        with self.assertRaises(OSError) as cm:
            unwind_info_from_c(HOST_MACHINE, running_template() + b"\x90")
        self.assertEqual(cm.exception.errno, errno.ENOEXEC)
        with self.assertRaises(OSError) as cm:
            unwind_info_from_c(3, running_template())     # EM_386
        self.assertEqual(cm.exception.errno, errno.EINVAL)


# ----------------------------------------------------------------------
# The dump

FUNCTIONS = textwrap.dedent("""\
    import os, sys, threading

    def leaf(n):
        total = 0
        for i in range(n):
            total += i * i
        return total

    def middle(n):
        return leaf(n)

    def top(n, repeat):
        return sum(middle(n) for _ in range(repeat))
""")


def script(body):
    """FUNCTIONS followed by `body` (dedented)."""
    return FUNCTIONS + textwrap.dedent(body)


class JitTestCase(PerfTestCase):
    """Runs scripts under NOFP_PYTHON and cleans up their dumps."""

    def run_nofp(self, source, *args, env=None):
        """Run `source` under NOFP_PYTHON with `args` before the script;
        the script's first output line must be its pid.  Returns
        (pid, stdout lines after the first)."""
        path = write_script(self.tmpdir, source)
        proc = run([NOFP_PYTHON, *args, path], cwd=self.tmpdir,
                   env=clean_env() if env is None else env)
        first = proc.stdout.split("\n", 1)[0]
        if first.isdigit():
            self.files.add_pid(int(first))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertEqual(proc.stderr, "")
        return int(first), proc.stdout.splitlines()[1:]

    def script_loads(self, records, path):
        return [r for r in records if isinstance(r, CodeLoad)
                and r.name.endswith(":" + path)]


@NOFP_ONCE
class JitdumpTests(UnwindCheck, JitTestCase):

    def test_dump(self):
        source = script("""\
            print(os.getpid())
            top(10, 2)
            import _testinternalcapi
            print(_testinternalcapi.perf_template().hex())

            def in_thread():
                print(threading.get_native_id())
            thread = threading.Thread(target=in_thread)
            thread.start()
            thread.join()

            with open("/proc/self/maps") as f:
                for line in f:
                    if line.rstrip().endswith(f"/tmp/jit-{os.getpid()}.dump"):
                        print(line.split()[1], line.split()[2])
        """)
        started = time.time()
        before = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        pid, lines = self.run_nofp(source, "-X", "perf_jit")
        after = time.clock_gettime_ns(time.CLOCK_MONOTONIC)
        template = bytes.fromhex(lines[0])
        thread_tid = int(lines[1])
        # The first page of the dump is mapped executable: perf record
        # logs that mmap, and perf inject finds the dump through it.
        self.assertEqual(lines[2:], ["r-xp 00000000"])
        # Only the jitdump: the perf map backend stays off.
        self.assertFalse(map_written_since(pid, started))

        try:
            header, records = read_jitdump(pid)
        except ValueError as exc:
            self.fail(f"malformed dump: {exc}")
        self.assertEqual(header, header._replace(
            magic=JITDUMP_MAGIC, version=1, total_size=HEADER.size,
            elf_mach=HOST_MACHINE, pad1=0, pid=pid, flags=0))
        # CLOCK_MONOTONIC, like perf record -k 1.
        self.assertLessEqual(before, header.timestamp)
        self.assertLessEqual(header.timestamp, after)
        stamps = [header.timestamp] + [r.timestamp for r in records]
        self.assertEqual(stamps, sorted(stamps))
        self.assertLessEqual(stamps[-1], after)

        # Pairs: unwinding info, then the code load it applies to.
        self.assertGreater(len(records), 10)
        self.assertEqual(len(records) % 2, 0)
        unwindings, loads = records[0::2], records[1::2]
        self.assertTrue(all(isinstance(r, Unwinding) for r in unwindings))
        self.assertTrue(all(isinstance(r, CodeLoad) for r in loads))
        for unwinding in unwindings:
            self.assertEqual(unwinding.record_size % 8, 0)
            self.assertEqual(unwinding.unwinding_size, len(unwinding.data))
            # The tables count as mapped right after the code (padded
            # to 8), in address space the trampoline owns alone.
            self.assertEqual(unwinding.mapped_size, unwinding.unwinding_size)
            self.assertEqual(unwinding.eh_frame_hdr_size, 20)
            self.assertEqual(unwinding.data, unwindings[0].data)

        self.assertEqual([r.code_index for r in loads],
                         list(range(len(loads))))
        addresses = [r.code_addr for r in loads]
        self.assertEqual(len(set(addresses)), len(addresses))
        span = (len(template) + 7) // 8 * 8 + unwindings[0].mapped_size
        ordered = sorted(addresses)
        for low, high in zip(ordered, ordered[1:]):
            self.assertGreaterEqual(high - low, span,
                            f"trampolines {low:#x} and {high:#x} overlap "
                            f"in perf's view ({span} bytes each)")
        for load in loads:
            self.assertEqual(load.pid, pid)
            self.assertEqual(load.vma, load.code_addr)
            self.assertEqual(load.code_addr % 16, 0)
            self.assertEqual(load.code_size, len(template))
            self.assertEqual(load.code, template)
            self.assertTrue(load.name.startswith("py::"), load.name)

        path = os.path.join(self.tmpdir, "script.py")
        names = [r.name for r in self.script_loads(records, path)]
        self.assertEqual(names, [f"py::{name}:{path}" for name in (
            "<module>", "top", "top.<locals>.<genexpr>", "middle", "leaf",
            "in_thread")])
        by_name = {r.name: r for r in loads}
        self.assertEqual(by_name[f"py::in_thread:{path}"].tid, thread_tid)
        self.assertEqual(by_name[f"py::leaf:{path}"].tid, pid)

        # The unwind tables in the file describe the code in the file.
        self.check_unwind_info(HOST_MACHINE, loads[0].code,
                               unwindings[0].data,
                               unwindings[0].eh_frame_hdr_size)

    def test_switches(self):
        source = script("""\
            print(os.getpid())
            if len(sys.argv) > 1:
                sys.activate_stack_trampoline(sys.argv[1])
            print(sys.is_stack_trampoline_active())
            leaf(3)
        """)
        for how, args, env in [
                ("-X perf_jit", ["-X", "perf_jit"], None),
                ("PYTHON_PERF_JIT_SUPPORT=1", [],
                 clean_env(PYTHON_PERF_JIT_SUPPORT="1")),
                ("sys.activate_stack_trampoline", [], None)]:
            with self.subTest(how):
                path = write_script(self.tmpdir, source)
                argv = [NOFP_PYTHON, *args, path]
                if not args and env is None:
                    argv.append("perf_jit")
                started = time.time()
                proc = run(argv, cwd=self.tmpdir,
                           env=clean_env() if env is None else env)
                pid = int(proc.stdout.split()[0])
                self.files.add_pid(pid)
                self.assertEqual(proc.returncode, 0, proc.stderr)
                self.assertEqual(proc.stdout.split()[1], "True")
                _, records = read_jitdump(pid)
                self.assertIn(f"py::leaf:{path}",
                              [r.name for r in self.script_loads(records,
                                                                 path)])
                self.assertFalse(map_written_since(pid, started))

    FORK_SCRIPT = script("""\
            print(os.getpid(), flush=True)
            middle(3)
            # Everything made so far is in the file: one write() each.
            size = os.path.getsize(f"/tmp/jit-{os.getpid()}.dump")
            child = os.fork()
            if child == 0:
                def only_child():
                    pass
                only_child()
                dumps = []
                with open("/proc/self/maps") as f:
                    for line in f:
                        if "/tmp/jit-" in line:
                            dumps.append(line.split()[-1])
                print(os.getpid(), *dumps, flush=True)
                os._exit(0)
            _, status = os.waitpid(child, 0)
            def only_parent():
                pass
            only_parent()
            print(status, size)
        """)

    def run_fork(self, *args):
        """Run FORK_SCRIPT; return (parent pid, child pid, parent's dump
        size at the fork, path of the script)."""
        pid, lines = self.run_nofp(self.FORK_SCRIPT, "-X", "perf_jit", *args)
        child_line, parent_line = lines
        status, size = map(int, parent_line.split())
        self.assertEqual(status, 0)
        child, *child_dumps = child_line.split()
        child = int(child)
        self.files.add_pid(child)
        # The child maps its own dump, not the parent's.
        self.assertEqual(child_dumps, [jitdump_path(child)])
        return pid, child, size, os.path.join(self.tmpdir, "script.py")

    # qemu-user reports a new start time after an exec (its own), which
    # makes the dump look older than the process.
    @needs_host("the kernel's process start time across exec")
    def test_truncated_dump(self):
        # Another writer empties the dump (the file is never mapped
        # writable: nothing faults).  The process goes on; records made
        # after it land after the truncation, and only a dump that still
        # starts with its header is one perf inject can read.
        source = script("""\
            print(os.getpid())
            top(10, 2)
            fd = os.open(f"/tmp/jit-{os.getpid()}.dump", os.O_WRONLY | os.O_TRUNC)
            def after_truncation():
                return 1
            after_truncation()
            os.close(fd)
            print(os.path.getsize(f"/tmp/jit-{os.getpid()}.dump") > 0)
            print("survived")
        """)
        pid, lines = self.run_nofp(source, "-X", "perf_jit")
        self.assertEqual(lines, ["True", "survived"])

    def test_exec_keeps_the_dump(self):
        # A launcher that execs another interpreter with the same pid: the
        # dump keeps the image before's records, the new image's follow
        # them (no second header), with code indexes not used before.
        code = ("def after_exec():\n    return 1\n"
                "after_exec()\nprint('ran')")
        source = script(f"""\
            print(os.getpid())
            top(10, 2)
            sys.stdout.flush()
            os.execv(sys.executable,
                     [sys.executable, "-X", "perf_jit", "-c", {code!r}])
        """)
        pid, lines = self.run_nofp(source, "-X", "perf_jit")
        self.assertEqual(lines, ["ran"])
        path = os.path.join(self.tmpdir, "script.py")
        header, records = read_jitdump(pid)
        self.assertEqual(header.pid, pid)
        loads = [r for r in records if isinstance(r, CodeLoad)]
        names = [r.name for r in loads]
        self.assertIn(f"py::leaf:{path}", names)
        self.assertEqual(names.count("py::after_exec:<string>"), 1)
        after = names.index("py::after_exec:<string>")
        self.assertLess(names.index(f"py::leaf:{path}"), after)
        indexes = [r.code_index for r in loads]
        self.assertEqual(len(set(indexes)), len(indexes))
        self.assertGreater(min(indexes[after:]), max(indexes[:after]))
        self.assertTrue(all(r.pid == pid for r in loads))
        stamps = [header.timestamp] + [r.timestamp for r in records]
        self.assertEqual(stamps, sorted(stamps))

    def test_fork(self):
        pid, child, size, path = self.run_fork()
        _, parent_records = read_jitdump(pid)
        header, child_records = read_jitdump(child)
        self.assertEqual(header.pid, child)
        parent_loads = [r for r in parent_records if isinstance(r, CodeLoad)]
        child_loads = [r for r in child_records if isinstance(r, CodeLoad)]
        parent_names = [r.name for r in self.script_loads(parent_records,
                                                          path)]
        child_names = [r.name for r in self.script_loads(child_records,
                                                         path)]
        self.assertTrue(all(r.pid == pid for r in parent_loads))
        self.assertIn(f"py::only_parent:{path}", parent_names)
        self.assertNotIn(f"py::only_child:{path}", parent_names)
        self.assertEqual(child_names[-1], f"py::only_child:{path}")
        self.assertNotIn(f"py::only_parent:{path}", child_names)

        # Everything made before the fork, re-stated for the child's pid.
        with open(jitdump_path(pid), "rb") as f:
            _, before_fork = parse_jitdump(f.read(size))
        before_fork = [r for r in before_fork if isinstance(r, CodeLoad)]
        self.assertIn(f"py::leaf:{path}", [r.name for r in before_fork])
        self.assertEqual(
            [(r.name, r.code_addr, r.code_index, r.code)
             for r in child_loads[:len(before_fork)]],
            [(r.name, r.code_addr, r.code_index, r.code)
             for r in before_fork])
        self.assertTrue(all(r.pid == child and r.tid == child
                            for r in child_loads))
        # perf names what the child inherited after the parent's dump:
        # what the child made lies at none of the parent's addresses.
        made = child_loads[len(before_fork):]
        self.assertIn(f"py::only_child:{path}", [r.name for r in made])
        self.assertFalse({r.code_addr for r in made}
                         & {r.code_addr for r in parent_loads})
        self.assertEqual([r.code_index for r in child_loads],
                         list(range(len(child_loads))))
        stamps = [header.timestamp] + [r.timestamp for r in child_records]
        self.assertEqual(stamps, sorted(stamps))
        self.assertTrue(all(isinstance(r, Unwinding)
                            for r in child_records[0::2]))

    def test_fork_by_c_in_a_thread(self):
        # C's fork() from a thread, without PyOS_AfterFork_Child(): the
        # child keeps the parent's dump, and its records carry its own pid
        # and its one thread's tid, not what the forking thread had asked.
        source = script("""\
            import ctypes
            print(os.getpid(), flush=True)
            def in_thread():
                middle(3)
                child = ctypes.pythonapi.fork()  # holds the GIL
                if child == 0:
                    def in_c_child():
                        pass
                    in_c_child()
                    os._exit(0)
                print(child, threading.get_native_id(), os.waitpid(child, 0)[1])
            thread = threading.Thread(target=in_thread)
            thread.start()
            thread.join()
        """)
        pid, lines = self.run_nofp(source, "-X", "perf_jit")
        child, thread_tid, status = map(int, lines[0].split())
        self.assertEqual(status, 0)
        path = os.path.join(self.tmpdir, "script.py")
        by_name = {r.name: r for r in self.script_loads(
            read_jitdump(pid)[1], path)}
        made = by_name[f"py::in_thread.<locals>.in_c_child:{path}"]
        self.assertEqual((made.pid, made.tid), (child, child))
        leaf = by_name[f"py::leaf:{path}"]
        self.assertEqual((leaf.pid, leaf.tid), (pid, thread_tid))

    def test_fork_copy_off(self):
        # The child's dump starts empty and holds new trampolines for what
        # it calls; the parent's records are not copied.
        pid, child, size, path = self.run_fork("-X", "perf_fork_copy=0")
        header, child_records = read_jitdump(child)
        self.assertEqual(header.pid, child)
        self.assertEqual([r.name for r in self.script_loads(child_records,
                                                            path)],
                         [f"py::only_child:{path}"])
        with open(jitdump_path(pid), "rb") as f:
            _, before_fork = parse_jitdump(f.read(size))
        child_loads = [r for r in child_records if isinstance(r, CodeLoad)]
        self.assertLess(len(child_loads), 30)
        self.assertFalse({r.code_addr for r in before_fork
                          if isinstance(r, CodeLoad)}
                         & {r.code_addr for r in child_loads})
        self.assertTrue(all(r.pid == child for r in child_loads))
        self.assertTrue(all(isinstance(r, Unwinding)
                            for r in child_records[0::2]))


# ----------------------------------------------------------------------
# perf record -> perf inject --jit -> perf script

@needs_host("perf")
@NOFP_ONCE
class PerfJitWorkflowTests(JitTestCase):

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        reason = perf_jit_skip_reason()
        if reason:
            skip_environment(reason)

    def test_interpreter_without_frame_pointers(self):
        if "PERF_NOFP_PYTHON" not in os.environ:
            skip_environment("PERF_NOFP_PYTHON is not set: the workflow runs "
                          "on sys.executable")
        proc = run([NOFP_PYTHON, "-c", "import sysconfig; "
                    "print(sysconfig.get_config_var('CFLAGS'))"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("-fno-omit-frame-pointer", proc.stdout)
        # Nor does the evaluator, whose CALL fast path reads the stack
        # pointer (pycore_perf.h): it keeps the register for its loop.
        from test.test_perf_profiler.test_unwind import FRAME_REGISTER
        register = FRAME_REGISTER.get(platform.machine())
        if register is None:
            self.skipTest(f"no frame register known for {platform.machine()}")
        proc = run([NOFP_PYTHON, "-c",
                    "from test.test_perf_profiler.test_unwind import "
                    "code_file; print(code_file('_PyEval_EvalFrameDefault'))"])
        self.assertEqual(proc.returncode, 0, proc.stderr)
        evaluator = [text for name, code in disassemble_functions(
                         self, HOST_MACHINE, proc.stdout.strip())
                     if name == "_PyEval_EvalFrameDefault"
                     for _, text in code]
        self.assertNotEqual(evaluator, [])
        self.assertNotIn(register.setup, evaluator)

    def record_chains(self, source, stack_dump=8192):
        """Run `source` under perf record --call-graph dwarf with -X perf_jit,
        inject the dump, and return each sample's Python frames (innermost
        first) and the script's path.  perf copies `stack_dump` bytes of
        stack per sample: deeper frames cannot be unwound."""
        path = write_script(self.tmpdir, source)
        record, inject, shown = record_jit(
            [NOFP_PYTHON, "-X", "perf_jit", path], self.tmpdir,
            env=clean_env(), stack_dump=stack_dump)
        pid = int(record.stdout.split()[0])
        self.files.add_pid(pid)
        self.addCleanup(self.remove_jitted, pid)
        self.assertEqual(record.returncode, 0, record.stderr)
        self.assertEqual(inject.returncode, 0, inject.stderr)
        # perf inject writes one ELF per code load beside the dump.
        _, records = read_jitdump(pid)
        loads = sum(isinstance(r, CodeLoad) for r in records)
        self.assertEqual(len(jitted_files(pid)), loads)
        self.assertEqual(shown.returncode, 0)
        return [sample.python_frames(path)
                for sample in parse_perf_script(shown.stdout)], path

    def test_python_frames_in_order(self):
        chains, path = self.record_chains(script("""\
            print(os.getpid(), flush=True)
            top(200_000, 30)
        """))
        chain = ["leaf", "middle", "top.<locals>.<genexpr>", "top",
                 "<module>"]
        self.assertIn(chain, chains,
                      "no sample unwound from py::leaf to py::<module>")
        # No sample shows the Python frames out of order.
        for names in chains:
            if names:
                start = chain.index(names[0])
                self.assertEqual(names, chain[start:start + len(names)])

    def test_every_sample_unwinds_to_module(self):
        # A deep chain whose trampolines were made first, then many more
        # right behind them in the arena: perf must still find each
        # trampoline's own unwind tables (it looks them up just past the
        # code), and walk every sample from leaf to <module>.  The stack
        # copy must hold 14 frames of the evaluator, which are much larger
        # in sanitizer builds: 32 KiB.
        depth = 12
        callers = "\n".join(f"def f{i}(n): return f{i - 1}(n)"
                             for i in range(1, depth + 1))
        chains, path = self.record_chains(textwrap.dedent("""\
            import os
            def f0(n):
                total = 0
                for i in range(n):
                    total += i * i
                return total
            """) + callers + textwrap.dedent(f"""
            print(os.getpid(), flush=True)
            f{depth}(1)
            for i in range(50):
                exec(f"def g{{i}}(): pass\\ng{{i}}()")
            f{depth}(6_000_000)
            """), stack_dump=32768)
        expected = [f"f{i}" for i in range(depth + 1)] + ["<module>"]
        leaf_samples = [c for c in chains if c and c[0] == "f0"]
        self.assertGreaterEqual(len(leaf_samples), 20)
        complete = [c for c in leaf_samples if c == expected]
        self.assertGreaterEqual(
            len(complete), 0.9 * len(leaf_samples),
            f"only {len(complete)} of {len(leaf_samples)} samples in f0 "
            f"unwound to <module>; e.g. {leaf_samples[0]}")

    def remove_jitted(self, pid):
        for path in jitted_files(pid):
            os.unlink(path)


if __name__ == "__main__":
    unittest.main()
