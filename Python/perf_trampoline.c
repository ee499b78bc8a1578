/*
 * Perf trampolines: Python functions in native profilers
 * ======================================================
 *
 * perf, and every tool that walks native stacks, sees a Python program as
 * _PyEval_EvalFrameDefault calling itself: all Python functions run in the
 * same C function, so their samples cannot be told apart.  We give each code
 * object a tiny native function of its own, a *trampoline*, that calls the
 * evaluator and returns.  The trampoline's address range is unique to the
 * code object and we tell the profiler its name:
 *
 *     without                       with
 *
 *     _PyEval_EvalFrameDefault      _PyEval_EvalFrameDefault
 *     _PyEval_EvalFrameDefault      py::parse:/srv/app.py      <- trampoline
 *     _PyEval_EvalFrameDefault      _PyEval_EvalFrameDefault
 *     main                          py::<module>:/srv/app.py   <- trampoline
 *                                   main
 *
 * Trampolines are copies of the template in Python/asm_trampoline.S.  The
 * template keeps a frame record (saved frame pointer + return address), so
 * a frame-pointer unwinder steps from _PyEval_EvalFrameDefault into the
 * trampoline and on into the caller.  That requires the interpreter to be
 * built with frame pointers (configure's default when this is enabled), or
 * with --with-frame-pointers=python: records in the evaluator and the
 * trampolines only, and the frame pointer register left alone elsewhere;
 * the perf_jit backend instead describes the trampolines with DWARF
 * unwind info.
 *
 * Memory.  Trampolines live in arenas: an arena is mapped read-write, filled
 * with template copies, then made read-execute (never writable and
 * executable at once) and handed out with a bump pointer, one or more slots
 * at a time (as many as the backend's span() asks for):
 *
 *     arena: | template | template | template | ... | template |
 *            ^ handed out            ^ next            ^ limit
 *
 * A slot, once handed out, belongs to its code object forever: some thread
 * may still be running inside it (a frame that entered before a
 * deactivation, a generator suspended in it), so arenas are never unmapped.
 * The trampoline is found through a co_extra slot of the code object (one
 * index per interpreter and backend), created on the first call.
 *
 * Entry.  The PEP 523 frame-evaluation hook, _PyPerf_EvalFrame,
 * runs every frame that goes through _PyEval_EvalFrame via its trampoline
 * while the thread's C stack has room for it.  Python-to-Python calls do not
 * go through it: ceval.c keeps its specialized call instructions while our
 * hook is installed and calls the callee's trampoline directly
 * (_PyPerf_ForCall), falling back to its ordinary inlined call when the
 * room is used up or unknown, or no trampoline can be had.  Nor do
 * generators and coroutines resumed by FOR_ITER and SEND: the evaluator
 * runs them through their trampolines itself, where stock 3.11 recurses
 * through gen_send_ex2().  Anything that fails here falls back to
 * _PyEval_EvalFrameDefault: the hook never changes what the program does,
 * but for a RecursionError where the C stack is nearly used up (see "The
 * C stack").
 *
 * Output.  A backend tells the profiler about each new trampoline: the perf
 * map (/tmp/perf-<pid>.map, Python/perf_map.c) or a jitdump
 * (Python/perf_jit_trampoline.c), both through the small interface in
 * Include/internal/pycore_perf.h; this file knows nothing of their
 * formats.  perf reads those files (perf report, perf inject) long after the
 * process is gone, so they are never removed.  A forked child has a new
 * pid, so it starts its own file holding everything it inherited, and
 * takes its new trampolines from arenas of its own (perf names what the
 * child inherited from the parent's file).
 * Debuggers learn about each arena as it is mapped (Python/perf_gdb_jit.c,
 * gdb's JIT interface).
 *
 * Everything here runs with the GIL held (3.11 has one GIL for all
 * interpreters), which serializes all state changes and the core's file
 * writes.  (C API callers without the GIL write to the perf map too: it
 * has a lock of its own, Python/perf_map.c.)
 */

#include "Python.h"
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_initconfig.h"    // _PyStatus_OK()
#include "pycore_interp.h"        // PyInterpreterState.eval_frame
#include "pycore_perf.h"
#include "pycore_pystate.h"       // _PyInterpreterState_GET()

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <fcntl.h>                // open()
#include <pthread.h>              // pthread_getattr_np(), pthread_atfork()
#include <sys/resource.h>         // getrlimit()
#include <sys/syscall.h>          // SYS_gettid
#include <sys/mman.h>             // mmap(), mprotect()
#include <unistd.h>               // sysconf()

/* ----------------------------------------------------------------------
 * Constants
 */

/* Bytes mapped per arena (rounded up to whole pages). */
#define ARENA_SIZE (64 * 1024)

/* Each trampoline starts on its own 16-byte boundary: branch targets. */
#define SLOT_ALIGN 16

/* Name budget in bytes (after escaping): a longer name is cut and ends in
   "...".  Keeps every entry one bounded line. */
#define MAX_QUALNAME 1024
#define MAX_FILENAME 2048

/* How deep in class bodies a code object's first run looks for the code
   objects they define (see new_nested()). */
#define MAX_CLASS_NESTING 4

/* Trampolines, and the evaluator frames of the calls run through them
   instead of inline, may hold at most 1/STACK_ROOM_DIVISOR of a thread's
   C stack at a time (see "The C stack"). */
#define STACK_ROOM_DIVISOR 25

/* Frames entering the evaluator from C within this many bytes of the
   bottom of a thread's C stack raise RecursionError: room to raise it,
   unwind and report it: 1/STACK_RESERVE_DIVISOR of the stack, from
   STACK_RESERVE_MIN to STACK_RESERVE (the extension, PY_PERF_EXTENSION:
   STACK_RESERVE), and never more than a quarter of it. */
#define STACK_RESERVE_DIVISOR 64
#define STACK_RESERVE_MIN (4 * 1024)
#define STACK_RESERVE (64 * 1024)

/* Where the template has BTI landing pads, ask for them to be enforced in
   the arenas as they are in the interpreter's own text (a kernel without
   BTI support refuses PROT_BTI with EINVAL: the arena then goes without). */
#if defined(__aarch64__) && defined(__ARM_FEATURE_BTI_DEFAULT) \
    && defined(PROT_BTI)
#  define ARENA_PROT (PROT_READ | PROT_EXEC | PROT_BTI)
#else
#  define ARENA_PROT (PROT_READ | PROT_EXEC)
#endif

/* ----------------------------------------------------------------------
 * State
 */

/* The backends, by the names sys.activate_stack_trampoline() and the
   configuration use. */
