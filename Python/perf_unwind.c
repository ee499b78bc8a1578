/*
 * The trampoline template's unwind description, in DWARF
 * ======================================================
 *
 * Unwinders that do not follow frame pointers (perf's DWARF unwinder, gdb)
 * need call frame information (CFI) for every piece of code they meet on
 * the stack.  Trampolines are made at run time and have none in the
 * interpreter's .eh_frame, so they get it from here: the jitdump backend
 * (Python/perf_jit_trampoline.c) writes it into every unwinding record,
 * and the gdb JIT images (Python/perf_gdb_jit.c) carry it for every slot.
 * One description, two containers.
 *
 * The rules must match the template (Python/asm_trampoline.S)
 * instruction by instruction.  Which instructions the template holds
 * depends on the compiler flags (endbr64 under -fcf-protection; bti and
 * paciasp/autiasp under -mbranch-protection), so the description is not
 * written by hand per variant: the template's bytes are matched against a
 * per-architecture table of the instructions it may contain, each with its
 * effect on the frame, and the CFA program is generated from the matches.
 * A template that does not match (the assembly was edited without this
 * table) is refused, never described wrongly.  Both tables are compiled on
 * both architectures, so the tests check the other machine's description
 * too (_testinternalcapi.perf_unwind_tables()).
 *
 * x86_64 (CFA = rsp + 8 at entry):      aarch64 (CFA = sp at entry):
 *
 *   endbr64          (optional)           bti c            (optional)
 *   push %rbp        CFA = rsp + 16       paciasp          RA signed
 *   mov %rsp, %rbp   CFA = rbp + 16       stp x29, x30, [sp, #-16]!
 *   call *%rcx                                             CFA = sp + 16
 *   pop %rbp         CFA = rsp + 8        mov x29, sp      CFA = x29 + 16
 *   ret                                   blr x3
 *                                         ldp x29, x30, [sp], #16
 *                                                          CFA = sp
 *                                         autiasp          RA plain
 *                                         ret
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>

/* ----------------------------------------------------------------------
 * Constants
 */

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

/* CIE version of .eh_frame (LSB) */
#define CIE_VERSION                 1

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
    .elf_machine = _PyPerf_EM_X86_64,
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
    .elf_machine = _PyPerf_EM_AARCH64,
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
 * Little-endian, as both supported machines are.  A write past the end of
 * the buffer is counted, not stored; callers check once, at the end.
 */

void
_PyPerf_EmitU8(_PyPerf_Dwarf *b, uint8_t v)
{
    if (b->pos < b->size) {
        b->start[b->pos] = v;
    }
    b->pos++;
}

void
_PyPerf_EmitBytes(_PyPerf_Dwarf *b, const void *bytes, size_t size)
{
    const uint8_t *p = bytes;
    for (size_t i = 0; i < size; i++) {
        _PyPerf_EmitU8(b, p[i]);
    }
}

void
_PyPerf_EmitU32(_PyPerf_Dwarf *b, uint32_t v)
{
    for (int i = 0; i < 4; i++) {
        _PyPerf_EmitU8(b, (uint8_t)(v >> (8 * i)));
    }
}

static void
emit_u64(_PyPerf_Dwarf *b, uint64_t v)
{
    for (int i = 0; i < 8; i++) {
        _PyPerf_EmitU8(b, (uint8_t)(v >> (8 * i)));
    }
}

static void
emit_uleb128(_PyPerf_Dwarf *b, uint64_t v)
{
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        _PyPerf_EmitU8(b, v != 0 ? (byte | 0x80) : byte);
    } while (v != 0);
}

static void
emit_sleb128(_PyPerf_Dwarf *b, int64_t v)
{
    for (;;) {
        uint8_t byte = v & 0x7f;
        v >>= 7;    /* arithmetic shift: keeps the sign */
        int done = (v == 0 && !(byte & 0x40)) || (v == -1 && (byte & 0x40));
        _PyPerf_EmitU8(b, done ? byte : (byte | 0x80));
        if (done) {
            return;
        }
    }
}

