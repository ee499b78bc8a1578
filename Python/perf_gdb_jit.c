/*
 * Perf trampolines in gdb: the JIT compilation interface
 * ======================================================
 *
 * Why.  Trampolines (Python/perf_trampoline.c) live in anonymous
 * executable arenas.  gdb knows no symbol and no call frame information
 * (CFI) for that memory, so when it meets a trampoline on the stack it
 * guesses: on x86_64 it takes the function for frameless, reads the
 * trampoline's saved %rbp as its return address and gives up a frame
 * later.  A backtrace taken inside a Python call never reaches main:
 *
 *     without                              with
 *
 *     #0 os_getppid                        #0 os_getppid
 *     ...                                  ...
 *     #4 _PyEval_EvalFrameDefault          #4 _PyEval_EvalFrameDefault
 *     #5 ?? ()                             #5 py_trampoline ()
 *     #6 ?? ()                             #6 _PyEval_EvalFrameDefault
 *     #7 _PyEval_EvalFrameDefault          #7 py_trampoline ()
 *     Backtrace stopped: frame did         ...
 *       not save the PC                    #N Py_BytesMain
 *
 * How.  gdb's JIT compilation interface (GDB manual, "JIT Compilation
 * Interface") lets a process hand gdb object files that live in its own
 * memory.  The process keeps a linked list of entries, each pointing at an
 * in-memory ELF image, headed by a descriptor named __jit_debug_descriptor,
 * and calls the empty function __jit_debug_register_code after each
 * change.  gdb sets a breakpoint on that function when it finds it, reads
 * the entry the descriptor names and loads the image like a shared
 * library; when it attaches to a running process, it walks the whole list.
 * Without a debugger the cost is building the image and one empty call.
 *
 * One image per arena.  An arena is filled with template copies at every
 * slot before it is made executable, and every copy runs the same
 * instructions.  So the image made when the arena is created describes
 * every trampoline the arena will ever hand out: one FDE per slot, all
 * with the template's CFA program (made by Python/perf_jit_trampoline.c
 * from the template's instructions, the one the jitdump uses), and one
 * function symbol per slot.  Nothing happens per trampoline, and nothing
 * is ever unregistered: arenas are never unmapped.
 *
 * The image, a relocatable ELF64 file for the host machine:
 *
 *     offset 0   +-----------------------------------------+
 *                | ELF header (ET_REL, no program headers) |
 *            64  +-----------------------------------------+
 *                | .eh_frame   CIE: "zR", absolute FDE     |
 *                |               pointers, initial rules   |
 *                |             FDE slot 0: [a, a + code)   |
 *                |             FDE slot 1: [a + s, ...)    |
 *                |             ...          one per slot   |
 *                |             zero terminator             |
 *                +-----------------------------------------+
 *                | .symtab     null symbol, then one local |
 *                |             FUNC symbol per slot        |
 *                | .strtab     "\0py_trampoline\0"         |
 *                | .shstrtab   section names               |
 *                +-----------------------------------------+ (8-aligned)
 *                | section headers: null, .text, .eh_frame,|
 *                |   .symtab, .strtab, .shstrtab           |
 *                +-----------------------------------------+
 *
 *     a: the arena's address, s: the slot size, code: the template size.
 *
 * .text has no bytes in the image (SHT_NOBITS): its address and size are
 * the arena's, so gdb places the image's symbols and FDEs there and reads
 * the instructions from the process.  gdb takes the sections' addresses as
 * absolute, and (ET_REL) a symbol's value is its offset in .text.  The FDE
 * pointers are absolute 8-byte addresses (DW_EH_PE_absptr): no pointer
 * depends on where the image itself lies.  .eh_frame is not SHF_ALLOC: it
 * is data for the debugger, not part of the process image.
 *
 * Memory.  Per slot, one FDE (4 length + 4 CIE pointer + 8 + 8 address
 * range + 1 augmentation size + the CFA program, padded to 8: 40 bytes on
 * x86_64, 48 on aarch64) and one symbol (24 bytes); per arena, about 600
 * bytes more (headers, CIE, string tables, the list entry).  A 64 KiB arena
 * of 16-byte slots (x86_64) has 4096 slots: 4096 * 64 + 568 = 262,712
 * bytes of image, made once with the arena and kept as long.
 *
 * The symbols.  gdb looks both names up in every object file: they have to
 * be these, with default visibility (in .dynsym, so a stripped python still
 * has them), and survive optimization (the call to an empty function is
 * the whole protocol).  Another JIT in the process (LLVM's, say) may define
 * the same pair.  That is fine: the executable's definitions come first in
 * the dynamic linker's search order, so a shared library's references to
 * the names bind to ours, and every JIT appends to one list, which is what
 * the protocol expects (gdb reads entries, not owners).  A library that
 * binds both names to its own copies keeps its own list, and gdb (10 and
 * later) watches every object file that defines the pair.  The one mix
 * this breaks is a library linked with -Bsymbolic-functions: it calls its
 * own function but writes our descriptor, so gdb, stopped in the library's
 * function, reads the library's unused descriptor and misses the new entry
 * until it next reads our whole list (when it attaches).  The list is
 * changed with the GIL held; another JIT changing it from a thread without
 * the GIL could race with us, as with any other registrant.
 *
 * Fork.  A child inherits the arenas, the images and the list, all in its
 * own copy of the memory: nothing to do.
 *
 * Failures (no memory, a template the CFI tables do not match) only cost
 * debuggers the description: never an error, never a warning.
 */

