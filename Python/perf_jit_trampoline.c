/*
 * The perf_jit backend: trampolines described in a jitdump file
 * ==============================================================
 *
 * Why.  The perf map backend (Python/perf_trampoline.c) only names address
 * ranges; perf finds the trampolines on the stack by walking frame
 * pointers, so every C function between two Python frames must keep one.
 * Many interpreters are built without frame pointers, and there perf's
 * other unwinder, `perf record --call-graph dwarf`, is the one that works:
 * it copies a slice of the user stack with each sample and unwinds it
 * afterwards with DWARF call frame information (CFI).  The interpreter's
 * own functions have CFI in its .eh_frame; trampolines are made at run time
 * and have none.  This backend supplies it.
 *
 * How.  perf's jitdump format (tools/perf/Documentation/
 * jitdump-specification.txt) lets a JIT write, for every piece of code,
 * its name, address, bytes and unwind tables to /tmp/jit-<pid>.dump.  The
 * process maps the first page of that file executable so that `perf
 * record` sees an mmap of it; `perf inject --jit` later finds that event,
 * reads the dump and turns every code load into a small ELF file
 * (jitted-<pid>-<index>.so: .text, .eh_frame, .eh_frame_hdr, a symbol)
 * plus an mmap event placing it at the code's address.  Reports made from
 * the injected perf.data then unwind through trampolines like through any
 * shared library:
 *
 *     perf record -k 1 --call-graph dwarf ./python -X perf_jit app.py
 *     perf inject --jit -i perf.data -o perf.jit.data
 *     perf report -i perf.jit.data
 *
 * (-k 1: timestamps from CLOCK_MONOTONIC, the clock of our records.)
 *
 * The file.  All fields in host byte order:
 *
 *     +-------------------------------------------------------------+
 *     | header: magic "JiTD" 0x4A695444, version 1, header size,   |
 *     |         ELF machine, pad, pid, timestamp, flags (40 bytes)  |
 *     +-------------------------------------------------------------+
 *     | JIT_CODE_UNWINDING_INFO       } for each trampoline, in the |
 *     |   prefix (id 4, size, time)   } order they were made, one  |
 *     |   unwinding size, .eh_frame_hdr size, mapped size          |
 *     |   .eh_frame: CIE, FDE, terminator                          |
 *     |   .eh_frame_hdr: pointers + a one-entry search table       |
 *     | JIT_CODE_LOAD                 } write() for both records   |
 *     |   prefix (id 0, size, time)                                 |
 *     |   pid, tid, vma, code address, code size, code index       |
 *     |   name "py::qualname:filename\0", then the code's bytes    |
 *     +-------------------------------------------------------------+
 *     | ...                                                         |
 *
 * perf applies an unwinding record to the code load that follows it.  The
 * specification says the unwinding data starts with the .eh_frame_hdr;
 * perf (genelf.c) reads it the other way round, .eh_frame first, and perf
 * is what we write for.
 *
 * The unwind tables.  perf's ELF places .eh_frame right after .text,
 * rounded up to 8 bytes, and .eh_frame_hdr right after .eh_frame:
 *
 *     ELF address:   T             T + A             T + A + E
 *                    | code (size) | pad | .eh_frame   | .eh_frame_hdr |
 *
 * with A = ALIGN_8(code size) and E = size of our .eh_frame (T, the text
 * offset, is a multiple of 16 in every perf version).  All pointers in the
 * tables are relative (pc-relative or relative to .eh_frame_hdr), so the
 * tables depend only on the code size: they are built once, at init.
 *
 * Their rules must match the template (Python/asm_trampoline.S)
 * instruction by instruction.  Which instructions the template holds
 * depends on the compiler flags (endbr64 under -fcf-protection; bti and
 * paciasp/autiasp under -mbranch-protection), so the description is not
 * written by hand per variant: the template's bytes are matched against a
 * per-architecture table of the instructions it may contain, each with its
 * effect on the frame, and the CFA program is generated from the matches.
 * A template that does not match (someone edited the assembly without
 * updating the table) disables this backend with an error instead of
 * emitting wrong unwind information.  Both tables are compiled on both
 * architectures, so tests on one machine check the other's description
 * through _PyPerfJit_BuildUnwindInfo().  The CFA programs made here also
 * describe the trampolines to gdb (Python/perf_gdb_jit.c, through
 * _PyPerf_DescribeTemplate()): one description, two containers.
 *
 * Everything here runs with the GIL held.
 */

#include "Python.h"
#include "pycore_ceval.h"         // _PyPerf_Backend

#ifdef PY_HAVE_PERF_JIT_TRAMPOLINE

#include <errno.h>
#include <fcntl.h>                // open()
#include <stddef.h>               // offsetof()
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>             // mmap()
#include <sys/syscall.h>          // SYS_gettid
#include <time.h>                 // clock_gettime()
#include <unistd.h>               // pread(), getpid(), sysconf()

