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
or sys.executable.  perf inject --jit needs perf >= 6.8 (the environment
variable PERF may name the perf binary; default: "perf" on PATH).
"""

import errno
import glob
import os
import platform
import re
import shutil
import struct
import subprocess
import sys
import sysconfig
import tempfile
import textwrap
import time
import unittest
from typing import NamedTuple

from test import support
from test.support import import_helper
from test.test_perf_profiler.util import (
    PerfTestCase, clean_env, host_tool, jitdump_path, map_path,
    map_written_since, needs_host, parse_perf_script, skip_environment,
    write_script)

if not sysconfig.get_config_var("PY_HAVE_PERF_JIT_TRAMPOLINE"):
    raise unittest.SkipTest("this Python was built without the perf_jit "
                            "backend (PY_HAVE_PERF_JIT_TRAMPOLINE is not set)")

_testinternalcapi = import_helper.import_module("_testinternalcapi")

NOFP_PYTHON = os.environ.get("PERF_NOFP_PYTHON") or sys.executable
PERF = os.environ.get("PERF") or "perf"
PERF_JIT_MIN = (6, 8)
TIMEOUT = support.LONG_TIMEOUT

SRCDIR = sysconfig.get_config_var("srcdir") or ""
TEMPLATE_SOURCE = os.path.join(SRCDIR, "Python", "asm_trampoline.S")

EM_X86_64 = 62
EM_AARCH64 = 183
HOST_MACHINE = {"x86_64": EM_X86_64,
                "aarch64": EM_AARCH64}.get(platform.machine())
# GNU tool prefixes per machine, for cross tools.
TOOL_PREFIX = {EM_X86_64: "x86_64-linux-gnu-",
               EM_AARCH64: "aarch64-linux-gnu-"}


def run(args, **kwargs):
    """subprocess.run with text output and the module's timeout."""
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    kwargs.setdefault("timeout", TIMEOUT)
    return subprocess.run(args, text=True, errors="backslashreplace",
                          **kwargs)


def gnu_tool(machine, name):
    """Path of the binutils/gcc tool `name` for `machine`, or None."""
    found = shutil.which(TOOL_PREFIX[machine] + name)
    if found is None and machine == HOST_MACHINE:
        found = shutil.which(name)
    return found


# ----------------------------------------------------------------------
# The jitdump format (perf's tools/perf/Documentation/
# jitdump-specification.txt), host byte order: little-endian here.

JITDUMP_MAGIC = 0x4A695444
JIT_CODE_LOAD = 0
JIT_CODE_UNWINDING_INFO = 4
HEADER = struct.Struct("<IIIIIIQQ")
PREFIX = struct.Struct("<IIQ")
CODE_LOAD = struct.Struct("<IIQQQQ")
UNWINDING = struct.Struct("<QQQ")


class Header(NamedTuple):
    magic: int
    version: int
    total_size: int
    elf_mach: int
    pad1: int
    pid: int
    timestamp: int
    flags: int


class CodeLoad(NamedTuple):
    timestamp: int
    pid: int
    tid: int
    vma: int
    code_addr: int
    code_size: int
    code_index: int
    name: str
    code: bytes


class Unwinding(NamedTuple):
    timestamp: int
    record_size: int
    unwinding_size: int
    eh_frame_hdr_size: int
    mapped_size: int
    data: bytes             # .eh_frame then .eh_frame_hdr


def parse_jitdump(data):
    """Parse a whole dump: (Header, [CodeLoad | Unwinding, ...]).

    Raises ValueError on anything that is not exactly a header followed
    by complete records of the two kinds this backend writes.
    """
    if len(data) < HEADER.size:
        raise ValueError(f"dump too short for a header: {len(data)} bytes")
    header = Header(*HEADER.unpack_from(data))
    if header.magic != JITDUMP_MAGIC:
        raise ValueError(f"bad magic {header.magic:#x}")
    records = []
    offset = header.total_size
    while offset < len(data):
        if offset + PREFIX.size > len(data):
            raise ValueError(f"truncated record prefix at {offset}")
        kind, size, timestamp = PREFIX.unpack_from(data, offset)
        if size < PREFIX.size or offset + size > len(data):
            raise ValueError(f"record at {offset} has bad size {size}")
        body = data[offset + PREFIX.size:offset + size]
        if kind == JIT_CODE_LOAD:
            fields = CODE_LOAD.unpack_from(body)
            code_size = fields[4]
            rest = body[CODE_LOAD.size:]
            nul = rest.find(b"\0")
            if nul < 0 or len(rest) != nul + 1 + code_size:
                raise ValueError(f"code load at {offset}: name and code "
                                 f"do not fill the record")
            records.append(CodeLoad(timestamp, *fields,
                                    rest[:nul].decode("utf-8"),
                                    rest[nul + 1:]))
        elif kind == JIT_CODE_UNWINDING_INFO:
            sizes = UNWINDING.unpack_from(body)
            payload = body[UNWINDING.size:]
            if sizes[0] > len(payload) or len(payload) - sizes[0] >= 8:
                raise ValueError(f"unwinding record at {offset}: "
                                 f"{sizes[0]} bytes of data in a "
                                 f"{len(payload)}-byte payload")
            records.append(Unwinding(timestamp, size, *sizes,
                                     payload[:sizes[0]]))
        else:
            raise ValueError(f"unexpected record id {kind} at {offset}")
        offset += size
    return header, records