#include "Python.h"
#include "pycore_ceval.h"         // _PyPerf_GdbRegisterCode()

#if defined(PY_HAVE_PERF_TRAMPOLINE) && defined(PY_HAVE_PERF_JIT_TRAMPOLINE)

#include <elf.h>                  // Elf64_Ehdr, Elf64_Shdr, Elf64_Sym
#include <errno.h>
#include <stdint.h>
#include <string.h>

/* ----------------------------------------------------------------------
 * Constants
 */

#if defined(__x86_64__)
#  define HOST_MACHINE EM_X86_64
#elif defined(__aarch64__) && defined(__AARCH64EL__) && !defined(__ILP32__)
#  define HOST_MACHINE EM_AARCH64
#else
#  error "perf_gdb_jit: no ELF machine for this architecture"
#endif

/* gdb's JIT interface, version 1 (GDB manual, "JIT Compilation
   Interface") */
#define JIT_DESCRIPTOR_VERSION  1
#define JIT_NOACTION            0
#define JIT_REGISTER_FN         1

/* .eh_frame (LSB, "Exception Frames") */
#define DW_CFA_nop              0x00
#define DW_EH_PE_absptr         0x00    /* a pointer-sized address */
#define CIE_VERSION             1

/* Every trampoline's name in gdb */
#define SYMBOL_NAME             "py_trampoline"

/* Section indexes and names, in order */
enum {
    SEC_NULL,
    SEC_TEXT,
    SEC_EH_FRAME,
    SEC_SYMTAB,
    SEC_STRTAB,
    SEC_SHSTRTAB,
    SEC_COUNT
};

static const char shstrtab[] =
    "\0.text\0.eh_frame\0.symtab\0.strtab\0.shstrtab";
static const Elf64_Word section_names[SEC_COUNT] = {
    [SEC_NULL] = 0,
    [SEC_TEXT] = 1,
    [SEC_EH_FRAME] = 7,
    [SEC_SYMTAB] = 17,
    [SEC_STRTAB] = 25,
    [SEC_SHSTRTAB] = 33,
};

static const char strtab[] = "\0" SYMBOL_NAME;
#define SYMBOL_NAME_OFFSET 1

/* ----------------------------------------------------------------------
 * The interface gdb knows
 *
 * Names, layout and protocol are fixed by gdb; see the top of the file
 * for why the names may be shared with other JITs.
 */

struct jit_code_entry {
    struct jit_code_entry *next_entry;
    struct jit_code_entry *prev_entry;
    const char *symfile_addr;           /* the ELF image */
    uint64_t symfile_size;
};

struct jit_descriptor {
    uint32_t version;                   /* JIT_DESCRIPTOR_VERSION */
    uint32_t action_flag;               /* JIT_REGISTER_FN, ... */
    struct jit_code_entry *relevant_entry;  /* the entry acted on */
    struct jit_code_entry *first_entry;
};

/* gdb breaks here and reads the descriptor.  noinline and an asm
   statement with a memory clobber: the compiler may neither drop the call
   to an empty function nor sink the descriptor's stores past it.  GCC's
   noipa also keeps link-time optimization from merging it with another
   empty function (-fipa-icf) and calling that one instead. */
#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 8
#  define KEEP_CALL __attribute__((noipa, noinline, used))
#else
#  define KEEP_CALL __attribute__((noinline, used))
#endif

__attribute__((visibility("default"))) KEEP_CALL void
__jit_debug_register_code(void);
#undef KEEP_CALL