/* ----------------------------------------------------------------------
 * Constants
 */

/* jitdump (perf's jitdump-specification.txt) */
#define JITDUMP_MAGIC               0x4A695444u     /* "JiTD" */
#define JITDUMP_VERSION             1
#define JIT_CODE_LOAD               0
#define JIT_CODE_UNWINDING_INFO     4

/* ELF e_machine values (elf.h) */
#define ELF_MACHINE_X86_64          62
#define ELF_MACHINE_AARCH64         183

#if defined(__x86_64__)
#  define HOST_MACHINE ELF_MACHINE_X86_64
#elif defined(__aarch64__) && defined(__AARCH64EL__) && !defined(__ILP32__)
#  define HOST_MACHINE ELF_MACHINE_AARCH64
#else
#  error "perf_jit: no unwind description for this architecture"
#endif

/* DWARF call frame instructions (DWARF 5, section 6.4.2) */
#define DW_CFA_nop                  0x00
#define DW_CFA_advance_loc1         0x02
#define DW_CFA_def_cfa              0x0c
#define DW_CFA_def_cfa_register     0x0d
#define DW_CFA_def_cfa_offset       0x0e
#define DW_CFA_AARCH64_negate_ra_state 0x2d
#define DW_CFA_advance_loc          0x40    /* | delta (6 bits) */
#define DW_CFA_offset               0x80    /* | register (6 bits) */
#define DW_CFA_restore              0xc0    /* | register (6 bits) */

/* Pointer encodings of .eh_frame and .eh_frame_hdr (LSB) */
#define DW_EH_PE_udata4             0x03
#define DW_EH_PE_sdata4             0x0b
#define DW_EH_PE_pcrel              0x10
#define DW_EH_PE_datarel            0x30

/* Where perf puts .eh_frame relative to the code (see above). */
#define EH_FRAME_DISTANCE(code_size) _Py_SIZE_ROUND_UP((code_size), 8)

/* Bounds for the buffers below; init refuses a larger template. */
#define MAX_TEMPLATE_SIZE           64
#define MAX_UNWIND_SIZE             256

/* ----------------------------------------------------------------------
 * The template, instruction by instruction
 */

/* What an instruction of the template does to the frame, from the end of
   that instruction on. */
typedef enum {
    STEP_NONE,          /* nothing (landing pads, the call, the return) */
    STEP_PUSH_FRAME,    /* the frame record (fp, return address) is stored
                           below the CFA and sp points at it */
    STEP_SET_FP,        /* fp = sp: the CFA follows fp from here on */
    STEP_POP_FRAME,     /* the frame record is reloaded, sp is back where
                           it was at entry */
    STEP_TOGGLE_RA_SIGNED,  /* aarch64 pointer authentication: the return
                               address in x30 is signed / authenticated */
} template_step;

typedef struct {
    uint8_t bytes[4];           /* encoding, in memory order */
    uint8_t size;
    uint8_t optional;           /* present only under some compiler flags */
    uint8_t step;               /* template_step */
    const char *text;           /* assembly, for error messages */
} template_insn;

/* How an architecture's template and CFI look. */
typedef struct {
    uint32_t elf_machine;
    uint8_t code_align;         /* CIE code alignment factor */
    int8_t data_align;          /* CIE data alignment factor */
    uint8_t ra_column;          /* DWARF column of the return address */
    uint8_t sp_reg;             /* DWARF numbers of sp and fp */
    uint8_t fp_reg;
    uint8_t entry_cfa_offset;   /* CFA - sp at the first instruction */
    uint8_t frame_record_size;  /* bytes the frame record push takes */
    uint8_t push_saves_ra;      /* the frame record holds the return
                                   address register (aarch64's x30) */
    const template_insn *insns; /* the template's possible instructions */
    size_t insn_count;
} unwind_arch;

/* Python/asm_trampoline.S, x86_64.  At entry the return address is at
   sp, so CFA = rsp + 8 and the return address is at CFA - 8. */
static const template_insn x86_64_insns[] = {
    {{0xf3, 0x0f, 0x1e, 0xfa}, 4, 1, STEP_NONE, "endbr64"},
    {{0x55}, 1, 0, STEP_PUSH_FRAME, "push %rbp"},
    {{0x48, 0x89, 0xe5}, 3, 0, STEP_SET_FP, "mov %rsp, %rbp"},
    {{0xff, 0xd1}, 2, 0, STEP_NONE, "call *%rcx"},
    {{0x5d}, 1, 0, STEP_POP_FRAME, "pop %rbp"},
    {{0xc3}, 1, 0, STEP_NONE, "ret"},
};

