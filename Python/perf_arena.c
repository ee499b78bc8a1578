/*
 * Perf trampolines: the arenas they live in
 * =========================================
 *
 * Trampolines are copies of the template in Python/asm_trampoline.S.  An
 * arena is mapped read-write, filled with template copies, then made
 * read-execute (never writable and executable at once) and handed out
 * with a bump pointer, one or more slots at a time (as many as the
 * backend's span() asks for):
 *
 *     arena: | template | template | template | ... | template |
 *            ^ handed out            ^ next            ^ limit
 *
 * A slot, once handed out, belongs to its code object forever: some thread
 * may still be running inside it (a frame that entered before a
 * deactivation, a generator suspended in it), so arenas are never
 * unmapped.  Debuggers learn about each arena as it is mapped
 * (Python/perf_gdb_jit.c).  The state is _PyPerf_core's, changed with the
 * GIL held.
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <pthread.h>              // pthread_atfork()
#include <sys/mman.h>             // mmap(), mprotect()
#include <unistd.h>               // sysconf()

/* Bytes mapped per arena (rounded up to whole pages). */
#define ARENA_SIZE (64 * 1024)

/* Unmapped-for-use address space kept below each arena.  perf's DWARF
   unwinder reads any address within a sample's stack copy (up to 65528
   bytes above the stack pointer) from that copy, the unwind tables of a
   trampoline included; a thread stack mapped just below an arena would
   give them the stack's bytes, and every sample in that thread would stop
   at the first trampoline not yet looked up elsewhere. */
#define ARENA_GAP (64 * 1024)

/* Each trampoline starts on its own 16-byte boundary: branch targets. */
#define SLOT_ALIGN 16

/* Where the template has BTI landing pads, ask for them to be enforced in
   the arenas as they are in the interpreter's own text (a kernel without
   BTI support refuses PROT_BTI with EINVAL: the arena then goes without). */
#if defined(__aarch64__) && defined(__ARM_FEATURE_BTI_DEFAULT) \
    && defined(PROT_BTI)
#  define ARENA_PROT (PROT_READ | PROT_EXEC | PROT_BTI)
#else
#  define ARENA_PROT (PROT_READ | PROT_EXEC)
#endif


static int
new_arena(void)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) {
        page = 4096;
    }
    size_t size = _Py_SIZE_ROUND_UP(ARENA_SIZE, (size_t)page);
    size_t gap = _Py_SIZE_ROUND_UP(ARENA_GAP, (size_t)page);
    char *base = mmap(NULL, gap + size, PROT_NONE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        return -1;
    }
    char *mem = base + gap;
    if (mprotect(mem, size, PROT_READ | PROT_WRITE) < 0) {
        int saved = errno;
        munmap(base, gap + size);
        errno = saved;
        return -1;
    }
    /* A template at the start of every slot: one copy, then the filled
       part copied onto the rest, doubling. */
    size_t count = size / _PyPerf_core.slot_size;
    size_t filled = _PyPerf_core.slot_size;
    memcpy(mem, _PyPerf_TemplateStart, _PyPerf_core.code_size);
    while (filled < count * _PyPerf_core.slot_size) {
        size_t chunk = Py_MIN(filled, count * _PyPerf_core.slot_size - filled);
        memcpy(mem + filled, mem, chunk);
        filled += chunk;
    }
    if (mprotect(mem, size, ARENA_PROT) < 0
        && (ARENA_PROT == (PROT_READ | PROT_EXEC)
            || errno != EINVAL
            || mprotect(mem, size, PROT_READ | PROT_EXEC) < 0))
    {
        int saved = errno;
        munmap(base, gap + size);
        errno = saved;
        return -1;
    }
    __builtin___clear_cache(mem, mem + size);
    _PyPerf_core.next = mem;
    _PyPerf_core.limit = mem + count * _PyPerf_core.slot_size;
    /* Every slot holds a trampoline from now on: debuggers can be told
       about the whole arena at once (Python/perf_gdb_jit.c). */
    _PyPerf_GdbRegisterCode(mem, count * _PyPerf_core.slot_size,
                            _PyPerf_core.slot_size);
    return 0;
}

/* In a forked child (by any fork() that runs the at-fork handlers,
   PyOS_AfterFork_Child() or not): the current arena is full.  perf copies
   the parent's mappings into the child at the fork and names their
   addresses from the parent's map for good, where the parent goes on
   handing out the same free slots; so the child's new trampolines go in
   arenas it maps itself, which perf names from the child's map.  The
   inherited arenas stay mapped: their trampolines may be on the C stack. */
static void
leave_inherited_arena(void)
{
    _PyPerf_core.next = _PyPerf_core.limit;
}

static pthread_once_t fork_handler_once = PTHREAD_ONCE_INIT;
static int fork_handler_error;

static void
register_fork_handler(void)
{
    fork_handler_error = pthread_atfork(NULL, NULL, leave_inherited_arena);
}

/* Make sure executable memory can be had: the first arena.  The answer is
   kept, so a refusal (e.g. SELinux execmem) is decided once. */
int
_PyPerf_InitArenas(void)
{
    if (_PyPerf_core.arena_status == _PyPerf_ARENAS_UNTRIED) {
        _PyPerf_core.code_size = _PyPerf_TemplateEnd - _PyPerf_TemplateStart;
        _PyPerf_core.return_offset =
            _PyPerf_TemplateReturn - _PyPerf_TemplateStart;
        _PyPerf_core.slot_size = _Py_SIZE_ROUND_UP(_PyPerf_core.code_size,
                                                   SLOT_ALIGN);
        /* Before the first arena: a child must never take its slots. */
        pthread_once(&fork_handler_once, register_fork_handler);
        if (fork_handler_error != 0) {
            _PyPerf_core.arena_status = _PyPerf_ARENAS_REFUSED;
            _PyPerf_core.arena_errno = fork_handler_error;
        }
        else if (new_arena() < 0) {
            _PyPerf_core.arena_status = _PyPerf_ARENAS_REFUSED;
            _PyPerf_core.arena_errno = errno;
        }
        else {
            _PyPerf_core.arena_status = _PyPerf_ARENAS_OK;
        }
    }
    if (_PyPerf_core.arena_status == _PyPerf_ARENAS_REFUSED) {
        errno = _PyPerf_core.arena_errno;
        return -1;
    }
    return 0;
}

/* Hand out a trampoline that owns `span` bytes of address space: one slot,
   or several consecutive ones (the first holds the trampoline). */
char *
_PyPerf_NewSlot(size_t span)
{
    /* Whole slots: slot_size need not be a power of two. */
    size_t slots = (Py_MAX(span, _PyPerf_core.code_size)
                    + _PyPerf_core.slot_size - 1) / _PyPerf_core.slot_size;
    size_t size = slots * _PyPerf_core.slot_size;
    if ((size_t)(_PyPerf_core.limit - _PyPerf_core.next) < size
        && new_arena() < 0)
    {
        /* Don't try again for every new code object. */
        _PyPerf_core.arena_status = _PyPerf_ARENAS_REFUSED;
        _PyPerf_core.arena_errno = errno;
        return NULL;
    }
    char *slot = _PyPerf_core.next;
    _PyPerf_core.next += size;
    return slot;
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
