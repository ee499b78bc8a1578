"""gdb walks through trampolines: backtraces reach main, py-bt prints
what it prints with perf off, and the JIT interface describes the
arenas (also beside another JIT's registrations)."""

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import unittest

from test import support
from test.test_perf_profiler.util import (
    GDB_FRAME_RE, GDB_OPTIONS, INLINED_CALLS, PerfTestCase, clean_env,
    gdb_available, gdb_backtrace, needs_host, skip_environment,
    target_command, write_script)

EVAL = "_PyEval_EvalFrameDefault"


# gdb learns about trampolines through its JIT interface
# (Python/perf_gdb_jit.c): one in-memory ELF image per arena, with a
# function symbol and an FDE for every slot.
GDB_TRAMPOLINE = "py_trampoline"

# gdb's JIT interface (GDB manual, "JIT Compilation Interface"), for the C
# programs below that stand in for another JIT.
JIT_INTERFACE_C = """\
#include <stdint.h>

struct jit_code_entry {
    struct jit_code_entry *next_entry;
    struct jit_code_entry *prev_entry;
    const char *symfile_addr;
    uint64_t symfile_size;
};
struct jit_descriptor {
    uint32_t version;
    uint32_t action_flag;
    struct jit_code_entry *relevant_entry;
    struct jit_code_entry *first_entry;
};
"""

def run_gdb(commands, args=(), *, attach=None, files=None,
            timeout=support.SHORT_TIMEOUT):
    """Run gdb -batch with `commands` (each an -ex) on the program `args`,
    or attached to the process `attach`; return its whole output.
    `files` (a ProfilerFiles) claims the files of the processes it ran."""
    cmd = ["gdb", *GDB_OPTIONS]
    if attach is not None:
        cmd += ["-p", str(attach)]
    for command in commands:
        cmd += ["-ex", command]
    if args:
        cmd += ["--args", *args]
    proc = subprocess.run(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL, text=True, errors="backslashreplace",
        env=clean_env(), timeout=timeout)
    if files is not None:
        files.add_gdb_inferiors(proc.stdout)
    return proc.stdout


def backtraces(output):
    """The frame names of each "bt" in gdb's output, innermost first."""
    traces = []
    for line in output.splitlines():
        match = GDB_FRAME_RE.match(line)
        if match is None:
            continue
        if match.group(1) == "0":
            traces.append([])
        if traces:
            traces[-1].append(match.group(2))
    return traces