static const unwind_arch x86_64_arch = {
    .elf_machine = ELF_MACHINE_X86_64,
    .code_align = 1,
    .data_align = -8,
    .ra_column = 16,            /* the return address "register" */
    .sp_reg = 7,                /* %rsp */
    .fp_reg = 6,                /* %rbp */
    .entry_cfa_offset = 8,
    .frame_record_size = 8,     /* push %rbp: the return address is
                                   already on the stack */
    .push_saves_ra = 0,
    .insns = x86_64_insns,
    .insn_count = Py_ARRAY_LENGTH(x86_64_insns),
};

/* Python/asm_trampoline.S, aarch64 (little-endian words).  At entry
   CFA = sp and the return address is in x30. */
static const template_insn aarch64_insns[] = {
    {{0x5f, 0x24, 0x03, 0xd5}, 4, 1, STEP_NONE, "bti c"},
    {{0x3f, 0x23, 0x03, 0xd5}, 4, 1, STEP_TOGGLE_RA_SIGNED, "paciasp"},
    {{0xfd, 0x7b, 0xbf, 0xa9}, 4, 0, STEP_PUSH_FRAME,
     "stp x29, x30, [sp, #-16]!"},
    {{0xfd, 0x03, 0x00, 0x91}, 4, 0, STEP_SET_FP, "mov x29, sp"},
    {{0x60, 0x00, 0x3f, 0xd6}, 4, 0, STEP_NONE, "blr x3"},
    {{0xfd, 0x7b, 0xc1, 0xa8}, 4, 0, STEP_POP_FRAME,
     "ldp x29, x30, [sp], #16"},
    {{0xbf, 0x23, 0x03, 0xd5}, 4, 1, STEP_TOGGLE_RA_SIGNED, "autiasp"},
    {{0xc0, 0x03, 0x5f, 0xd6}, 4, 0, STEP_NONE, "ret"},
};

static const unwind_arch aarch64_arch = {
    .elf_machine = ELF_MACHINE_AARCH64,
    .code_align = 4,
    .data_align = -8,
    .ra_column = 30,            /* x30, the link register */
    .sp_reg = 31,
    .fp_reg = 29,
    .entry_cfa_offset = 0,
    .frame_record_size = 16,    /* x29 and x30 */
    .push_saves_ra = 1,
    .insns = aarch64_insns,
    .insn_count = Py_ARRAY_LENGTH(aarch64_insns),
};

/* A point where the frame changes: after the instruction ending at
   `offset`, `step` holds. */
typedef struct {
    size_t offset;
    template_step step;
} frame_change;

/* Match `code` against the architecture's instruction table, in order;
   optional instructions may be absent.  Fills `changes` (room for
   arch->insn_count entries) and returns their number, or -1 with errno
   ENOEXEC (and a warning naming the offset) if the code does not match. */
static Py_ssize_t
match_template(const unwind_arch *arch, const uint8_t *code,
               size_t code_size, frame_change *changes, int warn)
{
    size_t pos = 0;
    Py_ssize_t n = 0;
    int ra_signed = 0;
    for (size_t i = 0; i < arch->insn_count; i++) {
        const template_insn *insn = &arch->insns[i];
        if (pos + insn->size <= code_size
            && memcmp(code + pos, insn->bytes, insn->size) == 0)
        {
            pos += insn->size;
            if (insn->step != STEP_NONE) {
                changes[n].offset = pos;
                changes[n].step = (template_step)insn->step;
                n++;
            }
            if (insn->step == STEP_TOGGLE_RA_SIGNED) {
                ra_signed = !ra_signed;
            }
        }
        else if (!insn->optional) {
            if (warn) {
                _PyPerf_Warn("perf_jit: the trampoline template does not "
                             "match its unwind description: expected '%s' "
                             "at byte %zu", insn->text, pos);
            }
            errno = ENOEXEC;
            return -1;
        }
    }
    if (pos != code_size || ra_signed) {
        if (warn) {
            _PyPerf_Warn("perf_jit: the trampoline template does not match "
                         "its unwind description: %s at byte %zu",
                         ra_signed ? "return address left signed"
                                   : "unexpected bytes", pos);
        }
        errno = ENOEXEC;
        return -1;
    }
    return n;
}

/* ----------------------------------------------------------------------
 * DWARF emission
 *
 * A bounded output buffer and one helper per encoding.  Overflow is
 * remembered and checked once at the end.
 */

typedef struct {
    uint8_t *start;
    size_t size;
    size_t pos;
    int overflow;
} dwbuf;

static void
emit_u8(dwbuf *b, uint8_t v)
{
    if (b->pos < b->size) {
        b->start[b->pos] = v;
    }
    else {
        b->overflow = 1;
    }
    b->pos++;
}

/* Both supported targets are little-endian. */
static void
emit_u32(dwbuf *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        emit_u8(b, (uint8_t)(v >> (8 * i)));
    }
}

static void
emit_s32(dwbuf *b, int32_t v)
{
    emit_u32(b, (uint32_t)v);
}

static void
emit_uleb128(dwbuf *b, uint64_t v)
{
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        emit_u8(b, v != 0 ? (byte | 0x80) : byte);
    } while (v != 0);
}