/* A CIE or an FDE is a length-prefixed block: begin_block() reserves the
   4-byte length, end_block() pads the block with DW_CFA_nop to a multiple
   of 8 bytes (the length field included, as assemblers do for 64-bit
   targets) and stores its length, which does not count the field. */
static size_t
begin_block(_PyPerf_Dwarf *b)
{
    size_t at = b->pos;
    _PyPerf_EmitU32(b, 0);
    return at;
}

static void
end_block(_PyPerf_Dwarf *b, size_t at)
{
    while ((b->pos - at) % 8 != 0) {
        _PyPerf_EmitU8(b, DW_CFA_nop);
    }
    uint32_t length = (uint32_t)(b->pos - at - 4);
    for (int i = 0; i < 4; i++) {
        if (at + i < b->size) {
            b->start[at + i] = (uint8_t)(length >> (8 * i));
        }
    }
}

size_t
_PyPerf_EmitCIE(_PyPerf_Dwarf *b, const _PyPerf_TemplateCFI *cfi,
                uint8_t pointer_encoding)
{
    size_t cie = begin_block(b);
    _PyPerf_EmitU32(b, 0);                  /* CIE id: 0 in .eh_frame */
    _PyPerf_EmitU8(b, CIE_VERSION);
    /* augmentation "zR", NUL included: 'z' augmentation data size
       follows, 'R' the FDE pointer encoding */
    _PyPerf_EmitBytes(b, "zR", 3);
    emit_uleb128(b, cfi->code_align);
    emit_sleb128(b, cfi->data_align);
    _PyPerf_EmitU8(b, (uint8_t)cfi->ra_column);    /* a byte in version 1 */
    emit_uleb128(b, 1);              /* augmentation data size */
    _PyPerf_EmitU8(b, pointer_encoding);
    _PyPerf_EmitBytes(b, cfi->initial, cfi->initial_size);
    end_block(b, cie);
    return cie;
}

size_t
_PyPerf_EmitFDE(_PyPerf_Dwarf *b, size_t cie, const _PyPerf_TemplateCFI *cfi,
                uint8_t pointer_encoding, int64_t pc_begin)
{
    size_t fde = begin_block(b);
    /* CIE pointer: from this field back to the CIE */
    _PyPerf_EmitU32(b, (uint32_t)(b->pos - cie));
    if (pointer_encoding == _PyPerf_DW_EH_PE_absptr) {
        emit_u64(b, (uint64_t)pc_begin);
        emit_u64(b, (uint64_t)cfi->code_size);      /* pc_range */
    }
    else {
        assert(pointer_encoding
               == (_PyPerf_DW_EH_PE_pcrel | _PyPerf_DW_EH_PE_sdata4));
        _PyPerf_EmitU32(b, (uint32_t)(int32_t)pc_begin);
        _PyPerf_EmitU32(b, (uint32_t)cfi->code_size);      /* pc_range */
    }
    emit_uleb128(b, 0);              /* augmentation data size */
    _PyPerf_EmitBytes(b, cfi->program, cfi->program_size);
    end_block(b, fde);
    return fde;
}

/* ----------------------------------------------------------------------
 * The description
 */

/* Move the location to `offset` bytes into the code. */
static void
emit_advance(_PyPerf_Dwarf *b, const unwind_arch *arch, size_t *loc,
             size_t offset)
{
    assert(offset >= *loc && (offset - *loc) % arch->code_align == 0);
    size_t delta = (offset - *loc) / arch->code_align;
    if (delta == 0) {
        return;
    }
    if (delta < 0x40) {
        /* DW_CFA_advance_loc: delta in the low 6 bits */
        _PyPerf_EmitU8(b, DW_CFA_advance_loc | (uint8_t)delta);
    }
    else {
        /* DW_CFA_advance_loc1: delta in the next byte */
        assert(delta <= 0xff);
        _PyPerf_EmitU8(b, DW_CFA_advance_loc1);
        _PyPerf_EmitU8(b, (uint8_t)delta);
    }
    *loc = offset;
}

