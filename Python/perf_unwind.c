/*
 * The trampoline template's unwind description, in DWARF
 * ======================================================
 *
 * Unwinders that do not follow frame pointers (perf's DWARF unwinder, gdb)
 * need call frame information (CFI) for every piece of code they meet on
 * the stack.  Trampolines are made at run time and have none in the
 * interpreter's .eh_frame, so they get it from here: the jitdump backend
 * (Python/perf_jit_trampoline.c) writes it into every unwinding record,
 * and the gdb JIT images (Python/perf_gdb_jit.c) carry it, as rows, for
 * every slot of an arena at once (see "Many copies, one FDE" below).
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
 * The CFA always follows the stack pointer: the evaluator a trampoline
 * calls may leave the frame pointer at records of its own.
 *
 * x86_64 (CFA = rsp + 8 at entry):      aarch64 (CFA = sp at entry):
 *
 *   endbr64          (optional)         bti c              (optional)
 *   push %rbp        CFA = rsp + 16,    paciasp            RA signed
 *                    rbp at CFA - 16    sub sp, sp, #160   CFA = sp + 160
 *   mov %rsp, %rbp                      stp x29, x30, [sp, #144]
 *   lea 1f(%rip), %rax                                     x29, x30 at
 *   push %rax        CFA = rsp + 24                        CFA - 16, - 8
 *   sub $136, %rsp   CFA = rsp + 160    add x29, sp, #144
 *   call *%rcx                          adr x16, 1f
 * 1: add $144, %rsp  CFA = rsp + 16     str x16, [sp, #136]
 *   pop %rbp         CFA = rsp + 8,     blr x3
 *                    rbp restored    1: ldp x29, x30, [sp, #144]
 *   ret                                                    restored
 *                                       add sp, sp, #160   CFA = sp
 *                                       autiasp            RA plain
 *                                       ret
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
#define DW_CFA_def_cfa_expression   0x0f
#define DW_CFA_val_expression       0x16

/* DWARF expression operations (DWARF 5, section 2.5) */
#define DW_OP_deref                 0x06
#define DW_OP_const8u               0x0e
#define DW_OP_constu                0x10
#define DW_OP_dup                   0x12
#define DW_OP_drop                  0x13
#define DW_OP_minus                 0x1c
#define DW_OP_mod                   0x1d
#define DW_OP_bra                   0x28
#define DW_OP_lt                    0x2d
#define DW_OP_skip                  0x2f
#define DW_OP_lit0                  0x30
#define DW_OP_breg0                 0x70    /* + register (0-31) */
#define DW_OP_bregx                 0x92

/* aarch64's pseudo-register for the return address's signing state */
#define AARCH64_RA_SIGN_STATE       34

/* CIE version of .eh_frame (LSB) */
#define CIE_VERSION                 1

/* What an instruction of the template does to the frame, from the end of
   that instruction on. */
typedef enum {
    STEP_NONE,          /* nothing the unwind rules see */
    STEP_MOVE_SP,       /* sp moves down by `sp_delta` bytes (up if
                           negative) */
    STEP_SAVE_FRAME,    /* the caller's frame record (fp, and aarch64's
                           x30) is stored right below the CFA; on x86_64
                           by a push, which moves sp down 8 bytes */
    STEP_RESTORE_FRAME, /* fp (and x30) hold the caller's values again;
                           on x86_64 by a pop, which moves sp up 8 bytes */
    STEP_TOGGLE_RA_SIGNED,  /* aarch64 pointer authentication: the return
                               address in x30 is signed / authenticated */
} template_step;

typedef struct {
    uint8_t bytes[8];           /* encoding, in memory order */
    uint8_t size;
    uint8_t optional;           /* present only under some compiler flags */
    uint8_t step;               /* template_step */
    int16_t sp_delta;           /* STEP_MOVE_SP: bytes sp moves down */
    const char *text;           /* assembly, for error messages */
} template_insn;

/* How an architecture's template and CFI look. */
typedef struct {
    uint32_t elf_machine;
    uint8_t code_align;         /* CIE code alignment factor */
    int8_t data_align;          /* CIE data alignment factor */
    uint8_t ra_column;          /* DWARF column of the return address */
    uint8_t sp_reg;             /* DWARF numbers of sp, fp and pc */
    uint8_t fp_reg;
    uint8_t pc_reg;
    uint8_t entry_cfa_offset;   /* CFA - sp at the first instruction */
    uint8_t save_moves_sp;      /* STEP_SAVE_FRAME and STEP_RESTORE_FRAME
                                   move sp by 8 bytes (x86_64's push and
                                   pop of the frame pointer) */
    uint8_t push_saves_ra;      /* the frame record holds the return
                                   address register (aarch64's x30) */
    const template_insn *insns; /* the template's possible instructions */
    size_t insn_count;
} unwind_arch;