static void
emit_sleb128(dwbuf *b, int64_t v)
{
    for (;;) {
        uint8_t byte = v & 0x7f;
        v >>= 7;    /* arithmetic shift: keeps the sign */
        int done = (v == 0 && !(byte & 0x40)) || (v == -1 && (byte & 0x40));
        emit_u8(b, done ? byte : (byte | 0x80));
        if (done) {
            return;
        }
    }
}

static void
patch_u32(dwbuf *b, size_t at, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        if (at + i < b->size) {
            b->start[at + i] = (uint8_t)(v >> (8 * i));
        }
    }
}

/* A length-prefixed block (a CIE or an FDE): reserve the 4-byte length,
   return where it is. */
static size_t
begin_block(dwbuf *b)
{
    size_t at = b->pos;
    emit_u32(b, 0);
    return at;
}

/* Pad the block with DW_CFA_nop to a multiple of 8 bytes (the length
   field included, as assemblers do for 64-bit targets), then store its
   length, which does not count the length field itself. */
static void
end_block(dwbuf *b, size_t at)
{
    while ((b->pos - at) % 8 != 0) {
        emit_u8(b, DW_CFA_nop);
    }
    patch_u32(b, at, (uint32_t)(b->pos - at - 4));
}

/* Move the location to `offset` bytes into the code. */
static void
emit_advance(dwbuf *b, const unwind_arch *arch, size_t *loc, size_t offset)
{
    assert(offset >= *loc && (offset - *loc) % arch->code_align == 0);
    size_t delta = (offset - *loc) / arch->code_align;
    if (delta == 0) {
        return;
    }
    if (delta < 0x40) {
        /* DW_CFA_advance_loc: delta in the low 6 bits */
        emit_u8(b, DW_CFA_advance_loc | (uint8_t)delta);
    }
    else {
        /* DW_CFA_advance_loc1: delta in the next byte */
        assert(delta <= 0xff);
        emit_u8(b, DW_CFA_advance_loc1);
        emit_u8(b, (uint8_t)delta);
    }
    *loc = offset;
}

/* The rules that hold after one frame change.  `factored` turns a byte
   distance below the CFA into DW_CFA_offset's operand. */
static void
emit_frame_change(dwbuf *b, const unwind_arch *arch, template_step step)
{
#define FACTORED(bytes_below_cfa) \
    ((uint64_t)((bytes_below_cfa) / -arch->data_align))
    unsigned frame_top = arch->entry_cfa_offset + arch->frame_record_size;
    switch (step) {
    case STEP_PUSH_FRAME:
        /* DW_CFA_def_cfa_offset: CFA = sp + frame_top (register kept) */
        emit_u8(b, DW_CFA_def_cfa_offset);
        emit_uleb128(b, frame_top);
        /* DW_CFA_offset: the caller's fp is saved at the bottom of the
           record, CFA - frame_top */
        emit_u8(b, DW_CFA_offset | arch->fp_reg);
        emit_uleb128(b, FACTORED(frame_top));
        if (arch->push_saves_ra) {
            /* DW_CFA_offset: the return address register is saved right
               above it */
            emit_u8(b, DW_CFA_offset | arch->ra_column);
            emit_uleb128(b, FACTORED(frame_top - 8));
        }
        break;
    case STEP_SET_FP:
        /* DW_CFA_def_cfa_register: CFA = fp + frame_top; sp may move
           from here on without changing the rules */
        emit_u8(b, DW_CFA_def_cfa_register);
        emit_uleb128(b, arch->fp_reg);
        break;
    case STEP_POP_FRAME:
        /* DW_CFA_def_cfa: CFA = sp + entry offset, as at the first
           instruction */
        emit_u8(b, DW_CFA_def_cfa);
        emit_uleb128(b, arch->sp_reg);
        emit_uleb128(b, arch->entry_cfa_offset);
        /* DW_CFA_restore: fp holds the caller's value again */
        emit_u8(b, DW_CFA_restore | arch->fp_reg);
        if (arch->push_saves_ra) {
            /* DW_CFA_restore: so does the return address register */
            emit_u8(b, DW_CFA_restore | arch->ra_column);
        }
        break;
    case STEP_TOGGLE_RA_SIGNED:
        /* DW_CFA_AARCH64_negate_ra_state: the return address is now
           signed (after paciasp) or plain again (after autiasp) */
        emit_u8(b, DW_CFA_AARCH64_negate_ra_state);
        break;
    case STEP_NONE:
        break;
    }
#undef FACTORED
}

/* The two CFA programs for `code` (a copy of the template) on `arch`:
   the CIE's initial instructions (the rules at the first byte) and the
   FDE's instructions (how they change, instruction by instruction).  The
   jitdump below and the gdb JIT images (Python/perf_gdb_jit.c) wrap them
   in their own CIE and FDE.  Returns 0, or -1 with errno set if the code
   is not the template (ENOEXEC). */