static const struct {
    const char *name;
    const _PyPerf_Backend *backend;
} backends[] = {
    {"perf", &_PyPerf_MapBackend},
#ifdef PY_HAVE_PERF_JIT_TRAMPOLINE
    {"perf_jit", &_PyPerf_JitBackend},
#endif
};
#define BACKEND_COUNT ((int)Py_ARRAY_LENGTH(backends))
#ifdef PY_HAVE_PERF_JIT_TRAMPOLINE
#  define BACKEND_NAMES "'perf', 'perf_jit'"
#else
#  define BACKEND_NAMES "'perf'"
#endif

/* An interpreter that activated trampolines at least once. */
struct _PyPerf_Interp {
    int64_t interp_id;
    const _PyPerf_Backend *backend;     /* active backend, NULL if none */
    /* Another PEP 523 function, run by the trampolines in our place (see
       "Other frame evaluation functions"), or NULL. */
    _PyFrameEvalFunction chained;
    /* co_extra index per backend (each backend's trampolines are described
       in its own output), -1 until requested */
    Py_ssize_t extra_index[BACKEND_COUNT];
};
typedef struct _PyPerf_Interp perf_interp;

_PyPerf_Core _PyPerf_core = {.main_index = -1, .fork_copy = 1};

_PyPerf_TLS _PyPerf_Stack _PyPerf_stack;

static int
backend_number(const _PyPerf_Backend *backend)
{
    for (int i = 0; i < BACKEND_COUNT; i++) {
        if (backends[i].backend == backend) {
            return i;
        }
    }
    Py_UNREACHABLE();
}

/* ----------------------------------------------------------------------
 * Arenas
 */