/* Python/asm_trampoline.S, x86_64.  At entry the return address is at
   sp, so CFA = rsp + 8 and the return address is at CFA - 8. */
static const template_insn x86_64_insns[] = {
    {{0xf3, 0x0f, 0x1e, 0xfa}, 4, 1, STEP_NONE, 0, "endbr64"},
    {{0x55}, 1, 0, STEP_SAVE_FRAME, 0, "push %rbp"},
    {{0x48, 0x89, 0xe5}, 3, 0, STEP_NONE, 0, "mov %rsp, %rbp"},
    {{0x48, 0x8d, 0x05, 0x0a, 0x00, 0x00, 0x00}, 7, 0, STEP_NONE, 0,
     "lea 1f(%rip), %rax"},
    {{0x50}, 1, 0, STEP_MOVE_SP, 8, "push %rax"},
    {{0x48, 0x81, 0xec, 0x88, 0x00, 0x00, 0x00}, 7, 0, STEP_MOVE_SP, 136,
     "sub $136, %rsp"},
    {{0xff, 0xd1}, 2, 0, STEP_NONE, 0, "call *%rcx"},
    {{0x48, 0x81, 0xc4, 0x90, 0x00, 0x00, 0x00}, 7, 0, STEP_MOVE_SP, -144,
     "add $144, %rsp"},
    {{0x5d}, 1, 0, STEP_RESTORE_FRAME, 0, "pop %rbp"},
    {{0xc3}, 1, 0, STEP_NONE, 0, "ret"},
};

static const unwind_arch x86_64_arch = {
    .elf_machine = _PyPerf_EM_X86_64,
    .code_align = 1,
    .data_align = -8,
    .ra_column = 16,            /* the return address "register" */
    .sp_reg = 7,                /* %rsp */
    .fp_reg = 6,                /* %rbp */
    .pc_reg = 16,               /* %rip */
    .entry_cfa_offset = 8,
    .save_moves_sp = 1,         /* push %rbp: the return address is
                                   already on the stack */
    .push_saves_ra = 0,
    .insns = x86_64_insns,
    .insn_count = Py_ARRAY_LENGTH(x86_64_insns),
};

/* Python/asm_trampoline.S, aarch64 (little-endian words).  At entry
   CFA = sp and the return address is in x30. */
static const template_insn aarch64_insns[] = {
    {{0x5f, 0x24, 0x03, 0xd5}, 4, 1, STEP_NONE, 0, "bti c"},
    {{0x3f, 0x23, 0x03, 0xd5}, 4, 1, STEP_TOGGLE_RA_SIGNED, 0, "paciasp"},
    {{0xff, 0x83, 0x02, 0xd1}, 4, 0, STEP_MOVE_SP, 160,
     "sub sp, sp, #160"},
    {{0xfd, 0x7b, 0x09, 0xa9}, 4, 0, STEP_SAVE_FRAME, 0,
     "stp x29, x30, [sp, #144]"},
    {{0xfd, 0x43, 0x02, 0x91}, 4, 0, STEP_NONE, 0, "add x29, sp, #144"},
    {{0x70, 0x00, 0x00, 0x10}, 4, 0, STEP_NONE, 0, "adr x16, 1f"},
    {{0xf0, 0x47, 0x00, 0xf9}, 4, 0, STEP_NONE, 0,
     "str x16, [sp, #136]"},
    {{0x60, 0x00, 0x3f, 0xd6}, 4, 0, STEP_NONE, 0, "blr x3"},
    {{0xfd, 0x7b, 0x49, 0xa9}, 4, 0, STEP_RESTORE_FRAME, 0,
     "ldp x29, x30, [sp, #144]"},
    {{0xff, 0x83, 0x02, 0x91}, 4, 0, STEP_MOVE_SP, -160,
     "add sp, sp, #160"},
    {{0xbf, 0x23, 0x03, 0xd5}, 4, 1, STEP_TOGGLE_RA_SIGNED, 0, "autiasp"},
    {{0xc0, 0x03, 0x5f, 0xd6}, 4, 0, STEP_NONE, 0, "ret"},
};

static const unwind_arch aarch64_arch = {
    .elf_machine = _PyPerf_EM_AARCH64,
    .code_align = 4,
    .data_align = -8,
    .ra_column = 30,            /* x30, the link register */
    .sp_reg = 31,
    .fp_reg = 29,
    .pc_reg = 32,
    .entry_cfa_offset = 0,
    .save_moves_sp = 0,         /* stp into room made before */
    .push_saves_ra = 1,
    .insns = aarch64_insns,
    .insn_count = Py_ARRAY_LENGTH(aarch64_insns),
};