void
__jit_debug_register_code(void)
{
    __asm__ __volatile__("" ::: "memory");
}

__attribute__((visibility("default"), used))
struct jit_descriptor __jit_debug_descriptor = {
    JIT_DESCRIPTOR_VERSION, JIT_NOACTION, NULL, NULL
};

/* ----------------------------------------------------------------------
 * State
 */

typedef enum {
    GDB_JIT_NO_INIT,            /* template not described yet */
    GDB_JIT_OK,
    GDB_JIT_FAILED,             /* the template cannot be described */
} gdb_jit_status;

static struct {
    gdb_jit_status status;
    _PyPerf_TemplateCFI cfi;
} gdb_jit;

/* ----------------------------------------------------------------------
 * Emission
 *
 * The image's size is computed first and the buffer allocated to fit, so
 * the helpers write without checks; asserts guard the arithmetic.
 */

typedef struct {
    uint8_t *start;
    size_t pos;
    size_t size;
} imgbuf;

static void
emit_bytes(imgbuf *b, const void *bytes, size_t size)
{
    assert(b->pos + size <= b->size);
    memcpy(b->start + b->pos, bytes, size);
    b->pos += size;
}

static void
emit_u8(imgbuf *b, uint8_t v)
{
    emit_bytes(b, &v, 1);
}

/* Host byte order, which the ELF header declares (both hosts are
   little-endian). */
static void
emit_u32(imgbuf *b, uint32_t v)
{
    emit_bytes(b, &v, sizeof(v));
}

static void
emit_u64(imgbuf *b, uint64_t v)
{
    emit_bytes(b, &v, sizeof(v));
}

static void
emit_uleb128(imgbuf *b, uint64_t v)
{
    do {
        uint8_t byte = v & 0x7f;
        v >>= 7;
        emit_u8(b, v != 0 ? (byte | 0x80) : byte);
    } while (v != 0);
}

static void
emit_sleb128(imgbuf *b, int64_t v)
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
emit_padding(imgbuf *b, size_t align, uint8_t fill)
{
    while (b->pos % align != 0) {
        emit_u8(b, fill);
    }
}

/* A CIE or an FDE is a length-prefixed block: begin_block() reserves the
   4-byte length, end_block() pads the block with DW_CFA_nop to a multiple
   of 8 bytes (the length field included) and stores its length, which
   does not count the length field itself. */
static size_t
begin_block(imgbuf *b)
{
    size_t at = b->pos;
    emit_u32(b, 0);
    return at;
}

static void
end_block(imgbuf *b, size_t at)
{
    while ((b->pos - at) % 8 != 0) {
        emit_u8(b, DW_CFA_nop);
    }
    uint32_t length = (uint32_t)(b->pos - at - 4);
    memcpy(b->start + at, &length, sizeof(length));
}

/* ----------------------------------------------------------------------
 * The image
 */

static size_t
uleb128_size(uint64_t v)
{
    size_t n = 1;
    while (v >>= 7) {
        n++;
    }
    return n;
}

static size_t
sleb128_size(int64_t v)
{
    size_t n = 1;
    while (!((v >> 6) == 0 || (v >> 6) == -1)) {
        v >>= 7;
        n++;
    }
    return n;
}

/* Bytes of the CIE and of one FDE, padding included. */
static size_t
cie_size(const _PyPerf_TemplateCFI *cfi)
{
    size_t n = 4 + 4 + 1 + 3            /* length, id, version, "zR\0" */
               + uleb128_size(cfi->code_align)
               + sleb128_size(cfi->data_align)
               + 1 + 1 + 1              /* ra column, aug. size, encoding */
               + cfi->initial_size;
    return _Py_SIZE_ROUND_UP(n, 8);
}

static size_t
fde_size(const _PyPerf_TemplateCFI *cfi)
{
    /* length, CIE pointer, pc_begin, pc_range, augmentation size */
    return _Py_SIZE_ROUND_UP(4 + 4 + 8 + 8 + 1 + cfi->program_size, 8);
}

