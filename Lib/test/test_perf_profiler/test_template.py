"""The trampoline template (Python/asm_trampoline.S), outside the interpreter.

trampoline_harness.c copies the template into a read-execute mapping, as
Python/perf_trampoline.c does, calls through it and walks the frame
pointers back out.  It is built natively, with CET, and for aarch64 with
and without BTI/PAC; the aarch64 builds run under qemu-user when it is
installed (`-cpu max` enforces BTI on the PROT_BTI mapping).
"""

import functools
import os
import shutil
import subprocess
import sysconfig
import tempfile
import unittest

from test.test_perf_profiler.util import skip_environment

SRCDIR = sysconfig.get_config_var("srcdir") or ""
TEMPLATE = os.path.join(SRCDIR, "Python", "asm_trampoline.S")
HARNESS = os.path.join(os.path.dirname(__file__), "trampoline_harness.c")
FLAGS = ["-O2", "-fno-omit-frame-pointer", "-mno-omit-leaf-frame-pointer"]
NATIVE_CC = shutil.which(sysconfig.get_config_var("CC").split()[0] or "cc")
CROSS_CC = shutil.which("aarch64-linux-gnu-gcc")
QEMU = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")


def setUpModule():
    if not os.path.exists(TEMPLATE):
        skip_environment("needs the source tree (Python/asm_trampoline.S)")


def needs(*tools):
    """Decorator: skip (fail where tests are required) unless each of
    `tools` (name, path or None) was found."""
    def decorator(func):
        @functools.wraps(func)
        def wrapper(self):
            if not all(path for _, path in tools):
                skip_environment("needs " + " and ".join(
                    name for name, path in tools if not path))
            return func(self)
        return wrapper
    return decorator


class TemplateTests(unittest.TestCase):

    def setUp(self):
        self.tmp = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, self.tmp)

    def build(self, cc, *flags, name="harness"):
        exe = os.path.join(self.tmp, name)
        subprocess.run([cc, *FLAGS, *flags, HARNESS, TEMPLATE, "-o", exe],
                       check=True, capture_output=True, text=True)
        return exe

    def assemble(self, cc, *flags):
        obj = os.path.join(self.tmp, "template.o")
        subprocess.run([cc, *flags, "-c", TEMPLATE, "-o", obj],
                       check=True, capture_output=True, text=True)
        return obj

    def run_harness(self, cmd):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertRegex(proc.stdout, r"^ok \d+\n$")
        return int(proc.stdout.split()[1])

    def notes(self, obj, readelf="readelf"):
        return subprocess.run([readelf, "-n", obj], capture_output=True,
                              text=True, check=True).stdout

    def disassembly(self, obj, objdump):
        return subprocess.run([objdump, "-d", obj], capture_output=True,
                              text=True, check=True).stdout

    @needs(("the C compiler Python was built with", NATIVE_CC))
    @unittest.skipUnless(os.uname().machine == "x86_64", "x86_64 only")
    def test_x86_64(self):
        size = self.run_harness([self.build(NATIVE_CC)])
        # push %rbp; mov %rsp,%rbp; lea 1f(%rip),%rax; push %rax;
        # sub $136,%rsp; call *%rcx; 1: add $144,%rsp; pop %rbp; ret
        self.assertEqual(size, 30)
        self.assertNotIn("x86 feature", self.notes(self.assemble(NATIVE_CC)))

    @needs(("the C compiler Python was built with", NATIVE_CC))
    @unittest.skipUnless(os.uname().machine == "x86_64", "x86_64 only")
    def test_x86_64_cet(self):
        size = self.run_harness([self.build(NATIVE_CC, "-fcf-protection")])
        self.assertEqual(size, 34)      # endbr64 in front
        obj = self.assemble(NATIVE_CC, "-fcf-protection")
        self.assertIn("x86 feature: IBT, SHSTK", self.notes(obj))
        self.assertIn("endbr64", self.disassembly(obj, "objdump"))

    @needs(("aarch64-linux-gnu-gcc", CROSS_CC))
    def test_aarch64_assembles(self):
        obj = self.assemble(CROSS_CC)
        self.assertNotIn("AArch64 feature", self.notes(obj))
        obj = self.assemble(CROSS_CC, "-mbranch-protection=standard")
        self.assertIn("AArch64 feature: BTI, PAC", self.notes(obj))
        code = self.disassembly(obj, "aarch64-linux-gnu-objdump")
        for insn in ("bti\tc", "paciasp", "stp\tx29, x30", "blr\tx3",
                     "autiasp"):
            self.assertIn(insn, code)

    @needs(("aarch64-linux-gnu-gcc", CROSS_CC), ("qemu-user", QEMU))
    def test_aarch64_runs(self):
        exe = self.build(CROSS_CC, "-static")
        self.assertEqual(self.run_harness([QEMU, exe]), 36)

    @needs(("aarch64-linux-gnu-gcc", CROSS_CC), ("qemu-user", QEMU))
    def test_aarch64_bti_pac_runs(self):
        exe = self.build(CROSS_CC, "-static", "-mbranch-protection=standard")
        self.assertEqual(self.run_harness([QEMU, "-cpu", "max", exe]), 48)
        # The landing pad is what makes the indirect call legal: entering
        # past it traps on the PROT_BTI mapping.
        proc = subprocess.run([QEMU, "-cpu", "max", exe, "skip-landing-pad"],
                              capture_output=True, text=True, timeout=60)
        self.assertNotEqual(proc.returncode, 0)
        self.assertNotIn("ok", proc.stdout)


if __name__ == "__main__":
    unittest.main()
