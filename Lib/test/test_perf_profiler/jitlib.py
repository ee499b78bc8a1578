"""Helpers of the perf_jit tests (test_jit, and the modules that check
unwinding or run perf inject): the jitdump parsed, perf inject's ELF
rebuilt, the unwind tables decoded and compared with the template's
instructions, and the perf that can run the perf_jit workflow."""

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

from perf_trampoline._record import PERF_JIT_MIN
from test import support
from test.support import import_helper
from test.test_perf_profiler.util import host_tool, jitdump_path, skip_environment
from typing import NamedTuple


def _testinternalcapi():
    """The module, imported where a test needs it (which then skips
    without it)."""
    return import_helper.import_module("_testinternalcapi")


NOFP_PYTHON = os.environ.get("PERF_NOFP_PYTHON") or sys.executable
PERF = os.environ.get("PERF") or "perf"
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
        """Apply one instruction; False if the model does not know it.
        The CFA follows the stack pointer: the evaluator may move the
        frame pointer to records of its own (Python/ceval.c)."""
        x86 = self.machine == EM_X86_64
        self.toggle = False
        if text in ("endbr64", "bti c", "ret", "retq", "call *%rcx",
                    "callq *%rcx", "blr x3", "mov %rsp,%rbp",
                    "add x29, sp, #0x90", "str x16, [sp, #136]"):
            pass
        elif x86 and re.fullmatch(r"lea 0x[0-9a-f]+\(%rip\),%rax", text):
            pass
        elif not x86 and re.fullmatch(r"adr x16, \w+( <.*>)?", text):
            pass
        elif x86 and text == "push %rbp":
            self.cfa[1] += 8
            self.rules["rbp"] = f"c-{self.cfa[1]}"
        elif x86 and text == "push %rax":
            self.cfa[1] += 8
        elif x86 and text == "sub $0x88,%rsp":
            self.cfa[1] += 136
        elif x86 and text == "add $0x90,%rsp":
            self.cfa[1] -= 144
        elif x86 and text == "pop %rbp":
            self.cfa[1] -= 8
            del self.rules["rbp"]
        elif text == "sub sp, sp, #0xa0":
            self.cfa[1] += 160
        elif text == "add sp, sp, #0xa0":
            self.cfa[1] -= 160
        elif text == "stp x29, x30, [sp, #144]":
            self.rules["x29"] = f"c-{self.cfa[1] - 144}"
            self.rules["ra"] = f"c-{self.cfa[1] - 152}"
        elif text == "ldp x29, x30, [sp, #144]":
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
    return _testinternalcapi().perf_unwind_tables(machine, code)


def running_template():
    """The bytes of this interpreter's trampoline template."""
    return _testinternalcapi().perf_template()


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
        data = _testinternalcapi().perf_slot_rules(machine, code, start,
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


def perf_version():
    """(major, minor) of PERF, or None if it cannot run."""
    try:
        proc = run([PERF, "version"])
    except OSError:
        return None
    match = re.match(r"perf version (\d+)\.(\d+)", proc.stdout)
    return (int(match.group(1)), int(match.group(2))) if match else None


def jitted_files(pid):
    """The ELF files perf inject --jit wrote for process `pid`'s code,
    beside its dump."""
    return glob.glob(os.path.join(os.path.dirname(jitdump_path(pid)),
                                  f"jitted-{pid}-*.so"))


def record_jit(args, directory, *, env, stack_dump=8192,
               fields=("-F", "comm,pid,ip,sym")):
    """The perf_jit workflow: run `args` under perf record --call-graph
    dwarf (perf copies `stack_dump` bytes of stack per sample: deeper
    frames cannot be unwound), perf inject --jit, perf script `fields`.
    Files go to `directory` (perf inject's build-id cache too, not
    ~/.debug).  Returns the three CompletedProcesses; one that failed
    ends the workflow (None for the steps after it)."""
    data = os.path.join(directory, "perf.data")
    injected = os.path.join(directory, "perf.jit.data")
    perf = [PERF, "--buildid-dir", os.path.join(directory, "debug")]
    record = run([*perf, "record", "-q", "--no-buildid-cache", "-k", "1",
                  "-e", "cpu-clock", "-F", "999",
                  "--call-graph", f"dwarf,{stack_dump}", "-o", data,
                  "--", *args], cwd=directory, env=env)
    if record.returncode != 0:
        return record, None, None
    inject = run([*perf, "inject", "--jit", "-i", data, "-o", injected],
                 cwd=directory, env=env)
    if inject.returncode != 0:
        return record, inject, None
    script = run([*perf, "script", "-i", injected, *fields],
                 cwd=directory, env=env, stderr=subprocess.DEVNULL)
    return record, inject, script


def perf_jit_skip_reason():
    host_tool("perf")
    version = perf_version()
    if version is None:
        return f"{PERF} is not installed (tools/install-deps.sh jit)"
    if version < PERF_JIT_MIN:
        oldest = ".".join(map(str, PERF_JIT_MIN))
        return (f"perf inject --jit needs perf >= {oldest} for "
                f"DWARF-unwound jitdump frames; {PERF} is "
                f"{version[0]}.{version[1]} (tools/install-deps.sh jit "
                f"installs a newer one)")
    with tempfile.TemporaryDirectory() as tmp:
        proc = run([PERF, "record", "-q", "--no-buildid-cache",
                    "-e", "cpu-clock", "-o", os.path.join(tmp, "perf.data"),
                    "--", "true"], stderr=subprocess.STDOUT)
        if proc.returncode != 0:
            return (f"perf record is not permitted here (exit "
                    f"{proc.returncode}): {proc.stdout.strip()[:200]}")
    return None