/* .eh_frame: the CIE, one FDE per slot, a zero terminator. */
static void
emit_eh_frame(imgbuf *b, const _PyPerf_TemplateCFI *cfi, uintptr_t code,
              size_t count, size_t slot_size)
{
    size_t cie = begin_block(b);
    emit_u32(b, 0);                         /* CIE id: 0 in .eh_frame */
    emit_u8(b, CIE_VERSION);
    emit_bytes(b, "zR", 3);                 /* augmentation, NUL included:
                                               'z' data size, 'R' FDE
                                               pointer encoding */
    emit_uleb128(b, cfi->code_align);       /* code alignment factor */
    emit_sleb128(b, cfi->data_align);       /* data alignment factor */
    emit_u8(b, (uint8_t)cfi->ra_column);    /* return address column
                                               (a byte in version 1) */
    emit_uleb128(b, 1);                     /* augmentation data size */
    emit_u8(b, DW_EH_PE_absptr);            /* 'R': FDE addresses are
                                               absolute, 8 bytes */
    emit_bytes(b, cfi->initial, cfi->initial_size);   /* rules at entry */
    end_block(b, cie);
    assert(b->pos - cie == cie_size(cfi));

    for (size_t i = 0; i < count; i++) {
        size_t fde = begin_block(b);
        /* CIE pointer: from this field back to the CIE */
        emit_u32(b, (uint32_t)(b->pos - cie));
        emit_u64(b, (uint64_t)(code + i * slot_size));  /* pc_begin */
        emit_u64(b, (uint64_t)cfi->code_size);          /* pc_range */
        emit_uleb128(b, 0);                 /* augmentation data size */
        emit_bytes(b, cfi->program, cfi->program_size);
        end_block(b, fde);
        assert(b->pos - fde == fde_size(cfi));
    }
    emit_u32(b, 0);                         /* terminator: a zero length */
}

/* .symtab: the null symbol, then one function per slot. */
static void
emit_symtab(imgbuf *b, const _PyPerf_TemplateCFI *cfi, size_t count,
            size_t slot_size)
{
    Elf64_Sym sym;
    memset(&sym, 0, sizeof(sym));
    emit_bytes(b, &sym, sizeof(sym));
    sym.st_name = SYMBOL_NAME_OFFSET;
    /* Local, as static functions are: many may share the name. */
    sym.st_info = ELF64_ST_INFO(STB_LOCAL, STT_FUNC);
    sym.st_other = STV_DEFAULT;
    sym.st_shndx = SEC_TEXT;
    sym.st_size = cfi->code_size;
    for (size_t i = 0; i < count; i++) {
        sym.st_value = i * slot_size;       /* ET_REL: offset in .text */
        emit_bytes(b, &sym, sizeof(sym));
    }
}

static Elf64_Shdr
section(int index, Elf64_Word type, Elf64_Xword flags, Elf64_Addr addr,
        Elf64_Off offset, Elf64_Xword size, Elf64_Xword align)
{
    Elf64_Shdr sh;
    memset(&sh, 0, sizeof(sh));
    sh.sh_name = section_names[index];
    sh.sh_type = type;
    sh.sh_flags = flags;
    sh.sh_addr = addr;
    sh.sh_offset = offset;
    sh.sh_size = size;
    sh.sh_addralign = align;
    return sh;
}

/* Build the image describing `count` slots of `slot_size` bytes at
   `code` (an arena of `size` bytes) into a new buffer; its size goes to
   *image_size, preceded in the same allocation by room for an entry.
   Returns the buffer, or NULL if memory is short. */