/* The rules that hold after one frame change.  FACTORED() turns a byte
   distance below the CFA into DW_CFA_offset's operand. */
static void
emit_frame_change(_PyPerf_Dwarf *b, const unwind_arch *arch,
                  template_step step)
{
#define FACTORED(bytes_below_cfa) \
    ((uint64_t)((bytes_below_cfa) / -arch->data_align))
    unsigned frame_top = arch->entry_cfa_offset + arch->frame_record_size;
    switch (step) {
    case STEP_PUSH_FRAME:
        /* DW_CFA_def_cfa_offset: CFA = sp + frame_top (register kept) */
        _PyPerf_EmitU8(b, DW_CFA_def_cfa_offset);
        emit_uleb128(b, frame_top);
        /* DW_CFA_offset: the caller's fp is saved at the bottom of the
           record, CFA - frame_top */
        _PyPerf_EmitU8(b, DW_CFA_offset | arch->fp_reg);
        emit_uleb128(b, FACTORED(frame_top));
        if (arch->push_saves_ra) {
            /* DW_CFA_offset: the return address register is saved right
               above it */
            _PyPerf_EmitU8(b, DW_CFA_offset | arch->ra_column);
            emit_uleb128(b, FACTORED(frame_top - 8));
        }
        break;
    case STEP_SET_FP:
        /* DW_CFA_def_cfa_register: CFA = fp + frame_top; sp may move
           from here on without changing the rules */
        _PyPerf_EmitU8(b, DW_CFA_def_cfa_register);
        emit_uleb128(b, arch->fp_reg);
        break;
    case STEP_POP_FRAME:
        /* DW_CFA_def_cfa: CFA = sp + entry offset, as at the first
           instruction */
        _PyPerf_EmitU8(b, DW_CFA_def_cfa);
        emit_uleb128(b, arch->sp_reg);
        emit_uleb128(b, arch->entry_cfa_offset);
        /* DW_CFA_restore: fp holds the caller's value again */
        _PyPerf_EmitU8(b, DW_CFA_restore | arch->fp_reg);
        if (arch->push_saves_ra) {
            /* DW_CFA_restore: so does the return address register */
            _PyPerf_EmitU8(b, DW_CFA_restore | arch->ra_column);
        }
        break;
    case STEP_TOGGLE_RA_SIGNED:
        /* DW_CFA_AARCH64_negate_ra_state: the return address is now
           signed (after paciasp) or plain again (after autiasp) */
        _PyPerf_EmitU8(b, DW_CFA_AARCH64_negate_ra_state);
        break;
    case STEP_NONE:
        break;
    }
#undef FACTORED
}

static const unwind_arch *
find_arch(unsigned int elf_machine)
{
    switch (elf_machine) {
    case _PyPerf_EM_X86_64:
        return &x86_64_arch;
    case _PyPerf_EM_AARCH64:
        return &aarch64_arch;
    default:
        return NULL;
    }
}

/* The two CFA programs for `code`: the CIE's initial instructions (the
   rules at the first byte) and the FDE's instructions (how they change,
   instruction by instruction). */
