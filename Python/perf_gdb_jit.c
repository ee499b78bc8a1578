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
 * instructions.  So one image describes all of an arena's trampolines,
 * before they are handed out, and costs the same for 1 or 4000 of them:
 * one FDE covering the arena, whose rules find the pc's offset in its slot
 * and apply the template's rules for that offset (Python/perf_unwind.c,
 * from the description the jitdump uses), and one function symbol
 * covering the arena.  The core registers each arena when it maps it.
 * Nothing is ever unregistered: arenas are never unmapped.
 *
 * The image, a relocatable ELF64 file for the host machine, for the `size`
 * bytes of slots from address a:
 *
 *     offset 0   +-----------------------------------------+
 *                | ELF header (ET_REL, no program headers) |
 *            64  +-----------------------------------------+
 *                | .eh_frame   CIE: "zR", absolute FDE     |
 *                |               pointers, initial rules   |
 *                |             FDE: [a, a + size), rules   |
 *                |               by offset in the slot     |
 *                |             zero terminator             |
 *                +-----------------------------------------+ (8-aligned)
 *                | .symtab     null symbol, then one local |
 *                |             FUNC symbol: [a, a + size)  |
 *                | .strtab     "\0py_trampoline\0"         |
 *                | .shstrtab   section names               |
 *                +-----------------------------------------+ (8-aligned)
 *                | section headers: null, .text, .eh_frame,|
 *                |   .symtab, .strtab, .shstrtab           |
 *                +-----------------------------------------+
 *
 * .text has no bytes in the image (SHT_NOBITS): its address and size are
 * the slots', so gdb places the image's symbol and FDE there and reads
 * the instructions from the process.  gdb takes the sections' addresses as
 * absolute, and (ET_REL) a symbol's value is its offset in .text.  The FDE
 * pointers are absolute 8-byte addresses (DW_EH_PE_absptr): no pointer
 * depends on where the image itself lies.  .eh_frame is not SHF_ALLOC: it
 * is data for the debugger, not part of the process image.
 *
 * Memory.  About 600 bytes per arena (headers, CIE, the FDE's rules,
 * string tables, the list entry): nothing per trampoline.  Every frame of
 * every trampoline of an arena is named py_trampoline; the Python function
 * is in the frame above it (py-bt, or the perf map).
 *
 * The symbols.  gdb looks both names up in every object file: they have to
 * be these, with default visibility (in .dynsym, so a stripped python still
 * has them), and survive optimization (the call to an empty function is
 * the whole protocol).  Other JITs (LLVM's, LuaJIT, wasmtime, V8) define
 * the same pair, so ours are weak: a program or library that links a
 * static libpython next to its own pair links, and its definitions win;
 * we then append our images to its list, which is what the protocol
 * expects (gdb reads entries, not owners).  Between shared objects the
 * dynamic linker binds every reference to the first definition in search
 * order, weak or not: a JIT library loaded into python appends to the
 * same list as we do.  Not calls from a library linked
 * -Bsymbolic-functions (Debian's libpython), which bind to its own
 * function while the descriptor, data, is the first definition: with a
 * program that has its own pair, gdb would be told through the wrong
 * object file, whose list is empty.  So the function is looked up as the
 * descriptor is, once, by name (gdb_state.register_code).  The list is
 * changed with the GIL held; another JIT changing it from a thread
 * without the GIL could race with us, as with any two registrants of one
 * list.
 *
 * Fork.  A child inherits the arenas, the images and the list, all in its
 * own copy of the memory: nothing to do.
 *
 * Failures (no memory, a template the CFI tables do not match) only cost
 * debuggers the description: never an error, never a warning.
 */

#include "Python.h"
#include "pycore_perf.h"          // _PyPerf_GdbRegisterCode()

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <dlfcn.h>                // dlsym()
#include <elf.h>                  // Elf64_Ehdr, Elf64_Shdr, Elf64_Sym
#include <errno.h>
#include <stdint.h>
#include <string.h>

/* ----------------------------------------------------------------------
 * Constants
 */

/* gdb's JIT interface, version 1 (GDB manual, "JIT Compilation
   Interface") */
#define JIT_DESCRIPTOR_VERSION  1
#define JIT_NOACTION            0
#define JIT_REGISTER_FN         1

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

__attribute__((visibility("default"), weak)) KEEP_CALL void
__jit_debug_register_code(void);
#undef KEEP_CALL

void
__jit_debug_register_code(void)
{
    __asm__ __volatile__("" ::: "memory");
}

__attribute__((visibility("default"), weak, used))
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
    void (*register_code)(void);    /* the first __jit_debug_register_code */
} gdb_state;

/* ----------------------------------------------------------------------
 * The image
 *
 * Its size is computed first and the buffer allocated to fit; asserts
 * check the arithmetic.
 */

static void
emit_padding(_PyPerf_Dwarf *b, size_t align)
{
    while (b->pos % align != 0) {
        _PyPerf_EmitU8(b, 0);
    }
}

/* .eh_frame: the CIE, one FDE for all the slots, a zero terminator. */
static void
emit_eh_frame(_PyPerf_Dwarf *b, const _PyPerf_TemplateCFI *cfi,
              uintptr_t code, size_t size, size_t slot_size)
{
    /* FDE addresses are absolute, 8 bytes: nothing depends on where the
       image itself lies. */
    size_t cie = _PyPerf_EmitCIE(b, cfi, _PyPerf_DW_EH_PE_absptr);
    _PyPerf_EmitSlotsFDE(b, cie, cfi, code, size, slot_size);
    _PyPerf_EmitU32(b, 0);                  /* terminator: a zero length */
}

/* .symtab: the null symbol, then one function covering all the slots. */
static void
emit_symtab(_PyPerf_Dwarf *b, size_t size)
{
    Elf64_Sym sym;
    memset(&sym, 0, sizeof(sym));
    _PyPerf_EmitBytes(b, &sym, sizeof(sym));
    sym.st_name = SYMBOL_NAME_OFFSET;
    /* Local, as static functions are: every image has one. */
    sym.st_info = ELF64_ST_INFO(STB_LOCAL, STT_FUNC);
    sym.st_other = STV_DEFAULT;
    sym.st_shndx = SEC_TEXT;
    sym.st_value = 0;                       /* ET_REL: offset in .text */
    sym.st_size = size;
    _PyPerf_EmitBytes(b, &sym, sizeof(sym));
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

/* Build the image describing the `size` bytes of slots (`slot_size` bytes
   each) at `code` in one new block: a jit_code_entry, then the image it
   points at (symfile_addr, symfile_size).  Returns the entry, or NULL if
   it cannot be made. */
static struct jit_code_entry *
build_image(const _PyPerf_TemplateCFI *cfi, uintptr_t code, size_t size,
            size_t slot_size)
{
    _PyPerf_Dwarf m = {.start = NULL, .size = 0};
    emit_eh_frame(&m, cfi, code, size, slot_size);
    size_t eh_frame_at = sizeof(Elf64_Ehdr);
    size_t eh_frame_size = m.pos;
    size_t symtab_at = _Py_SIZE_ROUND_UP(eh_frame_at + eh_frame_size, 8);
    size_t symtab_size = 2 * sizeof(Elf64_Sym);
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

    _PyPerf_Dwarf b = {.start = (uint8_t *)block + entry_size,
                       .size = image_size};

    Elf64_Ehdr eh;
    memset(&eh, 0, sizeof(eh));
    memcpy(eh.e_ident, ELFMAG, SELFMAG);
    eh.e_ident[EI_CLASS] = ELFCLASS64;
    eh.e_ident[EI_DATA] = ELFDATA2LSB;
    eh.e_ident[EI_VERSION] = EV_CURRENT;
    eh.e_ident[EI_OSABI] = ELFOSABI_NONE;
    eh.e_type = ET_REL;             /* gdb takes section addresses as
                                       given, and needs no segments */
    eh.e_machine = _PyPerf_EM_HOST;
    eh.e_version = EV_CURRENT;
    eh.e_shoff = headers_at;
    eh.e_ehsize = sizeof(Elf64_Ehdr);
    eh.e_shentsize = sizeof(Elf64_Shdr);
    eh.e_shnum = SEC_COUNT;
    eh.e_shstrndx = SEC_SHSTRTAB;
    _PyPerf_EmitBytes(&b, &eh, sizeof(eh));

    emit_eh_frame(&b, cfi, code, size, slot_size);
    assert(b.pos == eh_frame_at + eh_frame_size);
    emit_padding(&b, 8);
    emit_symtab(&b, size);
    _PyPerf_EmitBytes(&b, strtab, sizeof(strtab));
    _PyPerf_EmitBytes(&b, shstrtab, sizeof(shstrtab));
    emit_padding(&b, 8);
    assert(b.pos == headers_at);

    Elf64_Shdr sh[SEC_COUNT];
    memset(&sh[SEC_NULL], 0, sizeof(sh[SEC_NULL]));
    /* The slots: addresses only, the bytes are in the process. */
    sh[SEC_TEXT] = section(SEC_TEXT, SHT_NOBITS, SHF_ALLOC | SHF_EXECINSTR,
                           code, eh_frame_at, size, 16);
    sh[SEC_EH_FRAME] = section(SEC_EH_FRAME, SHT_PROGBITS, 0, 0,
                               eh_frame_at, eh_frame_size, 8);
    sh[SEC_SYMTAB] = section(SEC_SYMTAB, SHT_SYMTAB, 0, 0, symtab_at,
                             symtab_size, 8);
    sh[SEC_SYMTAB].sh_link = SEC_STRTAB;
    sh[SEC_SYMTAB].sh_info = 2;     /* first global: none */
    sh[SEC_SYMTAB].sh_entsize = sizeof(Elf64_Sym);
    sh[SEC_STRTAB] = section(SEC_STRTAB, SHT_STRTAB, 0, 0, strtab_at,
                             sizeof(strtab), 1);
    sh[SEC_SHSTRTAB] = section(SEC_SHSTRTAB, SHT_STRTAB, 0, 0, shstrtab_at,
                               sizeof(shstrtab), 1);
    _PyPerf_EmitBytes(&b, sh, sizeof(sh));
    assert(b.pos == image_size);
    return entry;
}

/* ----------------------------------------------------------------------
 * Entry point
 */

void
_PyPerf_GdbRegisterCode(const void *code, size_t size, size_t slot_size)
{
    if (gdb_state.status == GDB_JIT_NO_INIT) {
        /* No warning on failure: these tables are a silent extra (the
           perf_jit backend reports a template it cannot describe). */
        int saved = errno;
        int res = _PyPerf_DescribeCode(
            _PyPerf_EM_HOST, (const uint8_t *)_PyPerf_TemplateStart,
            _PyPerf_TemplateEnd - _PyPerf_TemplateStart, &gdb_state.cfi, 0);
        gdb_state.status = res < 0 ? GDB_JIT_FAILED : GDB_JIT_OK;
        /* NULL when the program does not export it: then ours is the one
           the descriptor goes with. */
        void *first = dlsym(RTLD_DEFAULT, "__jit_debug_register_code");
        gdb_state.register_code = (first != NULL
                                   ? (void (*)(void))first
                                   : __jit_debug_register_code);
        errno = saved;
    }
    if (gdb_state.status != GDB_JIT_OK
        || slot_size < gdb_state.cfi.code_size)
    {
        return;
    }
    struct jit_code_entry *entry = build_image(&gdb_state.cfi,
                                               (uintptr_t)code, size,
                                               slot_size);
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
    gdb_state.register_code();
    d->action_flag = JIT_NOACTION;
    d->relevant_entry = NULL;
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