static struct jit_code_entry *
build_image(const _PyPerf_TemplateCFI *cfi, uintptr_t code, size_t size,
            size_t slot_size, size_t count)
{
    /* (Arenas are small: this only keeps the arithmetic below exact.) */
    if (count > (size_t)INT32_MAX / (fde_size(cfi) + sizeof(Elf64_Sym))) {
        return NULL;
    }
    size_t eh_frame_at = sizeof(Elf64_Ehdr);
    size_t eh_frame_size = cie_size(cfi) + count * fde_size(cfi) + 4;
    size_t symtab_at = _Py_SIZE_ROUND_UP(eh_frame_at + eh_frame_size, 8);
    size_t symtab_size = (count + 1) * sizeof(Elf64_Sym);
    size_t strtab_at = symtab_at + symtab_size;
    size_t shstrtab_at = strtab_at + sizeof(strtab);
    size_t headers_at = _Py_SIZE_ROUND_UP(shstrtab_at + sizeof(shstrtab),
                                          8);
    size_t image_size = headers_at + SEC_COUNT * sizeof(Elf64_Shdr);

    /* The entry, then the image, in one block: both live as long as the
       arena, that is, as long as the process. */
    size_t entry_size = _Py_SIZE_ROUND_UP(sizeof(struct jit_code_entry), 16);
    char *block = PyMem_RawMalloc(entry_size + image_size);
    if (block == NULL) {
        return NULL;
    }
    struct jit_code_entry *entry = (struct jit_code_entry *)block;
    memset(entry, 0, sizeof(*entry));
    entry->symfile_addr = block + entry_size;
    entry->symfile_size = image_size;

    imgbuf b = {.start = (uint8_t *)block + entry_size, .size = image_size};

    Elf64_Ehdr eh;
    memset(&eh, 0, sizeof(eh));
    memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_ident[EI_OSABI] = ELFOSABI_NONE;
    eh.e_type = ET_REL;             /* gdb takes section addresses as
                                       given, and needs no segments */
    eh.e_machine = HOST_MACHINE;
    eh.e_version = EV_CURRENT;
    eh.e_shoff = headers_at;
    eh.e_ehsize = sizeof(Elf64_Ehdr);
    eh.e_shentsize = sizeof(Elf64_Shdr);
    eh.e_shnum = SEC_COUNT;
    eh.e_shstrndx = SEC_SHSTRTAB;
    emit_bytes(&b, &eh, sizeof(eh));

    emit_eh_frame(&b, cfi, code, count, slot_size);
    assert(b.pos == eh_frame_at + eh_frame_size);
    emit_padding(&b, 8, 0);
    emit_symtab(&b, cfi, count, slot_size);
    emit_bytes(&b, strtab, sizeof(strtab));
    emit_bytes(&b, shstrtab, sizeof(shstrtab));
    emit_padding(&b, 8, 0);
    assert(b.pos == headers_at);

    Elf64_Shdr sh[SEC_COUNT];
    memset(&sh[SEC_NULL], 0, sizeof(sh[SEC_NULL]));
    /* The arena: addresses only, the bytes are in the process. */
    sh[SEC_TEXT] = section(SEC_TEXT, SHT_NOBITS, SHF_ALLOC | SHF_EXECINSTR,
                           code, eh_frame_at, size, 16);
    sh[SEC_EH_FRAME] = section(SEC_EH_FRAME, SHT_PROGBITS, 0, 0,
                               eh_frame_at, eh_frame_size, 8);
    sh[SEC_SYMTAB] = section(SEC_SYMTAB, SHT_SYMTAB, 0, 0, symtab_at,
                             symtab_size, 8);
    sh[SEC_SYMTAB].sh_link = SEC_STRTAB;
    sh[SEC_SYMTAB].sh_info = (Elf64_Word)(count + 1);  /* first global:
                                                          none */
    sh[SEC_SYMTAB].sh_entsize = sizeof(Elf64_Sym);
    sh[SEC_STRTAB] = section(SEC_STRTAB, SHT_STRTAB, 0, 0, strtab_at,
                             sizeof(strtab), 1);
    sh[SEC_SHSTRTAB] = section(SEC_SHSTRTAB, SHT_STRTAB, 0, 0, shstrtab_at,
                               sizeof(shstrtab), 1);
    emit_bytes(&b, sh, sizeof(sh));
    assert(b.pos == image_size);
    return entry;
}

/* ----------------------------------------------------------------------
 * Entry point
 */

void
_PyPerf_GdbRegisterCode(const void *code, size_t size, size_t slot_size)
{
    if (gdb_jit.status == GDB_JIT_NO_INIT) {
        int saved = errno;
        gdb_jit.status = _PyPerf_DescribeTemplate(&gdb_jit.cfi) < 0
                         ? GDB_JIT_FAILED : GDB_JIT_OK;
        errno = saved;
    }
    if (gdb_jit.status != GDB_JIT_OK || slot_size < gdb_jit.cfi.code_size) {
        return;
    }
    size_t count = size / slot_size;
    struct jit_code_entry *entry = build_image(&gdb_jit.cfi,
                                               (uintptr_t)code, size,
                                               slot_size, count);
    if (entry == NULL) {
        return;     /* only debuggers miss it */
    }
    /* Link it at the head of the list, then tell gdb. */
    struct jit_descriptor *d = &__jit_debug_descriptor;
    entry->prev_entry = NULL;
    entry->next_entry = d->first_entry;
    if (d->first_entry != NULL) {
        d->first_entry->prev_entry = entry;
    }
    d->first_entry = entry;
    d->relevant_entry = entry;
    d->action_flag = JIT_REGISTER_FN;
    __jit_debug_register_code();
    d->action_flag = JIT_NOACTION;
    d->relevant_entry = NULL;
}

#else   /* no perf trampolines */

void
_PyPerf_GdbRegisterCode(const void *code, size_t size, size_t slot_size)
{
}

#endif