def read_jitdump(pid):
    with open(jitdump_path(pid), "rb") as f:
        return parse_jitdump(f.read())


# ----------------------------------------------------------------------
# Unwind tables, decoded by readelf

TEXT_ADDRESS = 0x80     # where perf inject puts .text in jitted-*.so


def align8(n):
    return (n + 7) & ~7


def make_elf(machine, code, unwinding, eh_frame_hdr_size):
    """A minimal ELF64 file laid out as perf inject's jitted-*.so: .text
    at TEXT_ADDRESS, .eh_frame at the next 8-byte boundary after it, then
    .eh_frame_hdr.  File offsets equal addresses."""
    eh_frame_size = len(unwinding) - eh_frame_hdr_size
    eh_frame = TEXT_ADDRESS + align8(len(code))
    eh_frame_hdr = eh_frame + eh_frame_size
    names = b"\0.text\0.eh_frame\0.eh_frame_hdr\0.shstrtab\0"
    strtab = eh_frame_hdr + eh_frame_hdr_size
    sections_at = align8(strtab + len(names))
    image = bytearray(sections_at)
    image[TEXT_ADDRESS:TEXT_ADDRESS + len(code)] = code
    image[eh_frame:eh_frame + len(unwinding)] = unwinding
    image[strtab:strtab + len(names)] = names

    def section(name, kind, flags, addr, size, align):
        return struct.pack("<IIQQQQIIQQ", name, kind, flags, addr,
                           addr if kind != 0 else 0, size, 0, 0, align, 0)

    SHT_PROGBITS, SHT_STRTAB, SHF_ALLOC, SHF_EXECINSTR = 1, 3, 2, 4
    sections = [
        section(0, 0, 0, 0, 0, 0),
        section(1, SHT_PROGBITS, SHF_ALLOC | SHF_EXECINSTR, TEXT_ADDRESS,
                len(code), 16),
        section(7, SHT_PROGBITS, SHF_ALLOC, eh_frame, eh_frame_size, 8),
        section(17, SHT_PROGBITS, SHF_ALLOC, eh_frame_hdr,
                eh_frame_hdr_size, 4),
        struct.pack("<IIQQQQIIQQ", 31, SHT_STRTAB, 0, 0, strtab,
                    len(names), 0, 0, 1, 0),
    ]
    ident = b"\x7fELF" + bytes([2, 1, 1]) + bytes(9)   # 64-bit, LE
    image[0:64] = struct.pack("<16sHHIQQQIHHHHHH", ident, 3, machine, 1,
                              TEXT_ADDRESS, 0, sections_at, 0, 64, 0, 0,
                              64, len(sections), len(sections) - 1)
    return bytes(image) + b"".join(sections)


class CfaRow(NamedTuple):
    address: int
    cfa: str                # "rsp+8", "x29+16", ...
    rules: dict             # column name -> "c-16", "u", ...


class DecodedFrames(NamedTuple):
    fde_offset: int         # of the FDE in .eh_frame
    pc_begin: int
    pc_end: int
    rows: list              # CfaRow, from readelf --debug-dump=frames-interp
    ra_state_toggles: list  # addresses of DW_CFA_AARCH64_negate_ra_state


FDE_RE = re.compile(r"^([0-9a-f]+) [0-9a-f]+ [0-9a-f]+ FDE cie=[0-9a-f]+ "
                    r"pc=([0-9a-f]+)\.\.([0-9a-f]+)$")