static int
describe_template(const unwind_arch *arch, const uint8_t *code,
                  size_t code_size, _PyPerf_TemplateCFI *cfi, int warn)
{
    frame_change changes[16];
    assert(arch->insn_count <= Py_ARRAY_LENGTH(changes));
    Py_ssize_t nchanges = match_template(arch, code, code_size, changes,
                                         warn);
    if (nchanges < 0) {
        return -1;
    }
    cfi->code_size = code_size;
    cfi->code_align = arch->code_align;
    cfi->data_align = arch->data_align;
    cfi->ra_column = arch->ra_column;

    dwbuf b = {.start = cfi->initial, .size = sizeof(cfi->initial)};
    /* DW_CFA_def_cfa: CFA = sp + entry offset */
    emit_u8(&b, DW_CFA_def_cfa);
    emit_uleb128(&b, arch->sp_reg);
    emit_uleb128(&b, arch->entry_cfa_offset);
    if (!arch->push_saves_ra) {
        /* DW_CFA_offset: the return address is on the stack, at CFA - 8 */
        emit_u8(&b, DW_CFA_offset | arch->ra_column);
        emit_uleb128(&b, 8 / -arch->data_align);
    }
    cfi->initial_size = b.pos;
    int overflow = b.overflow;

    b = (dwbuf){.start = cfi->program, .size = sizeof(cfi->program)};
    size_t loc = 0;
    for (Py_ssize_t i = 0; i < nchanges; i++) {
        emit_advance(&b, arch, &loc, changes[i].offset);
        emit_frame_change(&b, arch, changes[i].step);
    }
    cfi->program_size = b.pos;
    if (overflow || b.overflow) {
        errno = ENOSPC;
        return -1;
    }
    return 0;
}

static void
emit_bytes(dwbuf *b, const uint8_t *bytes, size_t size)
{
    for (size_t i = 0; i < size; i++) {
        emit_u8(b, bytes[i]);
    }
}

/* Build the unwinding data for `code` (a copy of the template) into buf:
   .eh_frame (CIE, FDE, terminator) then .eh_frame_hdr.  Returns the total
   size and stores the .eh_frame_hdr size in *hdr_size; -1 with errno set
   if the code is not the template or buf is too small. */
static Py_ssize_t
build_unwind_info(const unwind_arch *arch, const uint8_t *code,
                  size_t code_size, uint8_t *buf, size_t buf_size,
                  size_t *hdr_size, int warn)
{
    _PyPerf_TemplateCFI cfi;
    if (describe_template(arch, code, code_size, &cfi, warn) < 0) {
        return -1;
    }
    dwbuf b = {.start = buf, .size = buf_size};

    /* .eh_frame, CIE: what holds at the first instruction. */
    size_t cie = begin_block(&b);
    emit_u32(&b, 0);                    /* CIE id */
    emit_u8(&b, 1);                     /* version */
    emit_u8(&b, 'z');                   /* augmentation "zR": */
    emit_u8(&b, 'R');                   /*   FDE pointer encoding follows */
    emit_u8(&b, 0);
    emit_uleb128(&b, cfi.code_align);
    emit_sleb128(&b, cfi.data_align);
    emit_u8(&b, (uint8_t)cfi.ra_column);    /* (a byte in version 1) */
    emit_uleb128(&b, 1);                /* augmentation data size */
    emit_u8(&b, DW_EH_PE_pcrel | DW_EH_PE_sdata4);
    emit_bytes(&b, cfi.initial, cfi.initial_size);
    end_block(&b, cie);

    /* .eh_frame, FDE: the template's own rules, change by change. */
    size_t fde = begin_block(&b);
    emit_u32(&b, (uint32_t)(b.pos - cie));      /* back to the CIE */
    /* pc_begin, pc-relative: the code sits EH_FRAME_DISTANCE bytes before
       .eh_frame in perf's ELF */
    emit_s32(&b, -(int32_t)(EH_FRAME_DISTANCE(code_size) + b.pos));
    emit_u32(&b, (uint32_t)code_size);          /* pc_range */
    emit_uleb128(&b, 0);                        /* augmentation data size */
    emit_bytes(&b, cfi.program, cfi.program_size);
    end_block(&b, fde);
    emit_u32(&b, 0);                    /* terminator: a zero length */
    size_t eh_frame_size = b.pos;

    /* .eh_frame_hdr: lets an unwinder find the FDE by address. */
    size_t hdr = b.pos;
    emit_u8(&b, 1);                                     /* version */
    emit_u8(&b, DW_EH_PE_pcrel | DW_EH_PE_sdata4);      /* eh_frame_ptr */
    emit_u8(&b, DW_EH_PE_udata4);                       /* fde_count */
    emit_u8(&b, DW_EH_PE_datarel | DW_EH_PE_sdata4);    /* table */
    /* eh_frame_ptr: .eh_frame's start, relative to this field */
    emit_s32(&b, -(int32_t)b.pos);
    emit_u32(&b, 1);                                    /* fde_count */
    /* The table, relative to .eh_frame_hdr: the code's start ... */
    emit_s32(&b, -(int32_t)(EH_FRAME_DISTANCE(code_size) + eh_frame_size));
    /* ... and its FDE. */
    emit_s32(&b, (int32_t)fde - (int32_t)hdr);

    if (b.overflow) {
        errno = ENOSPC;
        return -1;
    }
    *hdr_size = b.pos - hdr;
    return (Py_ssize_t)b.pos;
}