/* A point where the frame changes: after the instruction ending at
   `offset`, `step` holds. */
typedef struct {
    size_t offset;
    template_step step;
    int sp_delta;
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
                changes[n].sp_delta = insn->sp_delta;
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
 * Many copies, one FDE
 *
 * gdb needs call frame information for every trampoline it meets on a
 * stack.  An FDE per trampoline would cost more than the trampoline (about
 * 40 bytes each, built whether a debugger ever comes or not), so one FDE
 * covers a whole arena.  Its rules are DWARF expressions that find the
 * pc's offset in its slot and, from it, the template's row:
 *
 *     off = (pc - start) % slot_size
 *     CFA = off < rows[0].end ? <rule of row 0>
 *         : off < rows[1].end ? <rule of row 1> : ...
 *
 * and the same for the caller's fp, the return address and (aarch64) its
 * signing state, each as DW_CFA_val_expression.  A row's rule is a short
 * expression; the choice is a chain of tests and branches.
 */

/* One row's rule: a few DWARF expression operations. */
typedef struct {
    uint8_t code[16];
    size_t size;
} row_rule;

static void
emit_breg(_PyPerf_Dwarf *b, unsigned int reg, int64_t offset)
{
    if (reg < 32) {
        _PyPerf_EmitU8(b, (uint8_t)(DW_OP_breg0 + reg));
    }
    else {
        _PyPerf_EmitU8(b, DW_OP_bregx);
        emit_uleb128(b, reg);
    }
    emit_sleb128(b, offset);
}

typedef enum {
    RULE_CFA,           /* the CFA: nothing on the stack */
    RULE_FP,            /* val_expression rules: the CFA on the stack */
    RULE_RA,
    RULE_RA_SIGNED,
} rule_kind;

static row_rule
make_rule(const _PyPerf_TemplateCFI *cfi, const _PyPerf_FrameRow *row,
          rule_kind kind, unsigned int ra_reg)
{
    row_rule rule;
    _PyPerf_Dwarf b = {.start = rule.code, .size = sizeof(rule.code)};
    unsigned int below = kind == RULE_FP ? row->fp_below_cfa
                                         : row->ra_below_cfa;
    switch (kind) {
    case RULE_CFA:
        emit_breg(&b, row->cfa_reg, row->cfa_offset);
        break;
    case RULE_FP:
    case RULE_RA:
        if (below != 0) {
            /* saved at CFA - below */
            _PyPerf_EmitU8(&b, DW_OP_constu);
            emit_uleb128(&b, below);
            _PyPerf_EmitU8(&b, DW_OP_minus);
            _PyPerf_EmitU8(&b, DW_OP_deref);
        }
        else {
            /* still in its register */
            _PyPerf_EmitU8(&b, DW_OP_drop);
            emit_breg(&b, kind == RULE_FP ? cfi->fp_reg : ra_reg, 0);
        }
        break;
    case RULE_RA_SIGNED:
        _PyPerf_EmitU8(&b, DW_OP_drop);
        _PyPerf_EmitU8(&b, (uint8_t)(DW_OP_lit0 + (row->ra_signed != 0)));
        break;
    }
    assert(!_PyPerf_DWARF_OVERFLOWED(&b));
    rule.size = b.pos;
    return rule;
}

static void
emit_u16(_PyPerf_Dwarf *b, int16_t v)
{
    _PyPerf_EmitU8(b, (uint8_t)((uint16_t)v & 0xff));
    _PyPerf_EmitU8(b, (uint8_t)((uint16_t)v >> 8));
}

/* The expression that picks `kind`'s rule by the pc's offset in its slot.
   Laid out as: off; the tests (dup, end, lt, bra: one per row but the
   last); the last row's rule; the other rows' rules; each rule but the
   final one skips to the end. */
static void
emit_row_choice(_PyPerf_Dwarf *b, const _PyPerf_TemplateCFI *cfi,
                rule_kind kind, uint64_t start, size_t slot_size)
{
    size_t n = cfi->row_count;
    row_rule rules[Py_ARRAY_LENGTH(cfi->rows)];
    for (size_t i = 0; i < n; i++) {
        rules[i] = make_rule(cfi, &cfi->rows[i], kind, cfi->ra_column);
    }
    /* off = (pc - start) % slot_size */
    emit_breg(b, cfi->pc_reg, 0);
    _PyPerf_EmitU8(b, DW_OP_const8u);
    emit_u64(b, start);
    _PyPerf_EmitU8(b, DW_OP_minus);
    _PyPerf_EmitU8(b, DW_OP_constu);
    emit_uleb128(b, slot_size);
    _PyPerf_EmitU8(b, DW_OP_mod);

    /* Each case: drop off, the rule, a skip (3 bytes) unless final.
       Order of the cases: n - 1, 0, 1, ..., n - 2. */
    size_t case_size[Py_ARRAY_LENGTH(cfi->rows)];
    for (size_t i = 0; i < n; i++) {
        int final = (n == 1) || (i == n - 2);
        case_size[i] = 1 + rules[i].size + (final ? 0 : 3);
    }
    size_t tests_end = 0;       /* relative to the first test */
    size_t test_end[Py_ARRAY_LENGTH(cfi->rows)];
    for (size_t i = 0; i + 1 < n; i++) {
        _PyPerf_Dwarf m = {.start = NULL, .size = 0};
        emit_uleb128(&m, cfi->rows[i].end);
        tests_end += 3 + m.pos + 3;     /* dup, constu, end, lt, bra */
        test_end[i] = tests_end;
    }
    size_t case_at[Py_ARRAY_LENGTH(cfi->rows)];
    size_t pos = tests_end;
    case_at[n - 1] = pos;
    pos += case_size[n - 1];
    for (size_t i = 0; i + 1 < n; i++) {
        case_at[i] = pos;
        pos += case_size[i];
    }
    size_t end = pos;

    size_t base = b->pos;
    (void)base;                 /* for the asserts */
    for (size_t i = 0; i + 1 < n; i++) {
        _PyPerf_EmitU8(b, DW_OP_dup);
        _PyPerf_EmitU8(b, DW_OP_constu);
        emit_uleb128(b, cfi->rows[i].end);
        _PyPerf_EmitU8(b, DW_OP_lt);
        _PyPerf_EmitU8(b, DW_OP_bra);
        emit_u16(b, (int16_t)(case_at[i] - test_end[i]));
        assert(b->pos - base == test_end[i] || _PyPerf_DWARF_OVERFLOWED(b));
    }
    for (size_t k = 0; k < n; k++) {
        size_t i = k == 0 ? n - 1 : k - 1;
        _PyPerf_EmitU8(b, DW_OP_drop);
        _PyPerf_EmitBytes(b, rules[i].code, rules[i].size);
        if (k + 1 < n) {
            _PyPerf_EmitU8(b, DW_OP_skip);
            emit_u16(b, (int16_t)(end - (case_at[i] + case_size[i])));
        }
    }
    assert(b->pos - base == end || _PyPerf_DWARF_OVERFLOWED(b));
}

/* A DW_CFA_def_cfa_expression or DW_CFA_val_expression instruction with
   the row choice for `kind`: its length first, measured. */
static void
emit_rule_instruction(_PyPerf_Dwarf *b, const _PyPerf_TemplateCFI *cfi,
                      rule_kind kind, unsigned int reg, uint64_t start,
                      size_t slot_size)
{
    _PyPerf_Dwarf m = {.start = NULL, .size = 0};
    emit_row_choice(&m, cfi, kind, start, slot_size);
    if (kind == RULE_CFA) {
        _PyPerf_EmitU8(b, DW_CFA_def_cfa_expression);
    }
    else {
        _PyPerf_EmitU8(b, DW_CFA_val_expression);
        emit_uleb128(b, reg);
    }
    emit_uleb128(b, m.pos);
    emit_row_choice(b, cfi, kind, start, slot_size);
}

size_t
_PyPerf_EmitSlotsFDE(_PyPerf_Dwarf *b, size_t cie,
                     const _PyPerf_TemplateCFI *cfi, uint64_t start,
                     size_t size, size_t slot_size)
{
    size_t fde = begin_block(b);
    _PyPerf_EmitU32(b, (uint32_t)(b->pos - cie));
    emit_u64(b, start);
    emit_u64(b, size);
    emit_uleb128(b, 0);              /* augmentation data size */
    emit_rule_instruction(b, cfi, RULE_CFA, 0, start, slot_size);
    emit_rule_instruction(b, cfi, RULE_FP, cfi->fp_reg, start, slot_size);
    emit_rule_instruction(b, cfi, RULE_RA, cfi->ra_column, start,
                          slot_size);
    int signs = 0;
    for (size_t i = 0; i < cfi->row_count; i++) {
        signs |= cfi->rows[i].ra_signed;
    }
    if (signs) {
        emit_rule_instruction(b, cfi, RULE_RA_SIGNED, AARCH64_RA_SIGN_STATE,
                              start, slot_size);
    }
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

/* How many bytes `change` moves sp down (up if negative). */
static int
sp_moved(const unwind_arch *arch, const frame_change *change)
{
    int delta = change->sp_delta;
    if (arch->save_moves_sp) {
        delta += (change->step == STEP_SAVE_FRAME) ? 8
                 : (change->step == STEP_RESTORE_FRAME) ? -8 : 0;
    }
    return delta;
}

/* The rules that hold after one frame change, the CFA at `*cfa_offset`
   from sp before it.  FACTORED() turns a byte distance below the CFA into
   DW_CFA_offset's operand. */
static void
emit_frame_change(_PyPerf_Dwarf *b, const unwind_arch *arch,
                  const frame_change *change, unsigned *cfa_offset)
{
#define FACTORED(bytes_below_cfa) \
    ((uint64_t)((bytes_below_cfa) / -arch->data_align))
    int sp_delta = sp_moved(arch, change);
    if (sp_delta != 0) {
        /* DW_CFA_def_cfa_offset: CFA = sp + the new distance */
        *cfa_offset += sp_delta;
        _PyPerf_EmitU8(b, DW_CFA_def_cfa_offset);
        emit_uleb128(b, *cfa_offset);
    }
    switch (change->step) {
    case STEP_SAVE_FRAME:
        /* DW_CFA_offset: the caller's fp is saved at CFA - 16 */
        _PyPerf_EmitU8(b, DW_CFA_offset | arch->fp_reg);
        emit_uleb128(b, FACTORED(16));
        if (arch->push_saves_ra) {
            /* DW_CFA_offset: the return address register right above */
            _PyPerf_EmitU8(b, DW_CFA_offset | arch->ra_column);
            emit_uleb128(b, FACTORED(8));
        }
        break;
    case STEP_RESTORE_FRAME:
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
    case STEP_MOVE_SP:
    case STEP_NONE:
        break;
    }
#undef FACTORED
}

/* The same rules as the CFA programs, as rows.  Returns -1 if they do not
   fit cfi->rows. */
static int
describe_rows(const unwind_arch *arch, const frame_change *changes,
              Py_ssize_t nchanges, _PyPerf_TemplateCFI *cfi)
{
    _PyPerf_FrameRow row = {
        .cfa_reg = arch->sp_reg,
        .cfa_offset = arch->entry_cfa_offset,
        .ra_below_cfa = arch->push_saves_ra ? 0 : 8,
    };
    size_t n = 0;
    for (Py_ssize_t i = 0; i <= nchanges; i++) {
        row.end = i < nchanges ? changes[i].offset : cfi->code_size;
        if (n == Py_ARRAY_LENGTH(cfi->rows)) {
            return -1;
        }
        cfi->rows[n++] = row;
        if (i == nchanges) {
            break;
        }
        row.cfa_offset += sp_moved(arch, &changes[i]);
        switch (changes[i].step) {
        case STEP_SAVE_FRAME:
            row.fp_below_cfa = 16;
            if (arch->push_saves_ra) {
                row.ra_below_cfa = 8;
            }
            break;
        case STEP_RESTORE_FRAME:
            row.fp_below_cfa = 0;
            if (arch->push_saves_ra) {
                row.ra_below_cfa = 0;
            }
            break;
        case STEP_TOGGLE_RA_SIGNED:
            row.ra_signed = !row.ra_signed;
            break;
        case STEP_MOVE_SP:
        case STEP_NONE:
            break;
        }
    }
    cfi->row_count = n;
    cfi->pc_reg = arch->pc_reg;
    cfi->fp_reg = arch->fp_reg;
    return 0;
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
    unsigned cfa_offset = arch->entry_cfa_offset;
    for (Py_ssize_t i = 0; i < nchanges; i++) {
        emit_advance(&b, arch, &loc, changes[i].offset);
        emit_frame_change(&b, arch, &changes[i], &cfa_offset);
    }
    cfi->program_size = b.pos;
    if (overflow || _PyPerf_DWARF_OVERFLOWED(&b)
        || describe_rows(arch, changes, nchanges, cfi) < 0)
    {
        errno = ENOSPC;
        return -1;
    }
    /* At the return, the frame is the caller's again. */
    const _PyPerf_FrameRow *last = &cfi->rows[cfi->row_count - 1];
    if (last->cfa_offset != arch->entry_cfa_offset
        || last->fp_below_cfa != 0)
    {
        if (warn) {
            _PyPerf_Warn("perf_jit: the trampoline template does not "
                         "return with the frame it was called with");
        }
        errno = ENOEXEC;
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