def decode_frames(testcase, elf_path):
    """Decode the single FDE of elf_path's .eh_frame with readelf."""
    readelf = shutil.which("readelf")
    if readelf is None:
        skip_environment("readelf (binutils) is not installed")
    interp = run([readelf, "--debug-dump=frames-interp", elf_path])
    raw = run([readelf, "--debug-dump=frames", elf_path])
    testcase.assertEqual(interp.returncode, 0, interp.stderr)
    testcase.assertEqual(raw.returncode, 0, raw.stderr)
    testcase.assertNotIn("Warning", interp.stderr + raw.stderr)

    fdes = [FDE_RE.match(line.strip()) for line in interp.stdout.splitlines()]
    fdes = [m for m in fdes if m]
    testcase.assertEqual(len(fdes), 1, interp.stdout)
    fde_offset, begin, end = (int(x, 16) for x in fdes[0].groups())
    lines = interp.stdout.split(fdes[0].group(0), 1)[1].splitlines()
    columns = None
    rows = []
    for line in lines:
        words = line.split()
        if not words:
            if columns is not None:
                break
            continue
        if words[0] == "LOC":
            columns = words[2:]
            continue
        rows.append(CfaRow(int(words[0], 16), words[1],
                           dict(zip(columns, words[2:]))))

    toggles = []
    location = None
    in_fde = False
    for line in raw.stdout.splitlines():
        line = line.strip()
        if FDE_RE.match(line):
            in_fde, location = True, begin
        elif in_fde:
            advance = re.match(r"DW_CFA_advance_loc\d?: \d+ to ([0-9a-f]+)",
                               line)
            if advance:
                location = int(advance.group(1), 16)
            elif "negate_ra_state" in line or "window_save" in line:
                toggles.append(location)
            elif not line:
                break
    return DecodedFrames(fde_offset, begin, end, rows, toggles)


# Where objdump's annotations start ("#" prefixes immediates on aarch64).
OBJDUMP_COMMENT = {EM_X86_64: "#", EM_AARCH64: "//"}


def disassemble_functions(testcase, machine, elf_path):
    """[(symbol, [(address, "mnemonic operands")])] of elf_path's code in
    file order, split at objdump's symbol labels (None: code before any)."""
    objdump = gnu_tool(machine, "objdump")
    if objdump is None:
        skip_environment(f"no objdump for ELF machine {machine} "
                          f"({TOOL_PREFIX[machine]}objdump)")
    proc = run([objdump, "-d", "--no-show-raw-insn", elf_path])
    testcase.assertEqual(proc.returncode, 0, proc.stderr)
    functions = [(None, [])]
    for line in proc.stdout.splitlines():
        label = re.match(r"^[0-9a-f]+ <(.+)>:$", line)
        match = re.match(r"^\s*([0-9a-f]+):\s+(\S.*)$", line)
        if label:
            functions.append((label.group(1), []))
        elif match:
            text = match.group(2).split(OBJDUMP_COMMENT[machine])[0]
            functions[-1][1].append((int(match.group(1), 16),
                                     " ".join(text.split())))
    return functions


def disassemble(testcase, machine, elf_path):
    """[(address, size, "mnemonic operands")] of elf_path's .text."""
    insns = [insn for _, code in disassemble_functions(testcase, machine,
                                                       elf_path)
             for insn in code]
    sizes = [b[0] - a[0] for a, b in zip(insns, insns[1:])]
    return [(address, size, text)
            for (address, text), size in zip(insns, sizes + [None])]


class FrameModel:
    """What each template instruction does to the frame, from the
    instruction's semantics -- independent of the C tables."""

    def __init__(self, machine):
        self.machine = machine
        if machine == EM_X86_64:
            self.cfa = ["rsp", 8]
            self.rules = {"ra": "c-8"}      # the return address is pushed
        else:
            self.cfa = ["sp", 0]
            self.rules = {}                 # it lives in x30
        self.toggle = False

    def step(self, text):
        """Apply one instruction; False if the model does not know it."""
        x86 = self.machine == EM_X86_64
        self.toggle = False
        if text in ("endbr64", "bti c", "ret", "retq", "call *%rcx",
                    "callq *%rcx", "blr x3"):
            pass
        elif x86 and text == "push %rbp":
            self.cfa[1] += 8
            self.rules["rbp"] = f"c-{self.cfa[1]}"
        elif x86 and text == "mov %rsp,%rbp":
            self.cfa[0] = "rbp"
        elif x86 and text == "pop %rbp":
            self.cfa = ["rsp", self.cfa[1] - 8]
            del self.rules["rbp"]
        elif text == "stp x29, x30, [sp, #-16]!":
            self.cfa[1] += 16
            self.rules["x29"] = f"c-{self.cfa[1]}"
            self.rules["ra"] = f"c-{self.cfa[1] - 8}"
        elif text == "mov x29, sp":
            self.cfa[0] = "x29"
        elif text == "ldp x29, x30, [sp], #16":
            self.cfa = ["sp", self.cfa[1] - 16]
            del self.rules["x29"], self.rules["ra"]
        elif text in ("paciasp", "autiasp"):
            self.toggle = True
        else:
            return False
        return True

    def cfa_text(self):
        return f"{self.cfa[0]}+{self.cfa[1]}"