/* For tests, through ctypes: the unwinding data this backend would write
   for `code` on the machine `elf_machine` (62: x86_64, 183: aarch64),
   whatever the host.  Same results as build_unwind_info(); errno EINVAL
   for an unknown machine. */
PyAPI_FUNC(Py_ssize_t) _PyPerfJit_BuildUnwindInfo(
    unsigned int elf_machine, const void *code, size_t code_size,
    void *buf, size_t buf_size, size_t *hdr_size);

Py_ssize_t
_PyPerfJit_BuildUnwindInfo(unsigned int elf_machine, const void *code,
                           size_t code_size, void *buf, size_t buf_size,
                           size_t *hdr_size)
{
    const unwind_arch *arch;
    switch (elf_machine) {
    case ELF_MACHINE_X86_64:
        arch = &x86_64_arch;
        break;
    case ELF_MACHINE_AARCH64:
        arch = &aarch64_arch;
        break;
    default:
        errno = EINVAL;
        return -1;
    }
    return build_unwind_info(arch, code, code_size, buf, buf_size,
                             hdr_size, 0);
}

/* ----------------------------------------------------------------------
 * Records
 */

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint32_t total_size;        /* of this header */
    uint32_t elf_mach;
    uint32_t pad1;
    uint32_t pid;
    uint64_t timestamp;
    uint64_t flags;             /* 0: timestamps are CLOCK_MONOTONIC */
} jitdump_header;

typedef struct {
    uint32_t id;                /* JIT_CODE_* */
    uint32_t total_size;        /* of the record, this prefix included */
    uint64_t timestamp;
} record_prefix;

typedef struct {
    record_prefix p;            /* id JIT_CODE_UNWINDING_INFO */
    uint64_t unwinding_size;    /* .eh_frame + .eh_frame_hdr */
    uint64_t eh_frame_hdr_size;
    uint64_t mapped_size;       /* of the unwinding data in memory */
    /* followed by: .eh_frame, .eh_frame_hdr, zero padding to 8 */
} unwinding_record;

typedef struct {
    record_prefix p;            /* id JIT_CODE_LOAD */
    uint32_t pid;
    uint32_t tid;
    uint64_t vma;               /* = code_addr */
    uint64_t code_addr;
    uint64_t code_size;
    uint64_t code_index;        /* unique in the file, increasing */
    /* followed by: the name and a NUL, then code_size bytes of code
       (perf finds the code at the record's end: no padding) */
} code_load_record;

_Static_assert(sizeof(jitdump_header) == 40, "jitdump header layout");
_Static_assert(sizeof(record_prefix) == 16, "jitdump prefix layout");
_Static_assert(sizeof(unwinding_record) == 40, "unwinding record layout");
_Static_assert(sizeof(code_load_record) == 56, "code load record layout");

/* ----------------------------------------------------------------------
 * State
 */

typedef enum {
    JIT_STATUS_NO_INIT,         /* unwind data not built yet */
    JIT_STATUS_OK,
    JIT_STATUS_FAILED,          /* the template cannot be described */
} jit_status;

static struct {
    jit_status status;
    int saved_errno;            /* why status is FAILED */
    size_t code_size;           /* the template's size */
    uint8_t unwind[MAX_UNWIND_SIZE];    /* .eh_frame + .eh_frame_hdr */
    size_t unwind_size;
    size_t eh_frame_hdr_size;
    _PyPerf_File file;          /* /tmp/jit-<pid>.dump */
    void *marker;               /* the file's first page, mapped PROT_EXEC */
    size_t marker_size;
    uint64_t code_index;        /* of the next code load */
} jit = {.file = {.fd = -1}};

extern char _Py_trampoline_func_start[];
extern char _Py_trampoline_func_end[];

static uint64_t
monotonic_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static uint32_t
current_tid(void)
{
    return (uint32_t)syscall(SYS_gettid);
}

static const unwind_arch *
host_arch(void)
{
    return HOST_MACHINE == ELF_MACHINE_X86_64 ? &x86_64_arch : &aarch64_arch;
}