static int
new_arena(void)
{
    long page = sysconf(_SC_PAGESIZE);
    if (page <= 0) {
        page = 4096;
    }
    size_t size = _Py_SIZE_ROUND_UP(ARENA_SIZE, (size_t)page);
    char *mem = mmap(NULL, size, PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (mem == MAP_FAILED) {
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
        munmap(mem, size);
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
static int
init_arenas(void)
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
static char *
new_slot(size_t span)
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

/* ----------------------------------------------------------------------
 * Names: "py::<qualname>:<filename>"
 *
 * Written byte by byte from the str's code points, so it cannot fail or
 * raise (code objects' names are ready strings; anything else is "?"):
 * control characters (which could end a map line) become \xNN, lone
 * surrogates (not encodable as UTF-8) become \uXXXX, everything else is
 * UTF-8.  Each part has a byte budget.
 */

static size_t
append_escaped(char *buf, size_t pos, size_t budget, PyObject *str)
{
    static const char hex[] = "0123456789abcdef";
    size_t end = pos + budget;
    if (!PyUnicode_Check(str) || !PyUnicode_IS_READY(str)) {
        buf[pos++] = '?';
        return pos;
    }
    int kind = PyUnicode_KIND(str);
    const void *data = PyUnicode_DATA(str);
    Py_ssize_t length = PyUnicode_GET_LENGTH(str);
    Py_ssize_t i = 0;
    if (PyUnicode_IS_ASCII(str)) {
        /* The common case: copy the printable prefix in one go (the
           whole string, or as much as the budget takes, for most). */
        const unsigned char *ascii = data;
        Py_ssize_t room = (Py_ssize_t)(end - pos) - 3;
        Py_ssize_t n = Py_MAX(Py_MIN(length, room), 0);
        if (_PyPerf_CountControls(ascii, (size_t)n) == 0) {
            i = n;
        }
        else {
            while (i < n && !_PyPerf_IsControl(ascii[i])) {
                i++;
            }
        }
        memcpy(buf + pos, ascii, i);
        pos += i;
    }
    for (; i < length; i++) {
        Py_UCS4 ch = PyUnicode_READ(kind, data, i);
        char enc[8];
        int n = 0;
        if (ch < 0x20 || (ch >= 0x7f && ch < 0xa0)) {
            enc[n++] = '\\';
            enc[n++] = 'x';
            enc[n++] = hex[(ch >> 4) & 0xf];
            enc[n++] = hex[ch & 0xf];
        }
        else if (ch < 0x80) {
            enc[n++] = (char)ch;
        }
        else if (ch < 0x800) {
            enc[n++] = (char)(0xc0 | (ch >> 6));
            enc[n++] = (char)(0x80 | (ch & 0x3f));
        }
        else if (Py_UNICODE_IS_SURROGATE(ch)) {
            enc[n++] = '\\';
            enc[n++] = 'u';
            for (int shift = 12; shift >= 0; shift -= 4) {
                enc[n++] = hex[(ch >> shift) & 0xf];
            }
        }
        else if (ch < 0x10000) {
            enc[n++] = (char)(0xe0 | (ch >> 12));
            enc[n++] = (char)(0x80 | ((ch >> 6) & 0x3f));
            enc[n++] = (char)(0x80 | (ch & 0x3f));
        }
        else {
            enc[n++] = (char)(0xf0 | (ch >> 18));
            enc[n++] = (char)(0x80 | ((ch >> 12) & 0x3f));
            enc[n++] = (char)(0x80 | ((ch >> 6) & 0x3f));
            enc[n++] = (char)(0x80 | (ch & 0x3f));
        }
        /* Keep room for "..." after any character. */
        if (pos + n + 3 > end) {
            memcpy(buf + pos, "...", 3);
            return pos + 3;
        }
        memcpy(buf + pos, enc, n);
        pos += n;
    }
    return pos;
}

/* Format the entry name of `co` into buf (no NUL); return its length.
   buf must hold _PyPerf_MAX_NAME bytes. */
static size_t
format_name(PyCodeObject *co, char *buf)
{
    size_t pos = 0;
    memcpy(buf, "py::", 4);
    pos = append_escaped(buf, 4, MAX_QUALNAME, co->co_qualname);
    buf[pos++] = ':';
    pos = append_escaped(buf, pos, MAX_FILENAME, co->co_filename);
    assert(pos <= _PyPerf_MAX_NAME);
    return pos;
}

_Static_assert(4 + MAX_QUALNAME + 1 + MAX_FILENAME <= _PyPerf_MAX_NAME,
               "entry names fit _PyPerf_MAX_NAME");

/* ----------------------------------------------------------------------
 * Trampolines
 */

static perf_interp *
find_interp(PyInterpreterState *interp)
{
    for (size_t i = 0; i < _PyPerf_core.interp_count; i++) {
        if (_PyPerf_core.interps[i].interp_id == interp->id) {
            return &_PyPerf_core.interps[i];
        }
    }
    return NULL;
}

#define WRITE_FAILED \
    "cannot write the profiler's file; new functions are missing from it"

/* Report the first run-time failure (errno says why) on stderr; the
   program goes on either way. */
static void
report_failure(const char *what)
{
    if (!_PyPerf_core.warned) {
        _PyPerf_core.warned = 1;
        _PyPerf_Warn("%s: %s", what, strerror(errno));
    }
}

/* What one call of assign_trampoline() gives trampolines for. */
typedef struct {
    const perf_interp *pi;
    Py_ssize_t index;           /* the backend's co_extra index */
    size_t span;                /* bytes each trampoline owns */
    PyCodeObject *first;        /* the code object about to run */
} assignment;

/* Describe the gathered entries to the backend.  If that fails, the code
   objects gathered only because their definer ran (all but a->first) lose
   their trampolines again (nothing has run in them): each gets a new one,
   and another try at its entry, on its own first run. */
static void
write_entries(const assignment *a)
{
    size_t count = _PyPerf_core.entry_count;
    _PyPerf_core.entry_count = 0;
    _PyPerf_core.names_used = 0;
    if (count == 0
        || a->pi->backend->write_entries(_PyPerf_core.entries, count,
                                         _PyPerf_core.code_size) == 0)
    {
        return;
    }
    report_failure(WRITE_FAILED);
    for (size_t i = 0; i < count; i++) {
        PyCodeObject *co = _PyPerf_core.entry_code[i];
        if (co != a->first) {
            /* Cannot fail: its extras have room for the index. */
            (void)_PyCode_SetExtra((PyObject *)co, a->index, NULL);
        }
    }
}

/* Give `co` a slot of its own and gather its entry.  Returns the slot, or
   NULL if that cannot be done (an exception may be set then). */
static char *
new_trampoline(PyCodeObject *co, const assignment *a)
{
    char *slot = new_slot(a->span);
    if (slot == NULL) {
        report_failure("cannot map more executable memory; functions "
                       "called from now on get no trampoline");
        return NULL;
    }
    if (_PyCode_SetExtra((PyObject *)co, a->index, slot) < 0) {
        /* The slot stays unused: harmless, and rare. */
        return NULL;
    }
    if (_PyPerf_core.entry_count == _PyPerf_BATCH
        || (_PyPerf_BATCH_NAMES - _PyPerf_core.names_used
            < _PyPerf_MAX_NAME))
    {
        write_entries(a);
    }
    size_t i = _PyPerf_core.entry_count++;
    char *name = _PyPerf_core.names + _PyPerf_core.names_used;
    _PyPerf_core.entry_code[i] = co;
    _PyPerf_core.entries[i].code = slot;
    _PyPerf_core.entries[i].name = name;
    _PyPerf_core.entries[i].name_size = format_name(co, name);
    _PyPerf_core.names_used += _PyPerf_core.entries[i].name_size;
    return slot;
}

/* Gather entries for the code objects `co` defines that have no
   trampoline yet.  What a module or class body defines mostly runs soon
   after it, and a class body at once: so what class bodies define is
   gathered too, to MAX_CLASS_NESTING levels (deeper ones, and what
   functions define, get theirs when their definer first runs).  Returns
   -1 when no more trampolines can be made. */
static int
new_nested(PyCodeObject *co, const assignment *a, int depth)
{
    PyObject *consts = co->co_consts;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(consts); i++) {
        PyObject *item = PyTuple_GET_ITEM(consts, i);
        if (!PyCode_Check(item)) {
            continue;
        }
        PyCodeObject *code = (PyCodeObject *)item;
        if (_PyPerf_Lookup(code, a->index) != NULL) {
            continue;
        }
        if (new_trampoline(code, a) == NULL) {
            return -1;
        }
        if (!(code->co_flags & CO_OPTIMIZED) && depth < MAX_CLASS_NESTING
            && new_nested(code, a, depth + 1) < 0)
        {
            return -1;
        }
    }
    return 0;
}

/* Give `co` a trampoline and describe it to the backend, before it first
   runs; if `nested`, also the code objects it defines, where the backend
   wants that.  Returns NULL (without an exception) if that cannot be
   done. */
static _PyPerf_Trampoline
assign_trampoline(PyCodeObject *co, const perf_interp *pi, int nested)
{
    if (_PyPerf_core.arena_status != _PyPerf_ARENAS_OK
        || _PyPerf_core.no_new)
    {
        return NULL;
    }
    assignment a = {
        .pi = pi,
        .index = pi->extra_index[backend_number(pi->backend)],
        .span = _PyPerf_core.code_size,
        .first = co,
    };
    if (pi->backend->span != NULL) {
        a.span = pi->backend->span(_PyPerf_core.code_size);
    }
    /* _PyCode_SetExtra can fail (memory), and may set an exception then;
       whatever exception the frame carries (throw()) must survive. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    char *slot = new_trampoline(co, &a);
    if (slot != NULL && nested && pi->backend->define_nested) {
        (void)new_nested(co, &a, 0);
    }
    write_entries(&a);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    return (_PyPerf_Trampoline)slot;
}

/* Everything but the main interpreter's known trampolines: subinterpreters,
   and code run for the first time. */
static Py_NO_INLINE _PyPerf_Trampoline
trampoline_for_slow(PyInterpreterState *interp, PyCodeObject *co)
{
    perf_interp *pi = find_interp(interp);
    if (pi == NULL || pi->backend == NULL) {
        return NULL;
    }
    Py_ssize_t index = pi->extra_index[backend_number(pi->backend)];
    _PyPerf_Trampoline t = _PyPerf_Lookup(co, index);
    if (t != NULL) {
        return t;
    }
    return assign_trampoline(co, pi, 1);
}

static int stack_exhausted(PyThreadState *tstate, uintptr_t sp);
static int may_call_trampoline(uintptr_t sp);

/* Call `eval` through trampoline `t` from a function whose CFA is `cfa`,
   if the C stack has room for it (see "The C stack"), otherwise `eval`
   itself.  The extension keeps no account: it cannot run calls inline, so
   every frame goes through its trampoline, and the call is a tail call. */
#ifdef PY_PERF_EXTENSION
#  define CALL_TRAMPOLINE(t, cfa, tstate, frame, throwflag, eval) \
    return (t)((tstate), (frame), (throwflag), (eval))
#else
#  define CALL_TRAMPOLINE(t, cfa, tstate, frame, throwflag, eval) \
    do { \
        size_t room; \
        if (!_PyPerf_TakeRoom(_PyPerf_CALL_COST(cfa), &room)) { \
            return (eval)((tstate), (frame), (throwflag)); \
        } \
        PyObject *res = (t)((tstate), (frame), (throwflag), (eval)); \
        _PyPerf_stack.room = room; \
        return res; \
    } while (0)
#endif

static Py_NO_INLINE PyObject *
eval_frame_slow(PyThreadState *tstate, _PyInterpreterFrame *frame,
                int throwflag, uintptr_t sp)
{
    if (stack_exhausted(tstate, sp)) {
        return NULL;
    }
    _PyPerf_Trampoline t = NULL;
    if (may_call_trampoline(sp)) {
        t = trampoline_for_slow(tstate->interp, frame->f_code);
    }
    if (t == NULL) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    /* sp is the hook's CFA: what it left on the stack (if it did not
       tail-call this) is the trampoline call's too. */
    CALL_TRAMPOLINE(t, sp, tstate, frame, throwflag,
                    _PyEval_EvalFrameDefault);
}

/* The PEP 523 hook: run the frame through its code object's trampoline,
   where the C stack allows it (see "The C stack").  The common case is a
   few loads and a call of the trampoline; the other exits are tail calls,
   so the hook leaves no frame of its own there. */
PyObject *
_PyPerf_EvalFrame(PyThreadState *tstate, _PyInterpreterFrame *frame,
                  int throwflag)
{
    /* Not a local's address: that would cost the tail calls. */
    uintptr_t sp = (uintptr_t)__builtin_dwarf_cfa();
#ifdef PY_PERF_EXTENSION
    if (_PyPerf_StackExhausted(tstate)) {
        return NULL;
    }
#else
    if (!_PyPerf_ABOVE_RESERVE(sp)) {
        return eval_frame_slow(tstate, frame, throwflag, sp);
    }
#endif
    _PyPerf_Trampoline t = _PyPerf_MainTrampoline(tstate->interp,
                                                  frame->f_code);
    if (t == NULL) {
        return eval_frame_slow(tstate, frame, throwflag, sp);
    }
    CALL_TRAMPOLINE(t, sp, tstate, frame, throwflag,
                    _PyEval_EvalFrameDefault);
}

/* ----------------------------------------------------------------------
 * Other frame evaluation functions
 *
 * Tools install PEP 523 functions of their own (torch.compile's frame
 * evaluator, debuggers, _testinternalcapi.set_eval_frame_record) with
 * _PyInterpreterState_SetEvalFrameFunc(), which would replace ours and
 * switch perf off without a word.  Instead, while trampolines are active
 * in an interpreter, pystate.c hands the function to us: each frame still
 * runs through its trampoline, which calls the other function where it
 * would call the evaluator:
 *
 *     _PyPerf_EvalFrameChained -> trampoline -> other function
 *                                 (py::name)    -> _PyEval_EvalFrameDefault
 *
 * and the interpreter's hook is _PyPerf_EvalFrameChained, not
 * _PyPerf_EvalFrame, so ceval.c's fast path is off (_PyPerf_IS_INSTALLED):
 * calls are neither inlined nor specialized, as in stock 3.11 with that
 * function installed, and it sees the same frames in the same order.
 * _PyInterpreterState_GetEvalFrameFunc() returns the other function (or
 * the default one), never ours: a tool that saves it and calls it, or
 * installs it again later, never reaches our hook through it.  Setting
 * the default function back restores our fast path; deactivating us
 * leaves the other function installed.
 */

static int
is_ours(_PyFrameEvalFunction eval_frame)
{
    return (eval_frame == _PyPerf_EvalFrame
            || eval_frame == _PyPerf_EvalFrameChained);
}

/* Install our hook in `interp` (active in `pi`), around `other` (NULL:
   none, the fast path). */
static void
set_hook(PyInterpreterState *interp, perf_interp *pi,
         _PyFrameEvalFunction other)
{
    if (other == _PyPerf_EvalFrameChained) {
        other = pi->chained;    /* read from the field and set back */
    }
    else if (other == _PyEval_EvalFrameDefault || is_ours(other)) {
        other = NULL;
    }
    pi->chained = other;
    interp->eval_frame = (other == NULL ? _PyPerf_EvalFrame
                                        : _PyPerf_EvalFrameChained);
}

PyObject *
_PyPerf_EvalFrameChained(PyThreadState *tstate, _PyInterpreterFrame *frame,
                         int throwflag)
{
    uintptr_t sp = (uintptr_t)__builtin_dwarf_cfa();
    if (stack_exhausted(tstate, sp)) {
        return NULL;
    }
    perf_interp *pi = find_interp(tstate->interp);
    _PyFrameEvalFunction next = _PyEval_EvalFrameDefault;
    if (pi != NULL && pi->chained != NULL) {
        next = pi->chained;
    }
    _PyPerf_Trampoline t = NULL;
    if (may_call_trampoline(sp)) {
        t = trampoline_for_slow(tstate->interp, frame->f_code);
    }
    if (t == NULL) {
        return next(tstate, frame, throwflag);
    }
    CALL_TRAMPOLINE(t, sp, tstate, frame, throwflag, next);
}

_PyFrameEvalFunction
_PyPerf_OtherEvalFrame(PyInterpreterState *interp)
{
    if (interp->eval_frame == _PyPerf_EvalFrame) {
        return NULL;
    }
    if (interp->eval_frame == _PyPerf_EvalFrameChained) {
        perf_interp *pi = find_interp(interp);
        return pi != NULL ? pi->chained : NULL;
    }
    return interp->eval_frame;
}

int
_PyPerf_ChainEvalFrame(PyInterpreterState *interp,
                       _PyFrameEvalFunction eval_frame)
{
    perf_interp *pi;
    if (!is_ours(interp->eval_frame)
        || (pi = find_interp(interp)) == NULL || pi->backend == NULL)
    {
        if (is_ours(eval_frame)) {
            /* Ours, read from the field, set back after deactivation. */
            interp->eval_frame = NULL;
            return 1;
        }
        return 0;
    }
    set_hook(interp, pi, eval_frame);
    return 1;
}

/* ----------------------------------------------------------------------
 * The C stack
 *
 * 3.11 runs Python-to-Python calls without using the C stack; a recursion
 * through C (callbacks, __call__, chains of generators) takes an evaluator
 * frame and the C functions between per level.  Trampolines add to that:
 * a trampoline's frame (and the hook's) for each frame entering the
 * evaluator from C, and for a call that the evaluator runs through a
 * trampoline instead of inline (its records are used up; perf_jit) a
 * second evaluator frame as well.  So each thread has a room of
 * 1/STACK_ROOM_DIVISOR of its stack: a call through a trampoline takes
 * what it adds (_PyPerf_CALL_COST) from the room and puts it back when it
 * returns, and where the room is used up the frame runs as without perf
 * (inline, or the evaluator called directly), and merges into its caller
 * in a profile.  However the calls are shaped and wherever the
 * trampolines are, the stack never holds more of them than the room: a
 * recursion that runs out of stack without perf gets as deep less the
 * room and the reserve below.
 *
 * The reserve: a frame entering the evaluator from C there raises
 * RecursionError (stack_exhausted()), where without perf the program would
 * go on for those few more bytes, or raise RecursionError at its
 * recursion limit, or crash.  Neither crash nor recursion limit comes
 * sooner than with perf off less a tenth of the depth (test_stress).
 *
 * Only the thread's own stack counts: code running on a stack of its own
 * (a fiber made with makecontext, a coroutine library's stack) has a size
 * we cannot know, and there frames run as without perf.
 *
 *     high  +---------------------+  the thread's stack, from its mapping
 *           | trampolines, while  |  (the main thread's: /proc/self/maps;
 *           | they hold no more   |   other threads': pthread_getattr_np)
 *           | than the room       |
 *     limit +---------------------+
 *           | reserve             |  frames from C: RecursionError
 *     low   +---------------------+
 */

/* Parse lowercase hex at p (before end); return where it stopped, or NULL
   if there was no digit. */
static const char *
parse_hex(const char *p, const char *end, uintptr_t *value)
{
    const char *start = p;
    uintptr_t v = 0;
    for (; p < end; p++) {
        int digit;
        if (*p >= '0' && *p <= '9') {
            digit = *p - '0';
        }
        else if (*p >= 'a' && *p <= 'f') {
            digit = *p - 'a' + 10;
        }
        else {
            break;
        }
        v = (v << 4) | (uintptr_t)digit;
    }
    *value = v;
    return p == start ? NULL : p;
}

/* The main thread's stack: the mapping of /proc/self/maps that holds `sp`,
   which may grow down to RLIMIT_STACK but never into the mapping below it.
   The file is read in one go: pthread_getattr_np() reads it line by line
   through stdio, several times slower, and this runs at startup under
   -X perf.  Returns 0, or -1 if the stack cannot be found. */
static int
main_thread_stack(uintptr_t sp, uintptr_t *low, uintptr_t *high)
{
    enum { MAPS_SIZE = 64 * 1024 };
    char *buf = PyMem_RawMalloc(MAPS_SIZE);
    if (buf == NULL) {
        return -1;
    }
    size_t len = 0;
    int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n;
        while (len < MAPS_SIZE
               && ((n = read(fd, buf + len, MAPS_SIZE - len)) > 0
                   || (n < 0 && errno == EINTR)))
        {
            len += n > 0 ? (size_t)n : 0;
        }
        close(fd);
    }
    int res = -1;
    uintptr_t below = 0;        /* end of the previous mapping */
    const char *p = buf, *end = buf + len;
    while (len < MAPS_SIZE && p < end) {
        /* "START-END perms offset dev inode path" */
        uintptr_t start, stop;
        const char *q = parse_hex(p, end, &start);
        if (q == NULL || q == end || *q != '-'
            || (q = parse_hex(q + 1, end, &stop)) == NULL)
        {
            break;
        }
        if (start <= sp && sp < stop) {
            struct rlimit rl;
            *high = stop;
            *low = below;
            if (getrlimit(RLIMIT_STACK, &rl) == 0
                && rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < stop
                && stop - rl.rlim_cur > below)
            {
                *low = stop - rl.rlim_cur;
            }
            res = 0;
            break;
        }
        below = stop;
        q = memchr(q, '\n', end - q);
        p = q != NULL ? q + 1 : end;
    }
    PyMem_RawFree(buf);
    return res;
}

static void
find_stack(uintptr_t sp)
{
    _PyPerf_stack.known = 1;
    uintptr_t low, high;
    if (getpid() != (pid_t)syscall(SYS_gettid)
        || main_thread_stack(sp, &low, &high) < 0)
    {
        pthread_attr_t attr;
        void *addr;
        size_t size;
        if (pthread_getattr_np(pthread_self(), &attr) != 0) {
            return;   /* unknown: this thread never takes the fast path */
        }
        int err = pthread_attr_getstack(&attr, &addr, &size);
        pthread_attr_destroy(&attr);
        if (err != 0 || size == 0) {
            return;
        }
        low = (uintptr_t)addr;
        high = low + size;
    }
    /* The stack grows down from high. */
    size_t size = high - low;
    _PyPerf_stack.high = high;
    _PyPerf_stack.low = low;
#ifdef PY_PERF_EXTENSION
    _PyPerf_stack.limit = low + Py_MIN(STACK_RESERVE, size / 4);
#else
    size_t reserve = Py_MAX(size / STACK_RESERVE_DIVISOR, STACK_RESERVE_MIN);
    reserve = Py_MIN(reserve, STACK_RESERVE);
    _PyPerf_stack.limit = low + Py_MIN(reserve, size / 4);
    _PyPerf_stack.room = size / STACK_ROOM_DIVISOR;
#endif
}

static void
raise_stack_exhausted(void)
{
    PyErr_SetString(PyExc_RecursionError,
                    "maximum recursion depth exceeded: the C stack is "
                    "exhausted"
#ifdef PY_PERF_EXTENSION
                    " (perf trampolines make every Python call a C call)"
#endif
                    );
}

#ifdef PY_PERF_EXTENSION
/* The C stack guard of the thread that ran last: a dlopen()ed module
   reaches its TLS through a call, which would cost more than the rest of
   the check on every Python call.  The GIL makes this one thread's at a
   time; tstate->id is never reused by another thread. */
static struct {
    uint64_t thread;            /* tstate->id, 0: none */
    uintptr_t limit;
    uintptr_t low;
} stack_guard;

static Py_NO_INLINE int
stack_exhausted_slow(PyThreadState *tstate, uintptr_t sp)
{
    if (!_PyPerf_stack.known) {
        find_stack(sp);
    }
    stack_guard.thread = tstate->id;
    stack_guard.limit = _PyPerf_stack.limit;
    stack_guard.low = _PyPerf_stack.low;
    if (sp >= stack_guard.limit || sp < stack_guard.low) {
        return 0;
    }
    raise_stack_exhausted();
    return 1;
}

/* Set RecursionError and return 1 if the C stack of this thread is down
   to its reserve.  A stack that is not the thread's own (a fiber's), or
   not found, is left unguarded, as it is without the extension. */
int
_PyPerf_StackExhausted(PyThreadState *tstate)
{
    char here;
    uintptr_t sp = (uintptr_t)&here;
    if (tstate->id == stack_guard.thread
        && (sp >= stack_guard.limit || sp < stack_guard.low))
    {
        return 0;
    }
    return stack_exhausted_slow(tstate, sp);
}
#endif

/* Set RecursionError and return 1 if sp, where a frame enters the
   evaluator from C, lies in this thread's reserve. */
static int
stack_exhausted(PyThreadState *tstate, uintptr_t sp)
{
#ifdef PY_PERF_EXTENSION
    (void)sp;
    return _PyPerf_StackExhausted(tstate);
#else
    if (!_PyPerf_stack.known) {
        find_stack(sp);
    }
    if (sp >= _PyPerf_stack.low && sp < _PyPerf_stack.limit) {
        raise_stack_exhausted();
        return 1;
    }
    return 0;
#endif
}

/* Whether a frame entering the evaluator from C at sp may go through its
   trampoline (then only if the room allows it: CALL_TRAMPOLINE). */
static int
may_call_trampoline(uintptr_t sp)
{
#ifdef PY_PERF_EXTENSION
    (void)sp;
    return 1;           /* its guard is _PyPerf_StackExhausted() */
#else
    if (!_PyPerf_stack.known) {
        find_stack(sp);
    }
    return _PyPerf_ABOVE_RESERVE(sp);
#endif
}

_PyPerf_Trampoline
_PyPerf_ForCallSlow(PyThreadState *tstate, PyCodeObject *co, uintptr_t sp)
{
    if (!_PyPerf_stack.known) {
        find_stack(sp);
    }
    if (!_PyPerf_ABOVE_RESERVE(sp)) {
        return NULL;
    }
    /* _PyPerf_ForCall() already looked for the main interpreter's. */
    return trampoline_for_slow(tstate->interp, co);
}

static_assert(_PyPerf_RECORD_AREA == 128,
              "RECORD_AREA in Python/asm_trampoline.S");

_PyPerf_Trampoline
_PyPerf_RecordTrampolineSlow(PyThreadState *tstate, PyCodeObject *co)
{
    return trampoline_for_slow(tstate->interp, co);
}

/* ----------------------------------------------------------------------
 * Exit
 */

void
_PyPerf_AtExit(void)
{
    for (int i = 0; i < BACKEND_COUNT; i++) {
        const _PyPerf_Backend *backend = backends[i].backend;
        if (backend->fini != NULL) {
            backend->fini();
        }
    }
}

static pthread_once_t at_exit_once = PTHREAD_ONCE_INIT;

static void
register_at_exit(void)
{
    /* Also exit() called from C, without Py_Finalize (atexit() failing
       only leaves the files untidied). */
    (void)atexit(_PyPerf_AtExit);
}

/* ----------------------------------------------------------------------
 * Activation
 */

static const _PyPerf_Backend *
find_backend(const char *name)
{
    for (int i = 0; i < BACKEND_COUNT; i++) {
        if (strcmp(backends[i].name, name) == 0) {
            return backends[i].backend;
        }
    }
    return NULL;
}

static perf_interp *
add_interp(PyInterpreterState *interp)
{
    perf_interp *pi = find_interp(interp);
    if (pi != NULL) {
        return pi;
    }
    size_t n = _PyPerf_core.interp_count + 1;
    perf_interp *table = PyMem_RawRealloc(_PyPerf_core.interps,
                                          n * sizeof(perf_interp));
    if (table == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    _PyPerf_core.interps = table;
    pi = &table[_PyPerf_core.interp_count];
    _PyPerf_core.interp_count = n;
    pi->interp_id = interp->id;
    pi->backend = NULL;
    pi->chained = NULL;
    for (int i = 0; i < (int)Py_ARRAY_LENGTH(pi->extra_index); i++) {
        pi->extra_index[i] = -1;
    }
    return pi;
}

static int
activate(PyThreadState *tstate, const char *name)
{
    PyInterpreterState *interp = tstate->interp;
    const _PyPerf_Backend *backend = find_backend(name);
    if (backend == NULL) {
        /* Upstream's words first: code written for 3.12 matches them. */
        PyErr_Format(PyExc_ValueError,
                     "invalid backend: %s (perf trampoline backends: %s)",
                     name, BACKEND_NAMES);
        return -1;
    }
    if (init_arenas() < 0) {
        int err = errno;
        PyObject *msg = PyUnicode_FromFormat(
            "cannot map executable memory for perf trampolines: %s",
            strerror(err));
        if (msg == NULL) {
            return -1;
        }
        PyObject *exc = PyObject_CallFunction(PyExc_OSError, "iN", err, msg);
        if (exc != NULL) {
            PyErr_SetObject((PyObject *)Py_TYPE(exc), exc);
            Py_DECREF(exc);
        }
        return -1;
    }
    char path[256];
    path[0] = '\0';
    if (backend->init(path, sizeof(path)) < 0) {
        PyErr_SetFromErrnoWithFilename(PyExc_OSError, path);
        return -1;
    }
    perf_interp *pi = add_interp(interp);
    if (pi == NULL) {
        return -1;
    }
    int b = backend_number(backend);
    if (pi->extra_index[b] < 0) {
        pi->extra_index[b] = _PyEval_RequestCodeExtraIndex(NULL);
        if (pi->extra_index[b] < 0) {
            PyErr_SetString(PyExc_RuntimeError,
                            "perf trampolines need a code object extra "
                            "slot (PEP 523), and none is left");
            return -1;
        }
    }
    if (backend->fini != NULL) {
        pthread_once(&at_exit_once, register_at_exit);
    }
    /* Another function installed before us is wrapped. */
    _PyFrameEvalFunction other = _PyPerf_OtherEvalFrame(interp);
    pi->backend = backend;
    if (interp->id == 0) {
        _PyPerf_core.main_index = pi->extra_index[b];
        /* perf_jit's readers unwind with the call frame information */
        _PyPerf_core.records_interp =
            (backend == &_PyPerf_MapBackend ? interp : NULL);
        _PyPerf_remote.active = b + 1;
    }
    set_hook(interp, pi, other);
    return 0;
}

int
_PyPerf_Activate(PyThreadState *tstate, const char *name)
{
    return activate(tstate, name);
}

int
_PyPerf_Deactivate(PyThreadState *tstate)
{
    PyInterpreterState *interp = tstate->interp;
    /* Only unhook: frames may still be running inside trampolines.  A
       function we wrapped stays. */
    if (is_ours(interp->eval_frame)) {
        interp->eval_frame = _PyPerf_OtherEvalFrame(interp);
    }
    perf_interp *pi = find_interp(interp);
    if (pi != NULL) {
        pi->backend = NULL;
        pi->chained = NULL;
    }
    if (interp->id == 0) {
        _PyPerf_core.main_index = -1;
        _PyPerf_core.records_interp = NULL;
        _PyPerf_remote.active = 0;
    }
    return 0;
}

int
_PyPerf_IsActive(PyThreadState *tstate)
{
    return is_ours(tstate->interp->eval_frame);
}

void
_PyPerf_FiniInterp(PyInterpreterState *interp)
{
    /* Forget the interpreter: a later one may have the same id (the main
       interpreter after Py_Finalize + Py_Initialize), with fresh co_extra
       indexes. */
    perf_interp *pi = find_interp(interp);
    if (pi == NULL) {
        return;
    }
    if (interp->id == 0) {
        _PyPerf_core.main_index = -1;
        _PyPerf_core.records_interp = NULL;
        _PyPerf_remote.active = 0;
        _PyPerf_remote.eval_breaker = NULL;
    }
    size_t i = pi - _PyPerf_core.interps;
    memmove(pi, pi + 1, (_PyPerf_core.interp_count - i - 1) * sizeof(*pi));
    _PyPerf_core.interp_count--;
}

/* Make `pi`'s trampolines for its active backend anew: a new co_extra
   index, so every function gets a new trampoline on its next call. */
static int
renew_trampolines(PyInterpreterState *interp, perf_interp *pi)
{
    Py_ssize_t index = _PyEval_RequestCodeExtraIndex(NULL);
    if (index < 0) {
        return -1;
    }
    pi->extra_index[backend_number(pi->backend)] = index;
    if (interp->id == 0) {
        _PyPerf_core.main_index = index;
    }
    return 0;
}

/* A forked child has a pid of its own, so perf looks for files of its own.
   Where trampolines are active in the child, its files start as a copy of
   the parent's, so that the trampolines it inherited keep their names,
   except:

   - in a child that is about to exec (_PyPerf_ChildWillExec()): the copy
     would be thrown away.  It makes no new trampolines (the at-fork
     hooks and preexec_fn run as without perf), so it writes nothing.
   - with copying turned off (-X perf_fork_copy=0, for servers that fork
     many workers from a large parent): the child's files describe only
     what it makes from now on, and it makes a new trampoline for every
     function on its first call there (a co_extra index per generation;
     the copy is the fallback when none is left).

   Where they are not active, nothing is written: if the child activates
   them later, its functions get new trampolines, in files of its own. */
void
_PyPerf_AfterForkChild(PyThreadState *tstate)
{
    int will_exec = _PyPerf_core.child_will_exec;
    _PyPerf_core.child_will_exec = 0;
    /* Requests were for the parent. */
    _PyPerf_remote.request = _PyPerf_REQUEST_NONE;
    _PyPerf_remote.taken = 0;
    _PyPerf_core.no_new = will_exec;
    perf_interp *pi = find_interp(tstate->interp);
    const _PyPerf_Backend *active = pi != NULL ? pi->backend : NULL;
    int copy = (active != NULL && !will_exec && _PyPerf_core.fork_copy);
    if (active != NULL && !will_exec && !copy
        && renew_trampolines(tstate->interp, pi) < 0)
    {
        copy = 1;
    }
    /* Trampolines of backends that are not active are not in the child's
       files: forget them (new ones are made if it activates one). */
    for (size_t i = 0; i < _PyPerf_core.interp_count; i++) {
        perf_interp *other = &_PyPerf_core.interps[i];
        for (int b = 0; b < BACKEND_COUNT; b++) {
            if (backends[b].backend != other->backend) {
                other->extra_index[b] = -1;
            }
        }
    }
    for (int i = 0; i < BACKEND_COUNT; i++) {
        const _PyPerf_Backend *backend = backends[i].backend;
        char path[256];
        path[0] = '\0';
        if (backend->after_fork_child(path, sizeof(path),
                                      copy && backend == active) < 0)
        {
            _PyPerf_Warn("cannot start %s for the child process: %s",
                         path, strerror(errno));
        }
    }
}

void
_PyPerf_ChildWillExec(void)
{
    _PyPerf_core.child_will_exec = 1;
}

/* ----------------------------------------------------------------------
 * Requests from another process (Lib/perf_trampoline/)
 */

/* Why the request failed, as an errno value for the tool. */
static int
request_error(PyObject *exc)
{
    if (PyErr_GivenExceptionMatches(exc, PyExc_OSError)) {
        PyObject *err = ((PyOSErrorObject *)exc)->myerrno;
        long value = err != NULL && PyLong_Check(err) ? PyLong_AsLong(err)
                                                      : -1;
        PyErr_Clear();
        return value > 0 ? (int)value : EIO;
    }
    if (PyErr_GivenExceptionMatches(exc, PyExc_ValueError)) {
        return EINVAL;          /* a backend this build does not have */
    }
    return EBUSY;               /* no co_extra index left */
}

/* Switch the main interpreter's trampolines for a request of `kind`, as
   sys.activate_stack_trampoline() would, without a word on the program's
   output; returns 0 or the errno of the failure, for the tool. */
static int
switch_for_request(PyThreadState *tstate, int kind)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int res;
    switch (kind) {
    case _PyPerf_REQUEST_PERF:
        res = activate(tstate, "perf");
        break;
    case _PyPerf_REQUEST_PERF_JIT:
        res = activate(tstate, "perf_jit");
        break;
    case _PyPerf_REQUEST_OFF:
        res = _PyPerf_Deactivate(tstate);
        break;
    default:
        PyErr_SetString(PyExc_ValueError, "unknown request");
        res = -1;
    }
    int error = 0;
    if (res < 0) {
        PyObject *etype, *evalue, *etb;
        PyErr_Fetch(&etype, &evalue, &etb);
        PyErr_NormalizeException(&etype, &evalue, &etb);
        error = request_error(evalue);
        Py_XDECREF(etype);
        Py_XDECREF(evalue);
        Py_XDECREF(etb);
    }
    PyErr_Restore(type, value, tb);
    return error;
}

/* ----------------------------------------------------------------------
 * The C API (Include/cpython/sysmodule.h, Doc/c-api/perfmaps.rst)
 */

/* Give `co` its trampoline of the main interpreter's active backend now,
   as its first call would: a parent that does this for its functions
   before forking workers has them named once, in its own map, which
   children copy (fork_copy) instead of naming each function again. */
int
PyUnstable_PerfTrampoline_CompileCode(PyCodeObject *co)
{
    if (co == NULL || !PyCode_Check(co)) {
        PyErr_BadInternalCall();
        return -1;
    }
    perf_interp *pi = find_interp(_PyInterpreterState_Main());
    if (pi == NULL || pi->backend == NULL || _PyPerf_core.no_new) {
        return 0;               /* no trampolines to give */
    }
    Py_ssize_t index = pi->extra_index[backend_number(pi->backend)];
    if (_PyPerf_Lookup(co, index) != NULL
        || assign_trampoline(co, pi, 0) != NULL)
    {
        return 0;
    }
    if (_PyPerf_core.arena_status != _PyPerf_ARENAS_OK) {
        errno = _PyPerf_core.arena_errno;
        PyErr_SetFromErrno(PyExc_OSError);
    }
    else {
        PyErr_NoMemory();       /* no room in the code object's extras */
    }
    return -1;
}

/* Upstream's switch for what a forked child does with the trampolines it
   inherits, onto ours (_PyPerf_AfterForkChild()): persisting them is
   copying the parent's files. */
int
PyUnstable_PerfTrampoline_SetPersistAfterFork(int enable)
{
    _PyPerf_core.fork_copy = (enable != 0);
    return _PyPerf_core.fork_copy;
}

#else   /* !PY_HAVE_PERF_TRAMPOLINE */

static int
switch_for_request(PyThreadState *tstate, int kind)
{
    return EOPNOTSUPP;
}

int
_PyPerf_Activate(PyThreadState *tstate, const char *name)
{
    PyErr_Format(PyExc_ValueError,
                 "perf trampoline not available: this Python was built "
                 "without perf trampolines (backend '%s')", name);
    return -1;
}

int
_PyPerf_Deactivate(PyThreadState *tstate)
{
    return 0;
}

int
_PyPerf_IsActive(PyThreadState *tstate)
{
    return 0;
}

void
_PyPerf_FiniInterp(PyInterpreterState *interp)
{
}

void
_PyPerf_AfterForkChild(PyThreadState *tstate)
{
}

void
_PyPerf_ChildWillExec(void)
{
}

/* Without trampolines, as upstream where they are not supported: nothing
   to compile, nothing persists. */
int
PyUnstable_PerfTrampoline_CompileCode(PyCodeObject *co)
{
    return 0;
}

int
PyUnstable_PerfTrampoline_SetPersistAfterFork(int enable)
{
    return 0;
}

_PyFrameEvalFunction
_PyPerf_OtherEvalFrame(PyInterpreterState *interp)
{
    return interp->eval_frame;
}

int
_PyPerf_ChainEvalFrame(PyInterpreterState *interp,
                       _PyFrameEvalFunction eval_frame)
{
    return 0;
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */

_PyPerf_RemoteControl _PyPerf_remote = {
    .magic = _PyPerf_REMOTE_MAGIC,
    .version = _PyPerf_REMOTE_VERSION,
};

/* Set `request` back to 0 if it still holds `done`: a request a tool wrote
   while `done` was acted on stays for the next check. */
static void
clear_request(uint64_t done)
{
#if defined(__GNUC__) || defined(__clang__)
    __atomic_compare_exchange_n(&_PyPerf_remote.request, &done, 0, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
#else
    if (_PyPerf_remote.request == done) {
        _PyPerf_remote.request = _PyPerf_REQUEST_NONE;
    }
#endif
}

/* Act on the tool's request (see pycore_perf.h); its outcome is left for
   the tool in _PyPerf_remote.log. */
void
_PyPerf_HandleRemoteRequest(PyThreadState *tstate)
{
    uint64_t request = _PyPerf_remote.request;
    if (request == _PyPerf_REQUEST_NONE) {
        return;
    }
    /* Say which word is being decided on, then act only if `request`
       still holds it.  A tool withdrawing its request writes 0, then reads
       `taken`: both sides store before they load, so either the tool sees
       its word here (and waits for the log), or the load below sees the 0
       and the request is never acted on. */
    _PyPerf_remote.taken = request;
    _Py_atomic_thread_fence(_Py_memory_order_seq_cst);
    if (_PyPerf_remote.request != request) {
        /* Withdrawn or replaced: a new request is taken at the next
           check. */
        _PyPerf_remote.taken = 0;
        return;
    }
    int error = switch_for_request(tstate, _PyPerf_REQUEST_KIND(request));
    uint32_t n = _PyPerf_remote.handled;
    volatile _PyPerf_RemoteOutcome *outcome =
        &_PyPerf_remote.log[n % _PyPerf_REMOTE_LOG];
    outcome->request = request;
    outcome->active = _PyPerf_remote.active;
    outcome->error = error;
    /* The entry is whole before the count that shows it to tools. */
    _Py_atomic_thread_fence(_Py_memory_order_release);
    _PyPerf_remote.handled = n + 1;
    clear_request(request);
}

#ifndef PY_PERF_EXTENSION
/* ----------------------------------------------------------------------
 * Startup: the configuration's switches (Python/initconfig.c reads them;
 * the extension is switched on from Python instead)
 */

PyStatus
_PyPerf_InitFromConfig(PyThreadState *tstate)
{
    const PyConfig *config = _PyInterpreterState_GetConfig(tstate->interp);
    int main_interp = _Py_IsMainInterpreter(tstate->interp);
    const char *warning = NULL;
    const char *backend = _PyPerf_ConfigBackend(config, &warning);
    if (warning != NULL && main_interp) {
        PySys_FormatStderr("Python perf trampolines: %s\n", warning);
    }
    if (main_interp) {
        /* Where a remote request wakes the main interpreter up. */
        _PyPerf_remote.eval_breaker =
            (volatile int32_t *)&tstate->interp->ceval.eval_breaker;
        int copy = _PyPerf_ConfigForkCopy(config, &warning);
        if (warning != NULL) {
            PySys_FormatStderr("Python perf trampolines: %s\n", warning);
        }
#ifdef PY_HAVE_PERF_TRAMPOLINE
        _PyPerf_core.fork_copy = copy;
#else
        (void)copy;
#endif
    }
    if (backend == NULL) {
        return _PyStatus_OK();
    }
#ifdef PY_HAVE_PERF_TRAMPOLINE
    if (activate(tstate, backend) == 0) {
        return _PyStatus_OK();
    }
    /* Profiling support must never stop the program: one line, go on. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *msg = value != NULL ? PyObject_Str(value) : NULL;
    const char *text = msg != NULL ? PyUnicode_AsUTF8(msg) : NULL;
    PyErr_Clear();
    _PyPerf_Warn("cannot enable the '%s' backend at startup (%s); "
                 "running without it", backend,
                 text != NULL ? text : "unknown error");
    Py_XDECREF(msg);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
#else
    if (main_interp) {
        PySys_FormatStderr("Python perf trampolines: not supported by this "
                           "build; '%s' ignored\n", backend);
    }
#endif
    return _PyStatus_OK();
}
#endif  /* !PY_PERF_EXTENSION */