# ----------------------------------------------------------------------
# The gdb images' rules: one FDE for many template copies

def uleb128(data, pos):
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7f) << shift
        shift += 7
        if byte < 0x80:
            return value, pos


def sleb128(data, pos):
    start = pos
    value, pos = uleb128(data, pos)
    bits = 7 * (pos - start)
    if value & (1 << (bits - 1)):
        value -= 1 << bits
    return value, pos


def eval_dwarf_expr(expr, regs, stack):
    """Run a DWARF expression with the operations Python/perf_unwind.c
    uses.  regs: DWARF register number -> value.  A dereference gives
    ("mem", address): the tests compare addresses, not memory."""
    pos = 0
    while pos < len(expr):
        op = expr[pos]
        pos += 1
        if 0x70 <= op <= 0x8f or op == 0x92:        # DW_OP_breg*
            if op == 0x92:
                reg, pos = uleb128(expr, pos)
            else:
                reg = op - 0x70
            offset, pos = sleb128(expr, pos)
            stack.append(regs[reg] + offset)
        elif op == 0x0e:                            # DW_OP_const8u
            stack.append(int.from_bytes(expr[pos:pos + 8], "little"))
            pos += 8
        elif op == 0x10:                            # DW_OP_constu
            value, pos = uleb128(expr, pos)
            stack.append(value)
        elif 0x30 <= op <= 0x4f:                    # DW_OP_lit*
            stack.append(op - 0x30)
        elif op == 0x12:                            # DW_OP_dup
            stack.append(stack[-1])
        elif op == 0x13:                            # DW_OP_drop
            stack.pop()
        elif op in (0x1c, 0x1d, 0x2d):              # minus, mod, lt
            b, a = stack.pop(), stack.pop()
            stack.append({0x1c: lambda: (a - b) % 2**64,
                          0x1d: lambda: a % b,
                          0x2d: lambda: int(a < b)}[op]())
        elif op == 0x06:                            # DW_OP_deref
            stack.append(("mem", stack.pop()))
        elif op in (0x28, 0x2f):                    # DW_OP_bra, DW_OP_skip
            offset = int.from_bytes(expr[pos:pos + 2], "little", signed=True)
            pos += 2
            if op == 0x2f or stack.pop() != 0:
                pos += offset
        else:
            raise ValueError(f"unexpected DWARF operation {op:#x}")
    return stack[-1]


def parse_slot_rules(data):
    """(pc_begin, pc_range, {column: expression}) of the FDE after the CIE
    in `data`; the CFA's expression under the key "cfa"."""
    cie_length = int.from_bytes(data[0:4], "little")
    fde = 4 + cie_length
    length = int.from_bytes(data[fde:fde + 4], "little")
    begin, size = struct.unpack_from("<QQ", data, fde + 8)
    aug, pos = uleb128(data, fde + 24)
    pos += aug
    end = fde + 4 + length
    rules = {}
    while pos < end:
        op = data[pos]
        pos += 1
        if op == 0x00:                              # DW_CFA_nop
            continue
        if op == 0x16:                              # DW_CFA_val_expression
            column, pos = uleb128(data, pos)
        elif op == 0x0f:                            # def_cfa_expression
            column = "cfa"
        else:
            raise ValueError(f"unexpected CFA instruction {op:#x}")
        n, pos = uleb128(data, pos)
        rules[column] = data[pos:pos + n]
        pos += n
    return begin, size, rules


def unwind_info_from_c(machine, code):
    """The unwind tables Python/perf_unwind.c makes for `code` (a template
    for ELF machine `machine`), through _testinternalcapi.

    Returns (data, eh_frame_hdr_size) or raises OSError with its errno."""
    return _testinternalcapi.perf_unwind_tables(machine, code)


def running_template():
    """The bytes of this interpreter's trampoline template."""
    return _testinternalcapi.perf_template()