/* Describe the template once; the answer is kept. */
static int
init_unwind_info(void)
{
    if (jit.status == JIT_STATUS_NO_INIT) {
        const unwind_arch *arch = host_arch();
        size_t code_size = _Py_trampoline_func_end
                           - _Py_trampoline_func_start;
        Py_ssize_t n = -1;
        if (code_size > MAX_TEMPLATE_SIZE) {
            errno = EFBIG;
        }
        else {
            n = build_unwind_info(arch,
                                  (const uint8_t *)_Py_trampoline_func_start,
                                  code_size, jit.unwind, sizeof(jit.unwind),
                                  &jit.eh_frame_hdr_size, 1);
        }
        if (n < 0) {
            jit.status = JIT_STATUS_FAILED;
            jit.saved_errno = errno;
        }
        else {
            jit.status = JIT_STATUS_OK;
            jit.code_size = code_size;
            jit.unwind_size = (size_t)n;
        }
    }
    if (jit.status == JIT_STATUS_FAILED) {
        errno = jit.saved_errno;
        return -1;
    }
    return 0;
}

/* The running template's CFA programs, for Python/perf_gdb_jit.c.  No
   warning here: that file's tables are a silent extra, and this backend
   warns about a template it cannot describe when it is activated. */
int
_PyPerf_DescribeTemplate(_PyPerf_TemplateCFI *cfi)
{
    return describe_template(host_arch(),
                             (const uint8_t *)_Py_trampoline_func_start,
                             _Py_trampoline_func_end
                             - _Py_trampoline_func_start, cfi, 0);
}

/* ----------------------------------------------------------------------
 * The file
 */

/* Map the file's first page executable: perf record logs the mmap, and
   that event is how perf inject finds the dump.  The descriptor we write
   through is write-only, so map through a read-only one. */
static int
map_marker(void)
{
    int rfd = _PyPerf_FileOpenReadOnly(&jit.file);
    if (rfd < 0) {
        return -1;
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t size = page > 0 ? (size_t)page : 4096;
    void *mem = mmap(NULL, size, PROT_READ | PROT_EXEC, MAP_PRIVATE, rfd, 0);
    int saved = errno;
    close(rfd);
    if (mem == MAP_FAILED) {
        errno = saved;
        return -1;
    }
    jit.marker = mem;
    jit.marker_size = size;
    return 0;
}

static void
unmap_marker(void)
{
    if (jit.marker != NULL) {
        (void)munmap(jit.marker, jit.marker_size);
        jit.marker = NULL;
    }
}

/* Create this process's dump: the header, and the marker mapping. */
static int
open_dump(char *path, size_t path_size)
{
    PyOS_snprintf(path, path_size, "/tmp/jit-%ld.dump", (long)getpid());
    if (_PyPerf_FileOpen(&jit.file, path) < 0) {
        return -1;
    }
    jitdump_header header = {
        .magic = JITDUMP_MAGIC,
        .version = JITDUMP_VERSION,
        .total_size = sizeof(header),
        .elf_mach = HOST_MACHINE,
        .pid = (uint32_t)getpid(),
        .timestamp = monotonic_ns(),
    };
    if (_PyPerf_FileAppend(&jit.file, &header, sizeof(header)) < 0
        || map_marker() < 0)
    {
        int saved = errno;
        _PyPerf_FileForget(&jit.file);
        errno = saved;
        return -1;
    }
    return 0;
}

/* Read exactly `size` bytes at `offset`. */
static int
read_exact(int fd, void *buf, size_t size, off_t offset)
{
    char *p = buf;
    while (size > 0) {
        ssize_t n = pread(fd, p, size, offset);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            if (n == 0) {
                errno = EIO;
            }
            return -1;
        }
        p += n;
        size -= (size_t)n;
        offset += n;
    }
    return 0;
}

/* Largest record we write: a code load with the longest name. */
#define MAX_RECORD_SIZE \
    (sizeof(code_load_record) + _PyPerf_MAX_NAME + 1 + MAX_TEMPLATE_SIZE)

/* In a forked child: copy the parent's records (from the parent's file,
   up to `end`) into ours.  They become the child's: its pid and tid in
   every code load, and the time of the copy, which follows the fork, so
   perf places the child's mappings after it created the child. */
static int
copy_parent_records(const _PyPerf_File *parent, off_t end)
{
    int in = _PyPerf_FileOpenReadOnly(parent);
    if (in < 0) {
        return -1;
    }
    static char record[MAX_RECORD_SIZE];
    uint32_t pid = (uint32_t)getpid();
    uint32_t tid = current_tid();
    uint64_t now = monotonic_ns();
    off_t offset = sizeof(jitdump_header);
    while (offset < end) {
        record_prefix prefix;
        if (read_exact(in, &prefix, sizeof(prefix), offset) < 0) {
            goto error;
        }
        if (prefix.total_size < sizeof(prefix)
            || prefix.total_size > sizeof(record)
            || offset + (off_t)prefix.total_size > end)
        {
            errno = EIO;        /* not a file we wrote */
            goto error;
        }
        if (read_exact(in, record, prefix.total_size, offset) < 0) {
            goto error;
        }
        /* (memcpy: the buffer has no particular alignment) */
        memcpy(record + offsetof(record_prefix, timestamp), &now,
               sizeof(now));
        if (prefix.id == JIT_CODE_LOAD) {
            memcpy(record + offsetof(code_load_record, pid), &pid,
                   sizeof(pid));
            memcpy(record + offsetof(code_load_record, tid), &tid,
                   sizeof(tid));
        }
        if (_PyPerf_FileAppend(&jit.file, record, prefix.total_size) < 0) {
            goto error;
        }
        offset += prefix.total_size;
    }
    close(in);
    return 0;

error:;
    int saved = errno;
    close(in);
    errno = saved;
    return -1;
}