int
_PyPerf_DescribeCode(unsigned int elf_machine, const uint8_t *code,
                     size_t code_size, _PyPerf_TemplateCFI *cfi, int warn)
{
    const unwind_arch *arch = find_arch(elf_machine);
    if (arch == NULL) {
        errno = EINVAL;
        return -1;
    }
    frame_change changes[16];
    assert(arch->insn_count <= Py_ARRAY_LENGTH(changes));
    Py_ssize_t nchanges = match_template(arch, code, code_size, changes,
                                         warn);
    if (nchanges < 0) {
        return -1;
    }
    cfi->elf_machine = elf_machine;
    cfi->code_size = code_size;
    cfi->code_align = arch->code_align;
    cfi->data_align = arch->data_align;
    cfi->ra_column = arch->ra_column;

    _PyPerf_Dwarf b = {.start = cfi->initial, .size = sizeof(cfi->initial)};
    /* DW_CFA_def_cfa: CFA = sp + entry offset */
    _PyPerf_EmitU8(&b, DW_CFA_def_cfa);
    emit_uleb128(&b, arch->sp_reg);
    emit_uleb128(&b, arch->entry_cfa_offset);
    if (!arch->push_saves_ra) {
        /* DW_CFA_offset: the return address is on the stack, at CFA - 8 */
        _PyPerf_EmitU8(&b, DW_CFA_offset | arch->ra_column);
        emit_uleb128(&b, 8 / -arch->data_align);
    }
    cfi->initial_size = b.pos;
    int overflow = _PyPerf_DWARF_OVERFLOWED(&b);

    b = (_PyPerf_Dwarf){.start = cfi->program, .size = sizeof(cfi->program)};
    size_t loc = 0;
    for (Py_ssize_t i = 0; i < nchanges; i++) {
        emit_advance(&b, arch, &loc, changes[i].offset);
        emit_frame_change(&b, arch, changes[i].step);
    }
    cfi->program_size = b.pos;
    if (overflow || _PyPerf_DWARF_OVERFLOWED(&b)) {
        errno = ENOSPC;
        return -1;
    }
    return 0;
}

/* .eh_frame (CIE, FDE, terminator), then .eh_frame_hdr: the layout perf
   gives a jitted ELF file, where .eh_frame starts text_gap bytes after the
   code's first byte and .eh_frame_hdr right after .eh_frame.  All pointers
   are relative, so the result depends only on the code size. */
Py_ssize_t
_PyPerf_BuildEhFrame(const _PyPerf_TemplateCFI *cfi, size_t text_gap,
                     uint8_t *buf, size_t buf_size, size_t *hdr_size)
{
    const uint8_t pcrel = _PyPerf_DW_EH_PE_pcrel | _PyPerf_DW_EH_PE_sdata4;
    _PyPerf_Dwarf b = {.start = buf, .size = buf_size};
    size_t cie = _PyPerf_EmitCIE(&b, cfi, pcrel);
    /* pc_begin is relative to its own field, 8 bytes into the FDE. */
    size_t fde_at = b.pos;
    size_t fde = _PyPerf_EmitFDE(&b, cie, cfi, pcrel,
                                 -(int64_t)(text_gap + fde_at + 8));
    assert(fde == fde_at);
    _PyPerf_EmitU32(&b, 0);                 /* terminator: a zero length */
    size_t eh_frame_size = b.pos;

    /* .eh_frame_hdr: lets an unwinder find the FDE by address. */
    size_t hdr = b.pos;
    _PyPerf_EmitU8(&b, 1);                                  /* version */
    _PyPerf_EmitU8(&b, pcrel);                      /* eh_frame_ptr enc */
    _PyPerf_EmitU8(&b, _PyPerf_DW_EH_PE_udata4);    /* fde_count enc */
    _PyPerf_EmitU8(&b, _PyPerf_DW_EH_PE_datarel
                       | _PyPerf_DW_EH_PE_sdata4);  /* table enc */
    /* eh_frame_ptr: .eh_frame's start, relative to this field */
    _PyPerf_EmitU32(&b, (uint32_t)-(int32_t)b.pos);
    _PyPerf_EmitU32(&b, 1);                                 /* fde_count */
    /* The table, relative to .eh_frame_hdr: the code's start ... */
    _PyPerf_EmitU32(&b, (uint32_t)-(int32_t)(text_gap + eh_frame_size));
    /* ... and its FDE. */
    _PyPerf_EmitU32(&b, (uint32_t)((int32_t)fde - (int32_t)hdr));

    if (_PyPerf_DWARF_OVERFLOWED(&b)) {
        errno = ENOSPC;
        return -1;
    }
    *hdr_size = b.pos - hdr;
    return (Py_ssize_t)b.pos;
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