class UnwindCheck:
    """Mixin: check unwinding data against the code it describes."""

    def check_unwind_info(self, machine, code, data, eh_frame_hdr_size):
        with tempfile.TemporaryDirectory() as tmp:
            elf = os.path.join(tmp, "jitted.so")
            with open(elf, "wb") as f:
                f.write(make_elf(machine, code, data, eh_frame_hdr_size))
            frames = decode_frames(self, elf)
            insns = disassemble(self, machine, elf)

        # The FDE covers exactly the code.
        self.assertEqual((frames.pc_begin, frames.pc_end),
                         (TEXT_ADDRESS, TEXT_ADDRESS + len(code)))
        self.assertEqual(insns[0][0], TEXT_ADDRESS)

        # .eh_frame_hdr (LSB): version 1, pc-relative pointer to
        # .eh_frame, one table entry pointing at the code and the FDE.
        eh_frame = TEXT_ADDRESS + align8(len(code))
        hdr_at = len(data) - eh_frame_hdr_size
        self.assertEqual(eh_frame_hdr_size, 20)
        version, ptr_enc, count_enc, table_enc, ptr, count, loc, fde = \
            struct.unpack_from("<BBBBiIii", data, hdr_at)
        self.assertEqual((version, ptr_enc, count_enc, table_enc),
                         (1, 0x1b, 0x03, 0x3b))
        hdr = eh_frame + hdr_at
        self.assertEqual(hdr + 4 + ptr, eh_frame)
        self.assertEqual(count, 1)
        self.assertEqual(hdr + loc, TEXT_ADDRESS)
        self.assertEqual(hdr + fde, eh_frame + frames.fde_offset)

        # The rules at every instruction boundary, against the model.
        model = FrameModel(machine)
        toggles = []
        columns = set(frames.rows[0].rules)
        for address, size, text in insns:
            row = [r for r in frames.rows if r.address <= address][-1]
            with self.subTest(address=hex(address), insn=text):
                self.assertEqual(row.cfa, model.cfa_text())
                for column in columns:
                    self.assertEqual(row.rules[column],
                                     model.rules.get(column, "u"),
                                     f"rule for {column}")
            self.assertTrue(model.step(text),
                            f"the test's frame model does not know "
                            f"{text!r}: update FrameModel")
            if model.toggle:
                toggles.append(address + size)
        self.assertEqual(frames.ra_state_toggles, toggles)
        self.check_slot_rules(machine, code, insns)
        return insns

    def check_slot_rules(self, machine, code, insns):
        """The gdb images' one FDE for many copies of `code`."""
        slot = (len(code) + 15) & ~15
        start = 0x7f1234560010
        data = _testinternalcapi.perf_slot_rules(machine, code, start,
                                                 100 * slot, slot)
        check_slot_fde(self, machine, insns, data, start, 100 * slot, slot)