/* ----------------------------------------------------------------------
 * The backend
 */

static int
jit_init(char *path, size_t path_size)
{
    PyOS_snprintf(path, path_size, "/tmp/jit-%ld.dump", (long)getpid());
    if (init_unwind_info() < 0) {
        return -1;
    }
    if (jit.file.fd >= 0 || jit.file.size > 0) {
        /* Open already (or closed by the program: reopened on use). */
        return 0;
    }
    return open_dump(path, path_size);
}

static int
jit_write_entry(const void *code, size_t code_size,
                const char *name, size_t name_size)
{
    if (code_size != jit.code_size) {
        errno = EINVAL;         /* not a copy of the described template */
        return -1;
    }
    /* Both records in one buffer and one write(): perf applies the
       unwinding record to the code load after it. */
    static char buf[sizeof(unwinding_record) + MAX_UNWIND_SIZE + 8
                    + MAX_RECORD_SIZE];
    uint64_t now = monotonic_ns();
    size_t unwind_padded = _Py_SIZE_ROUND_UP(jit.unwind_size, 8);
    unwinding_record unwinding = {
        .p = {
            .id = JIT_CODE_UNWINDING_INFO,
            .total_size = (uint32_t)(sizeof(unwinding) + unwind_padded),
            .timestamp = now,
        },
        .unwinding_size = jit.unwind_size,
        .eh_frame_hdr_size = jit.eh_frame_hdr_size,
        /* perf's ELF puts the tables right after the code (see the top
           of this file) and its unwinder looks them up at those
           addresses, in whatever mapping it has there.  jit_span() gave
           each trampoline that address range to itself, and declaring the
           tables mapped makes perf's mapping of this trampoline cover it.
           (With the tables unmapped and trampolines 16 bytes apart, the
           lookup landed in a newer neighbour and unwinding stopped.) */
        .mapped_size = jit.unwind_size,
    };
    code_load_record load = {
        .p = {
            .id = JIT_CODE_LOAD,
            .total_size = (uint32_t)(sizeof(load) + name_size + 1
                                     + code_size),
            .timestamp = now,
        },
        .pid = (uint32_t)getpid(),
        .tid = current_tid(),
        .vma = (uintptr_t)code,
        .code_addr = (uintptr_t)code,
        .code_size = code_size,
        .code_index = jit.code_index,
    };
    assert(name_size <= _PyPerf_MAX_NAME);
    char *p = buf;
    memcpy(p, &unwinding, sizeof(unwinding));
    p += sizeof(unwinding);
    memcpy(p, jit.unwind, jit.unwind_size);
    memset(p + jit.unwind_size, 0, unwind_padded - jit.unwind_size);
    p += unwind_padded;
    memcpy(p, &load, sizeof(load));
    p += sizeof(load);
    memcpy(p, name, name_size);
    p += name_size;
    *p++ = '\0';
    memcpy(p, code, code_size);
    p += code_size;
    size_t size = (size_t)(p - buf);
    assert(size <= sizeof(buf));
    if (_PyPerf_FileAppend(&jit.file, buf, size) < 0) {
        return -1;
    }
    jit.code_index++;
    return 0;
}

static int
jit_after_fork_child(char *path, size_t path_size)
{
    if (jit.file.path[0] == '\0') {
        return 0;
    }
    /* The inherited descriptor and mapping are the parent's file. */
    _PyPerf_File parent = jit.file;
    jit.file = (_PyPerf_File){.fd = -1};
    unmap_marker();
    int res = open_dump(path, path_size);
    if (res == 0) {
        res = copy_parent_records(&parent, parent.size);
    }
    int saved = errno;
    _PyPerf_FileForget(&parent);
    errno = saved;
    return res;
}

/* The address range perf attributes to a trampoline: its code, padded to
   8, then the unwind tables (see jit_write_entry). */
static size_t
jit_span(size_t code_size)
{
    return EH_FRAME_DISTANCE(code_size) + jit.unwind_size;
}

const _PyPerf_Backend _PyPerf_JitBackend = {
    .name = "perf_jit",
    .init = jit_init,
    .write_entry = jit_write_entry,
    .after_fork_child = jit_after_fork_child,
    .span = jit_span,
};

#endif  /* PY_HAVE_PERF_JIT_TRAMPOLINE */