@needs_host("gdb")
class GdbTests(PerfTestCase):
    """gdb unwinds through trampolines: a backtrace taken anywhere in a
    Python call reaches main, each evaluator entry called by its
    trampoline.  Under -X perf a Python function called from Python runs
    inside its caller's evaluator entry, as on stock 3.11 (frame records
    name it to perf, Python/ceval.c); under -X perf_jit each call is an
    evaluator entry of its own."""

    SCRIPT = """\
        import os
        def leaf():
            return os.getppid()
        def middle():
            return leaf()
        def top():
            return middle()
        top()
        """

    def setUp(self):
        super().setUp()
        reason = gdb_available()
        if reason:
            skip_environment(reason)

    def assertPythonLevels(self, names, levels, output):
        """`levels` evaluator entries, each called by a trampoline gdb
        names, and the whole stack down to main."""
        self.assertEqual(names.count(EVAL), levels, output)
        self.assertEqual(
            sum(names[i:i + 2] == [EVAL, GDB_TRAMPOLINE]
                for i in range(len(names))), levels, output)
        self.assertNotIn("Backtrace stopped", output)
        self.assertIn("Py_BytesMain", names, output)
        # Every frame down to main has a name.  (Below it, libc's own
        # static functions have none without libc's debug symbols.)
        self.assertNotIn("??", names[:names.index("Py_BytesMain")], output)

    def test_backtrace_walks_through_trampolines(self):
        path = write_script(self.tmpdir, self.SCRIPT)
        # The same stop without trampolines shows what this gdb can do.
        names, output = gdb_backtrace([sys.executable, path], "os_getppid",
                                      self.files)
        if names[:1] != ["os_getppid"] or "Py_BytesMain" not in names:
            skip_environment("gdb cannot unwind this interpreter without "
                          "trampolines either:\n" + output[-1000:])
        # perf: leaf, middle and top inline in <module>'s entry;
        # perf_jit: each an entry.
        for backend, levels in (("perf", 1 if INLINED_CALLS else 4),
                                ("perf_jit", 4)):
            with self.subTest(backend=backend):
                names, output = gdb_backtrace(
                    [sys.executable, "-X", backend, path], "os_getppid",
                    self.files)
                self.assertEqual(names[:1], ["os_getppid"], output)
                self.assertPythonLevels(names, levels, output)

    def test_backtrace_from_the_evaluator(self):
        # Stop at the entry of inner()'s evaluator, four levels deep: its
        # caller is the trampoline, at the instruction after the call.
        # operator.call() calls it from C: an entry under -X perf too.
        path = write_script(self.tmpdir, """\
            import operator, os
            def inner():
                return 1
            def leaf():
                os.getppid()
                return operator.call(inner)
            def middle():
                return leaf()
            def top():
                return middle()
            top()
            """)
        # perf: inner, and <module> with leaf, middle and top inline;
        # perf_jit: inner, leaf, middle, top and <module>.
        for backend, levels in (("perf", 2 if INLINED_CALLS else 5),
                                ("perf_jit", 5)):
            with self.subTest(backend=backend):
                output = run_gdb(
                    ["break os_getppid", "run",
                     f"break {EVAL}", "continue", "bt", "kill"],
                    [sys.executable, "-X", backend, path], files=self.files)
                traces = backtraces(output)
                self.assertEqual(len(traces), 1, output)
                names = traces[0]
                self.assertEqual(names[:2], [EVAL, GDB_TRAMPOLINE], output)
                self.assertPythonLevels(names, levels, output)

    # Run inside gdb: stop in leaf()'s first call, then break at every
    # instruction of leaf()'s trampoline (its address from the perf map)
    # and take a backtrace at each stop.  The first call hits the
    # instructions after the call; the second call, all of them.
    STEP_SCRIPT = """\
        import gdb

        def stack():
            names = []
            frame = gdb.newest_frame()
            while frame is not None:
                names.append(frame.name() or "??")
                last, frame = frame, frame.older()
            return names, gdb.frame_stop_reason_string(
                last.unwind_stop_reason())

        gdb.execute("run")
        pid = gdb.selected_inferior().pid
        with open(f"/tmp/perf-{{pid}}.map", encoding="utf-8") as f:
            for line in f:
                start, size, name = line.rstrip("\\n").split(" ", 2)
                if name == {target!r}:
                    start, size = int(start, 16), int(size, 16)
                    break
        frame = gdb.newest_frame()
        while not start <= frame.pc() < start + size:
            frame = frame.older()
        print("RETURN", frame.pc() - start)
        arch = gdb.selected_frame().architecture()
        insns = arch.disassemble(start, start + size - 1)
        print("INSNS", *(insn["addr"] - start for insn in insns))
        gdb.execute("delete")
        for insn in insns:
            gdb.Breakpoint(f"*{{insn['addr']:#x}}")
        for _ in range(100):
            gdb.execute("continue")
            if not gdb.selected_inferior().threads():
                break
            names, reason = stack()
            offset = gdb.selected_frame().pc() - start
            print("STOP", offset, ",".join(names), reason)
        """

    def test_every_instruction_of_a_trampoline(self):
        probe = run_gdb(["python print('gdb has python')"])
        if "gdb has python" not in probe:
            skip_environment("this gdb has no Python support:\n" + probe)
        # The first call of leaf() makes its trampoline, the calls from
        # middle() are the ones stopped in.  operator.call() calls it from
        # C, so that it runs in a trampoline of its own (called from
        # Python, it would run inline in middle's evaluator entry).
        path = write_script(self.tmpdir, """\
            import operator, os
            def leaf():
                return os.getppid()
            def middle():
                operator.call(leaf)
                return operator.call(leaf)
            def top():
                return middle()
            operator.call(leaf)
            top()
            """)
        commands = write_script(
            self.tmpdir,
            self.STEP_SCRIPT.format(target=f"py::leaf:{path}"),
            name="commands.py")
        output = run_gdb(["break os_getppid", "ignore 1 1",
                          f"source {commands}"],
                         [sys.executable, "-X", "perf", path],
                         files=self.files)
        insns = returns_to = None
        stops = []
        for line in output.splitlines():
            words = line.split()
            if words[:1] == ["INSNS"]:
                insns = [int(word) for word in words[1:]]
            elif words[:1] == ["RETURN"]:
                returns_to = int(words[1])
            elif words[:1] == ["STOP"]:
                _, offset, names, reason = line.split(" ", 3)
                stops.append((int(offset), reason, names.split(",")))
        self.assertIsNotNone(insns, output)
        self.assertIn(returns_to, insns, output)
        self.assertGreater(returns_to, insns[0], output)
        # The first call is past its call instruction; the second one
        # runs them all.
        expected = [offset for offset in insns if offset >= returns_to]
        self.assertEqual([offset for offset, _, _ in stops],
                         expected + insns, output)
        for offset, reason, names in stops:
            with self.subTest(offset=offset):
                # leaf's trampoline, operator.call(), then one entry for
                # <module>, top and middle.
                self.assertEqual(names[0], GDB_TRAMPOLINE, output)
                self.assertEqual(names.count(EVAL),
                                 1 if INLINED_CALLS else 3, output)
                self.assertIn("PyObject_Vectorcall",
                              names[1:names.index(EVAL)], output)
                self.assertEqual(names[names.index(EVAL) + 1],
                                 GDB_TRAMPOLINE, output)
                self.assertIn("Py_BytesMain", names, output)
                # gdb ends a backtrace at main when it knows main (as in
                # a --with-pydebug build), else where the stack ends;
                # never at an unwinding error.
                if names[-1] != "main":
                    self.assertEqual(reason, "outermost", output)

    OTHER_JIT = """\
/* Another JIT in the process: its own gdb JIT interface pair, and one
   image (an object file with a function) registered through it. */
#include <stdlib.h>
#include <string.h>
""" + JIT_INTERFACE_C + """

void __attribute__((noinline))
__jit_debug_register_code(void)
{
    __asm__ __volatile__("" ::: "memory");
}

struct jit_descriptor __jit_debug_descriptor = {1, 0, NULL, NULL};

int
other_jit_register(const char *image, uint64_t size)
{
    struct jit_code_entry *entry = calloc(1, sizeof(*entry));
    char *copy = malloc(size);
    if (entry == NULL || copy == NULL) {
        return -1;
    }
    memcpy(copy, image, size);
    entry->symfile_addr = copy;
    entry->symfile_size = size;
    entry->next_entry = __jit_debug_descriptor.first_entry;
    if (entry->next_entry != NULL) {
        entry->next_entry->prev_entry = entry;
    }
    __jit_debug_descriptor.first_entry = entry;
    __jit_debug_descriptor.relevant_entry = entry;
    __jit_debug_descriptor.action_flag = 1;
    __jit_debug_register_code();
    __jit_debug_descriptor.action_flag = 0;
    return 0;
}
"""

    def test_another_jits_images_next_to_ours(self):
        # A JIT library with its own pair of gdb symbols registers an image
        # (an object file with one function) from a -X perf process: gdb
        # knows that function and still walks through our trampolines.
        cc = shutil.which(sysconfig.get_config_var("CC").split()[0])
        if cc is None:
            skip_environment("needs the C compiler Python was built with")
        library = os.path.join(self.tmpdir, "libotherjit.so")
        image = os.path.join(self.tmpdir, "image.o")
        write_script(self.tmpdir, self.OTHER_JIT, "otherjit.c")
        write_script(self.tmpdir,
                     "int other_jit_function(int x) { return x * 7; }\n",
                     "image.c")
        for command in ([cc, "-shared", "-fPIC", "otherjit.c", "-o",
                         library],
                        [cc, "-g", "-c", "image.c", "-o", image]):
            build = subprocess.run(command, cwd=self.tmpdir,
                                   capture_output=True, text=True)
            self.assertEqual(build.returncode, 0, build.stderr)
        path = write_script(self.tmpdir, """\
            import ctypes, os, sys
            other_jit = ctypes.PyDLL(sys.argv[1])
            with open(sys.argv[2], "rb") as f:
                image = f.read()
            if other_jit.other_jit_register(image,
                                            ctypes.c_uint64(len(image))):
                sys.exit("other_jit_register failed")
            def leaf():
                return os.getppid()
            def middle():
                return leaf()
            middle()
            """)
        output = run_gdb(["break os_getppid", "run",
                          "info functions other_jit_function", "bt", "kill"],
                         [sys.executable, "-X", "perf", path, library, image],
                         files=self.files)
        self.assertIn("int other_jit_function(int);", output)
        traces = backtraces(output)
        self.assertEqual(len(traces), 1, output)
        # leaf and middle inline in <module>'s entry
        self.assertPythonLevels(traces[0], 1 if INLINED_CALLS else 3,
                                output)

    def test_py_bt(self):
        # CPython's gdb extension walks the C stack for evaluator frames:
        # it needs the unwinding through trampolines too.
        extension = os.path.join(os.path.dirname(sys.executable),
                                 "python-gdb.py")
        if not os.path.exists(extension):
            skip_environment(f"needs the build directory's {extension}")
        probe = run_gdb(["python print('gdb has python')"])
        if "gdb has python" not in probe:
            skip_environment("this gdb has no Python support:\n" + probe)
        path = write_script(self.tmpdir, self.SCRIPT)
        output = run_gdb([f"source {extension}", "break os_getppid", "run",
                          "py-bt", "kill"],
                         [sys.executable, "-X", "perf", path],
                         files=self.files)
        functions = re.findall(rf'^  File "{re.escape(path)}", line \d+, '
                               rf'in (\S+)$', output, re.MULTILINE)
        self.assertEqual(functions, ["leaf", "middle", "top", "<module>"],
                         output)
        self.assertNotIn("Python Exception", output)

    # A C function reached through recursion deeper than an evaluator
    # entry's frame records, a generator pipeline and a C callback.
    PIPELINE = """\
        import os

        def key(item):
            return os.getppid()

        def numbers():
            yield from range(2)

        def pairs(items):
            for item in items:
                yield sorted([item, -item], key=key)

        def down(n):
            if n == 0:
                return list(pairs(numbers()))
            return down(n - 1)

        down(12)
        """

    def test_bt_py_bt_finish_up_down(self):
        extension = os.path.join(os.path.dirname(sys.executable),
                                 "python-gdb.py")
        if not os.path.exists(extension):
            skip_environment(f"needs the build directory's {extension}")
        path = write_script(self.tmpdir, self.PIPELINE)
        commands = [f"source {extension}", "break os_getppid", "run",
                    "echo BT\\n", "bt", "echo PY-BT\\n", "py-bt",
                    "echo UP\\n", "up", "echo DOWN\\n", "down",
                    "echo FINISH\\n", "finish",
                    "echo EVAL\\n", f"frame function {EVAL}",
                    "echo FINISH-EVAL\\n", "finish", "kill"]
        outputs = {}
        for args in ((), ("-X", "perf")):
            output = run_gdb(commands, [sys.executable, *args, path],
                             files=self.files)
            parts = re.split(r"^(BT|PY-BT|UP|DOWN|FINISH|EVAL|FINISH-EVAL)$",
                             output, flags=re.MULTILINE)
            outputs[args] = dict(zip(parts[1::2], parts[2::2]))
            self.assertEqual(len(outputs[args]), 7, output)
            self.assertNotIn("Python Exception", output)
        off, on = outputs[()], outputs[("-X", "perf")]
        # bt reaches main, every frame named.
        names = backtraces(on["BT"])[0]
        self.assertEqual(names[0], "os_getppid", on["BT"])
        self.assertIn(GDB_TRAMPOLINE, names, on["BT"])
        self.assertPythonLevels(names, names.count(EVAL), on["BT"])
        # py-bt prints exactly what it prints with perf off.
        frames = re.findall(r'^  File ".*", line \d+, in \S+$',
                            on["PY-BT"], re.MULTILINE)
        self.assertEqual(frames, re.findall(r'^  File ".*", line \d+, in \S+$',
                                            off["PY-BT"], re.MULTILINE))
        self.assertEqual([frame.rsplit(" in ", 1)[1] for frame in frames],
                         ["key", "pairs"] + ["down"] * 13 + ["<module>"],
                         on["PY-BT"])
        # up and down move between the frames bt shows.
        self.assertRegex(on["UP"], rf"(?m)^#1 .* in {names[1]} ")
        self.assertRegex(on["DOWN"], r"(?m)^#0 .*os_getppid ")
        # finish runs to the caller and stops there, as with perf off.
        for out in (off, on):
            self.assertRegex(out["FINISH"], rf"(?m)^{names[1]} ")
            self.assertIn("Value returned is ", out["FINISH"])
        # The innermost evaluator entry (key's, called by sorted) runs to
        # its return: into its trampoline under -X perf.
        self.assertIn(f"in {EVAL} ", on["EVAL"])
        self.assertRegex(on["FINISH-EVAL"],
                         rf"(?m)^0x[0-9a-f]+ in {GDB_TRAMPOLINE} ")
        self.assertIn("Value returned is ", on["FINISH-EVAL"])

    def test_attach_to_process_and_forked_child(self):
        # gdb -p finds the images already registered, by walking the list;
        # a forked child has the parent's images at the same addresses.
        path = write_script(self.tmpdir, """\
            import os, sys
            def leaf():
                return os.read(0, 1)        # until the test closes stdin
            def middle():
                pid = os.fork()
                role = "child" if pid == 0 else "parent"
                # One write(): print() may split a line between writes.
                os.write(1, f"{role} {os.getpid()}\\n".encode())
                leaf()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
            def top():
                return middle()
            top()
            """)
        proc = subprocess.Popen(
            [sys.executable, "-X", "perf", path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, env=clean_env())
        try:
            pids = {}
            for _ in range(2):
                role, pid = proc.stdout.readline().split()
                pids[role] = int(pid)
                self.files.add_pid(pid)
            for role, pid in sorted(pids.items()):
                with self.subTest(role):
                    output = run_gdb(["bt", "detach"], attach=pid)
                    if "ptrace: Operation not permitted" in output:
                        skip_environment("gdb may not attach here (ptrace "
                                      "scope):\n" + output[-500:])
                    traces = backtraces(output)
                    self.assertEqual(len(traces), 1, output)
                    # leaf, middle and top inline in <module>'s entry
                    self.assertPythonLevels(
                        traces[0], 1 if INLINED_CALLS else 4, output)
        finally:
            proc.stdin.close()
            proc.stdout.close()
            proc.wait(timeout=support.SHORT_TIMEOUT)
        self.assertEqual(proc.returncode, 0)


class GdbJitImageTests(PerfTestCase):
    """The ELF images Python/perf_gdb_jit.c hands gdb, read back from a
    running interpreter through __jit_debug_descriptor and decoded with
    readelf: one per arena, with one symbol and one FDE covering all its
    slots, the FDE's rules right at every instruction of every slot."""

    # Make trampolines until a second arena exists, then walk the list
    # and dump every image into the current directory.
    SCRIPT = """\
        import ctypes, json, types

        class Entry(ctypes.Structure):
            pass
        Entry._fields_ = [
            ("next_entry", ctypes.POINTER(Entry)),
            ("prev_entry", ctypes.POINTER(Entry)),
            ("symfile_addr", ctypes.c_void_p),
            ("symfile_size", ctypes.c_uint64),
        ]
        class Descriptor(ctypes.Structure):
            _fields_ = [
                ("version", ctypes.c_uint32),
                ("action_flag", ctypes.c_uint32),
                ("relevant_entry", ctypes.POINTER(Entry)),
                ("first_entry", ctypes.POINTER(Entry)),
            ]
        api = ctypes.PyDLL(None)
        descriptor = Descriptor.in_dll(api, "__jit_debug_descriptor")

        def entries():
            found = []
            entry = descriptor.first_entry
            while entry:
                found.append(entry)
                entry = entry.contents.next_entry
            return found

        code = compile("def f(): return 1", "generated.py", "exec")
        body = code.co_consts[0]
        for i in range(100_000):
            if i % 256 == 0 and len(entries()) >= 2:
                break
            types.FunctionType(body.replace(co_name=f"f{i}"), {})()

        images = []
        previous = None
        for n, entry in enumerate(entries()):
            e = entry.contents
            with open(f"image{n}.o", "wb") as f:
                f.write(ctypes.string_at(e.symfile_addr, e.symfile_size))
            prev = ctypes.cast(e.prev_entry, ctypes.c_void_p).value
            images.append({"path": f"image{n}.o", "size": e.symfile_size,
                           "prev_ok": prev == previous})
            previous = ctypes.addressof(e)
        import _testinternalcapi
        print(json.dumps({
            "version": descriptor.version,
            "action_flag": descriptor.action_flag,
            "relevant_entry": bool(descriptor.relevant_entry),
            "template_size": len(_testinternalcapi.perf_template()),
            "images": images,
        }))
        """

    def setUp(self):
        super().setUp()
        if shutil.which("readelf") is None:
            skip_environment("readelf (binutils) is not installed")

    def readelf(self, *args):
        proc = subprocess.run(["readelf", "-W", *args],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, errors="backslashreplace",
                              timeout=support.SHORT_TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Warning", proc.stderr)
        return proc.stdout

    def sections(self, path):
        """{name: (type, address, size, flags)} from readelf -S."""
        found = {}
        for line in self.readelf("-S", path).splitlines():
            match = re.match(r"^\s*\[\s*\d+\]\s+(\S+)\s+(\S+)\s+([0-9a-f]+) "
                             r"[0-9a-f]+ ([0-9a-f]+) [0-9a-f]+\s+(\S*)\s+\d",
                             line)
            if match:
                name, kind, addr, size, flags = match.groups()
                found[name] = (kind, int(addr, 16), int(size, 16), flags)
        return found

    def symbols(self, path):
        """[(value, size, type, bind, section, name)] from readelf -s."""
        found = []
        for line in self.readelf("-s", path).splitlines():
            words = line.split()
            if len(words) in (7, 8) and re.fullmatch(r"\d+:", words[0]):
                found.append((int(words[1], 16), int(words[2]), words[3],
                              words[4], words[6], " ".join(words[7:])))
        return found

    def eh_frame(self, path):
        """The bytes of the image's .eh_frame section."""
        with open(path, "rb") as f:
            data = f.read()
        shoff, = struct.unpack_from("<Q", data, 0x28)
        shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3a)
        def header(i):
            # name, offset, size
            name, = struct.unpack_from("<I", data, shoff + i * shentsize)
            offset, size = struct.unpack_from("<QQ", data,
                                              shoff + i * shentsize + 24)
            return name, offset, size
        _, names_at, _ = header(shstrndx)
        for i in range(shnum):
            name, offset, size = header(i)
            end = data.index(b"\0", names_at + name)
            if data[names_at + name:end] == b".eh_frame":
                return data[offset:offset + size]
        self.fail(f"{path} has no .eh_frame")

    def test_images(self):
        # Rules derived from the template's disassembly, as test_jit does.
        from test.test_perf_profiler.jitlib import (
            HOST_MACHINE, check_slot_fde, disassemble, make_elf,
            running_template, unwind_info_from_c)
        if HOST_MACHINE is None:
            self.skipTest("not an x86_64 or aarch64 host")
        template = running_template()
        slot = (len(template) + 15) & ~15
        elf = os.path.join(self.tmpdir, "template.so")
        with open(elf, "wb") as f:
            f.write(make_elf(HOST_MACHINE, template,
                             *unwind_info_from_c(HOST_MACHINE, template)))
        insns = disassemble(self, HOST_MACHINE, elf)

        result = self.run_script(self.SCRIPT, python_args=["-X", "perf"])
        info = json.loads(result.stdout)
        # Registered and back to "no action", as the protocol asks.
        self.assertEqual((info["version"], info["action_flag"],
                          info["relevant_entry"]), (1, 0, False))
        self.assertEqual(info["template_size"], len(template))
        images = info["images"]
        self.assertEqual(len(images), 2, "one image per arena")
        texts = []
        for image in images:
            with self.subTest(image=image["path"]):
                self.assertTrue(image["prev_ok"], "list links")
                path = os.path.join(self.tmpdir, image["path"])
                header = self.readelf("-h", path)
                self.assertRegex(header, r"Type:\s+REL ")
                self.assertRegex(header, r"Class:\s+ELF64")
                machine = {62: "X86-64", 183: "AArch64"}[HOST_MACHINE]
                self.assertRegex(header, rf"Machine:\s+.*{machine}")

                sections = self.sections(path)
                self.assertEqual(sorted(sections), [
                    ".eh_frame", ".shstrtab", ".strtab", ".symtab", ".text"])
                kind, text, text_size, flags = sections[".text"]
                self.assertEqual((kind, flags), ("NOBITS", "AX"))
                self.assertEqual(sections[".eh_frame"][0], "PROGBITS")
                texts.append((text, text_size))

                # One symbol, covering every slot.
                symbols = self.symbols(path)
                self.assertEqual(symbols, [
                    (0, 0, "NOTYPE", "LOCAL", "UND", ""),
                    (0, text_size, "FUNC", "LOCAL", "1", GDB_TRAMPOLINE)])
                self.assertEqual(text_size % slot, 0)
                self.assertGreater(text_size // slot, 1000)

                # One CIE and one FDE (which readelf decodes without a
                # warning), with the template's rules at every instruction
                # of every slot.
                self.assertIn("DW_CFA_def_cfa_expression",
                              self.readelf("--debug-dump=frames", path))
                check_slot_fde(self, HOST_MACHINE, insns,
                               self.eh_frame(path), text, text_size, slot)

                # The section headers end the image.
                shoff = re.search(r"Start of section headers:\s+(\d+)",
                                  header)
                self.assertEqual(int(shoff.group(1)) + 6 * 64,
                                 image["size"])

        # The arenas do not overlap, and every trampoline of the map
        # starts at a slot of one of them.
        texts.sort()
        for (a, a_size), (b, _) in zip(texts, texts[1:]):
            self.assertLessEqual(a + a_size, b)
        entries = result.map_entries()
        self.assertGreater(len(entries), sum(size for _, size in texts)
                           // slot // 2)
        for entry in entries:
            self.assertTrue(any(text <= entry.start < text + size
                                and (entry.start - text) % slot == 0
                                for text, size in texts), entry)


class GdbJitSymbolTests(PerfTestCase):
    """gdb's JIT interface symbols are weak: a program that links the
    static libpython next to its own pair (as LLVM, LuaJIT or V8 users
    do) links, and our images go to its list."""

    HOST = """\
#include <Python.h>
""" + JIT_INTERFACE_C + """
/* This program's own gdb JIT interface, as another JIT would define it. */

static int registrations;

void __attribute__((noinline))
__jit_debug_register_code(void)
{
    registrations++;
    __asm__ __volatile__("" ::: "memory");
}

struct jit_descriptor __jit_debug_descriptor = {1, 0, NULL, NULL};

int
main(int argc, char **argv)
{
    PyConfig config;
    PyConfig_InitIsolatedConfig(&config);
    config.module_search_paths_set = 1;
    for (int i = 1; i < argc; i++) {
        wchar_t *path = Py_DecodeLocale(argv[i], NULL);
        if (path == NULL
            || PyStatus_Exception(PyWideStringList_Append(
                   &config.module_search_paths, path))) {
            return 2;
        }
        PyMem_RawFree(path);
    }
    if (PyStatus_Exception(PyWideStringList_Append(&config.xoptions,
                                                   L"perf"))) {
        return 2;
    }
    PyStatus status = Py_InitializeFromConfig(&config);
    PyConfig_Clear(&config);
    if (PyStatus_Exception(status)) {
        Py_ExitStatusException(status);
    }
    if (PyRun_SimpleString(
            "import sys\\n"
            "def f():\\n"
            "    return sys.is_stack_trampoline_active()\\n"
            "print(f())\\n") != 0) {
        return 1;
    }
    int entries = 0;
    for (struct jit_code_entry *e = __jit_debug_descriptor.first_entry;
         e != NULL; e = e->next_entry) {
        entries++;
    }
    printf("%d %d\\n", registrations > 0, entries == registrations);
    return Py_FinalizeEx() < 0 ? 1 : 0;
}
"""

    def test_host_with_its_own_pair(self):
        srcdir = sysconfig.get_config_var("srcdir")
        if sysconfig.get_config_var("Py_ENABLE_SHARED"):
            # The build's libpython.so: its uses of the pair must bind to
            # the program's, even linked -Bsymbolic-functions (Debian).
            name = sysconfig.get_config_var("LDLIBRARY")
            library = [f"-L{srcdir}", f"-l:{name}", f"-Wl,-rpath,{srcdir}"]
        else:
            name = sysconfig.get_config_var("LIBRARY")
            library = [os.path.join(srcdir, name)]
        if not os.path.exists(os.path.join(srcdir, name)):
            skip_environment(f"needs the build directory's {name}")
        cc = shutil.which(sysconfig.get_config_var("CC").split()[0])
        if cc is None:
            skip_environment("needs the C compiler Python was built with")
        source = write_script(self.tmpdir, self.HOST, "host.c")
        host = os.path.join(self.tmpdir, "host")
        libs = " ".join(sysconfig.get_config_var(name) or "" for name in
                        ("LIBS", "SYSLIBS", "MODLIBS", "LINKFORSHARED"))
        build = subprocess.run(
            [cc, "-I", os.path.join(srcdir, "Include"), "-I", srcdir,
             source, *library, *libs.split(), "-o", host],
            capture_output=True, text=True)
        self.assertEqual(build.returncode, 0, build.stderr)
        with open(os.path.join(srcdir, "pybuilddir.txt")) as f:
            extensions = os.path.join(srcdir, f.read().strip())
        proc = subprocess.Popen(
            target_command([host, os.path.join(srcdir, "Lib"), extensions]),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env())
        self.files.add_pid(proc.pid)
        stdout, stderr = proc.communicate(timeout=support.SHORT_TIMEOUT)
        self.assertEqual(proc.returncode, 0, stderr)
        # Trampolines on; the host's own function was called and its list
        # holds every image registered.
        self.assertEqual((stdout, stderr), ("True\n1 1\n", ""))


if __name__ == "__main__":
    unittest.main()