def check_slot_fde(testcase, machine, insns, data, start, size, slot):
    """`data` holds a CIE and an FDE covering `size` bytes of template
    copies every `slot` bytes from `start` (insns: the template's
    disassembly, at TEXT_ADDRESS).  At every instruction of several slots,
    the FDE's rules must give what the frame model says."""
    x86 = machine == EM_X86_64
    regnum = ({"rsp": 7, "rbp": 6} if x86 else {"sp": 31, "x29": 29})
    fp, ra, pc = (6, 16, 16) if x86 else (29, 30, 32)
    begin, fde_size, rules = parse_slot_rules(data)
    testcase.assertEqual((begin, fde_size), (start, size))
    model = FrameModel(machine)
    signed = False
    count = size // slot
    for address, _, text in insns:
        for k in sorted({0, 1, count // 3, count - 1}):
            regs = {regnum[name]: value for name, value in
                    zip(regnum, (0x7ffd0000, 0x7ffe0000))}
            regs[30] = 0x4444
            regs[pc] = start + k * slot + address - TEXT_ADDRESS
            cfa = regs[regnum[model.cfa[0]]] + model.cfa[1]
            expected = {"cfa": cfa}
            for column, name in ((fp, "rbp" if x86 else "x29"), (ra, "ra")):
                rule = model.rules.get(name)
                expected[column] = (("mem", cfa - int(rule[2:]))
                                    if rule else regs[column])
            if not x86:
                expected[34] = int(signed)
            with testcase.subTest(slot=k, address=hex(address), insn=text):
                got = {"cfa": eval_dwarf_expr(rules["cfa"], regs, [])}
                for column in rules.keys() - {"cfa"}:
                    got[column] = eval_dwarf_expr(rules[column], regs, [cfa])
                if 34 not in rules and not x86:
                    got[34] = 0
                testcase.assertEqual(got, expected)
        model.step(text)
        signed ^= model.toggle


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
        self.check_variant(EM_X86_64, ["-fcf-protection=none"], 8,
                           ["push %rbp"], None)

    def test_x86_64_cet(self):
        self.check_variant(EM_X86_64, ["-fcf-protection=full"], 12,
                           ["endbr64", "push %rbp"],
                           "x86 feature: IBT, SHSTK")

    def test_aarch64(self):
        self.check_variant(EM_AARCH64, ["-mbranch-protection=none"], 20,
                           ["stp x29, x30, [sp, #-16]!"], None)

    def test_aarch64_bti_pac(self):
        self.check_variant(EM_AARCH64, ["-mbranch-protection=standard"], 32,
                           ["bti c", "paciasp"], "AArch64 feature: BTI, PAC")

    def test_aarch64_bti_only(self):
        self.check_variant(EM_AARCH64, ["-mbranch-protection=bti"], 24,
                           ["bti c", "stp x29, x30, [sp, #-16]!"],
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
        self.assertEqual([r.code_index for r in child_loads],
                         list(range(len(child_loads))))
        stamps = [header.timestamp] + [r.timestamp for r in child_records]
        self.assertEqual(stamps, sorted(stamps))
        self.assertTrue(all(isinstance(r, Unwinding)
                            for r in child_records[0::2]))

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

def perf_version():
    """(major, minor) of PERF, or None if it cannot run."""
    try:
        proc = run([PERF, "version"])
    except OSError:
        return None
    match = re.match(r"perf version (\d+)\.(\d+)", proc.stdout)
    return (int(match.group(1)), int(match.group(2))) if match else None


def perf_jit_skip_reason():
    host_tool("perf")
    version = perf_version()
    if version is None:
        return f"{PERF} is not installed (tools/install-deps.sh jit)"
    if version < PERF_JIT_MIN:
        return (f"perf inject --jit needs perf >= 6.8 for DWARF-unwound "
                f"jitdump frames; {PERF} is {version[0]}.{version[1]} "
                f"(tools/install-deps.sh jit installs a newer one)")
    with tempfile.TemporaryDirectory() as tmp:
        proc = run([PERF, "record", "-q", "--no-buildid-cache",
                    "-e", "cpu-clock", "-o", os.path.join(tmp, "perf.data"),
                    "--", "true"], stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            return (f"perf record is not permitted here (exit "
                    f"{proc.returncode}): {proc.stdout.strip()[:200]}")
    return None


@needs_host("perf")
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
        data = os.path.join(self.tmpdir, "perf.data")
        injected = os.path.join(self.tmpdir, "perf.jit.data")
        # perf inject caches the build ids of the ELF files it writes:
        # keep that cache in the test's directory, not in ~/.debug.
        perf = [PERF, "--buildid-dir", os.path.join(self.tmpdir, "debug")]
        env = clean_env()
        record = run([*perf, "record", "-q", "--no-buildid-cache", "-k", "1",
                      "-e", "cpu-clock", "-F", "999",
                      "--call-graph", f"dwarf,{stack_dump}", "-o", data,
                      "--", NOFP_PYTHON, "-X", "perf_jit", path],
                     cwd=self.tmpdir, env=env)
        pid = int(record.stdout.split()[0])
        self.files.add_pid(pid)
        self.addCleanup(self.remove_jitted, pid)
        self.assertEqual(record.returncode, 0, record.stderr)

        inject = run([*perf, "inject", "--jit", "-i", data, "-o", injected],
                     cwd=self.tmpdir, env=env)
        self.assertEqual(inject.returncode, 0, inject.stderr)
        # perf inject writes one ELF per code load beside the dump.
        _, records = read_jitdump(pid)
        loads = sum(isinstance(r, CodeLoad) for r in records)
        self.assertEqual(len(self.jitted(pid)), loads)

        shown = run([*perf, "script", "-i", injected,
                     "-F", "comm,pid,ip,sym"],
                    cwd=self.tmpdir, env=env, stderr=subprocess.DEVNULL)
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

    @staticmethod
    def jitted(pid):
        return glob.glob(os.path.join(os.path.dirname(jitdump_path(pid)),
                                      f"jitted-{pid}-*.so"))

    def remove_jitted(self, pid):
        for path in self.jitted(pid):
            os.unlink(path)


if __name__ == "__main__":
    unittest.main()
