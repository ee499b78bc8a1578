#ifndef Py_INTERNAL_PERF_H
#define Py_INTERNAL_PERF_H
#ifdef __cplusplus
extern "C" {
#endif

#ifndef Py_BUILD_CORE
#  error "this header requires Py_BUILD_CORE define"
#endif

/* Perf trampolines: Python functions in native profilers.
 *
 * The files:
 *
 *   Python/initconfig.c          -X perf, -X perf_jit and their variables
 *   Python/perf_trampoline.c     the core: trampolines for code objects,
 *                                the eval hook, the CALL fast path,
 *                                activation, fork
 *   Python/perf_arena.c          the arenas trampolines live in
 *   Python/perf_name.c           their names, py::<qualname>:<filename>
 *   Python/perf_stack.c          the C stack's room and reserve
 *   Python/perf_remote.c         requests from another process
 *   Python/perf_map.c            backend: /tmp/perf-<pid>.map, and
 *                                its C API (PyUnstable_*, for JITs)
 *   Python/perf_jit_trampoline.c backend: /tmp/jit-<pid>.dump (jitdump)
 *   Python/perf_gdb_jit.c        gdb's JIT interface
 *   Python/perf_unwind.c         the template's unwind description and
 *                                the DWARF it is written in
 *   Python/perf_files.c          profiler files in /tmp, safely
 *   Python/asm_trampoline.S      the template every trampoline copies
 *   ext/perftramp311/_core.c     the same files as an extension module
 *                                for a stock 3.11.x (PY_PERF_EXTENSION):
 *                                it stands in for the interpreter's side
 *
 * The backends and the gdb registration depend on the core's interface
 * below and on the two helper files, never on each other.
 */

/* The version of the perf trampolines patch set, defined here only:
   sys._perf_trampoline_version, "python -VV" and
   "python -m perf_trampoline --version" all show this string. */
#define _PyPerf_PATCH_SET_VERSION "1.0"

#include "pycore_code.h"          // _PyCodeObjectExtra
#include "pycore_interp.h"        // PyInterpreterState.eval_frame

#ifdef PY_PERF_EXTENSION
/* A stock 3.11 keeps this in Objects/codeobject.c; the extension checks
   this copy of its layout against the running interpreter at import. */
typedef struct {
    Py_ssize_t ce_size;
    void *ce_extras[1];
} _PyCodeObjectExtra;
#endif


/* ---- The template (Python/asm_trampoline.S) ---------------------------- */

/* A trampoline: calls eval(tstate, frame, throwflag) from a native frame of
   its own. */
typedef PyObject *(*_PyPerf_Trampoline)(
    PyThreadState *tstate, struct _PyInterpreterFrame *frame, int throwflag,
    _PyFrameEvalFunction eval);

extern char _PyPerf_TemplateStart[];
extern char _PyPerf_TemplateReturn[];   /* where eval returns to */
extern char _PyPerf_TemplateEnd[];

/* Bytes from a trampoline's CFA to the CFA of the function it calls, on
   both architectures: its frame record, the return address and the
   records' area (_PyPerf_RECORD_AREA, below). */
#define _PyPerf_TRAMPOLINE_FRAME (_PyPerf_RECORD_AREA + 32)

/* ELF machine numbers of the hosts the template exists for. */
#define _PyPerf_EM_X86_64 62
#define _PyPerf_EM_AARCH64 183

#ifdef PY_HAVE_PERF_TRAMPOLINE
#  if defined(__x86_64__)
#    define _PyPerf_EM_HOST _PyPerf_EM_X86_64
#  elif defined(__aarch64__) && defined(__AARCH64EL__) && !defined(__ILP32__)
#    define _PyPerf_EM_HOST _PyPerf_EM_AARCH64
#  else
#    error "perf trampolines: no template for this architecture"
#  endif
#endif


/* ---- The core (Python/perf_trampoline.c) ------------------------------- */

extern int _PyPerf_Activate(PyThreadState *tstate, const char *backend);
extern int _PyPerf_Deactivate(PyThreadState *tstate);
extern int _PyPerf_IsActive(PyThreadState *tstate);
extern PyStatus _PyPerf_InitFromConfig(PyThreadState *tstate);
/* _PyInterpreterState_Get/SetEvalFrameFunc() (Python/pystate.c): the
   frame evaluation function installed besides ours (NULL: the default
   one), and installing one (NULL: the default) where trampolines are
   active, which chains it behind them; 0 if they are not active there,
   for the caller to install it itself. */
extern _PyFrameEvalFunction _PyPerf_OtherEvalFrame(
    PyInterpreterState *interp);
extern int _PyPerf_ChainEvalFrame(PyInterpreterState *interp,
                                  _PyFrameEvalFunction eval_frame);
extern void _PyPerf_FiniInterp(PyInterpreterState *interp);
extern void _PyPerf_AfterForkChild(PyThreadState *tstate);
/* In a forked child that will exec (_posixsubprocess with preexec_fn):
   called before PyOS_AfterFork_Child(), so that no files are copied. */
PyAPI_FUNC(void) _PyPerf_ChildWillExec(void);

/* Requests from another process (Lib/perf_trampoline/), acted on by the
   main interpreter at its next eval-breaker check.  The tool finds
   _PyPerf_remote through the dynamic symbol table, checks it through a
   /proc/<pid>/mem descriptor, and through the same descriptor writes
   `request` and then 1 to *eval_breaker, again every few tens of ms while
   the request is pending (a recompute of the breaker may drop it).  The
   process is never stopped: nothing in it runs on the tool's behalf but
   the handler below, at a safe point.  The layout is fixed (offsets in the
   comments) and versioned.

   Several tools may write `request` at once, and the last write wins, so
   each request word carries a random tag of its tool's (above the kind's
   byte).  The handler publishes the word it is about to act on in `taken`,
   then acts only if `request` still holds it, and keeps the outcome of
   request number i (counted by `handled`) in log[i % _PyPerf_REMOTE_LOG]:
   a tool finds its own word there, or learns that another write replaced
   it first.  Version 1 had no tag, no `taken` and no log. */
#define _PyPerf_REMOTE_MAGIC 0x46505950u     /* "PYPF" */
#define _PyPerf_REMOTE_VERSION 2
#define _PyPerf_REMOTE_LOG 16
#define _PyPerf_REQUEST_KIND(request) ((int)((request) & 0xff))
enum {
    _PyPerf_REQUEST_NONE = 0,
    _PyPerf_REQUEST_PERF = 1,
    _PyPerf_REQUEST_PERF_JIT = 2,
    _PyPerf_REQUEST_OFF = 3,
};
typedef struct {
    uint64_t request;                   /*  0: the word acted on */
    int32_t active;                     /*  8: `active` after it */
    int32_t error;                      /* 12: its errno, or 0 */
} _PyPerf_RemoteOutcome;
typedef struct {
    uint32_t magic;                     /*  0 */
    uint32_t version;                   /*  4 */
    volatile uint64_t request;          /*  8: written by tools: their tag
                                           << 8 | the kind, or 0 */
    volatile int32_t *eval_breaker;     /* 16: the main interpreter's */
    volatile uint32_t handled;          /* 24: requests acted on */
    volatile int32_t active;            /* 28: the main interpreter's
                                           _PyPerf_REQUEST_PERF(_JIT), or 0 */
    volatile uint64_t taken;            /* 32: the word being acted on, or
                                           0 after one was given up */
    volatile _PyPerf_RemoteOutcome log[_PyPerf_REMOTE_LOG];     /* 40 */
} _PyPerf_RemoteControl;

PyAPI_DATA(_PyPerf_RemoteControl) _PyPerf_remote;

/* A request is pending (Python/ceval.c: part of the eval breaker). */
#define _PyPerf_REMOTE_PENDING(interp) \
    (_PyPerf_remote.request != 0 && _Py_IsMainInterpreter(interp))
extern void _PyPerf_HandleRemoteRequest(PyThreadState *tstate);

/* The backend -X perf, -X perf_jit and their environment variables ask for
   ("perf", "perf_jit"), or NULL.  A value that is not understood never
   stops startup: *warning is then set to a message saying how it was
   taken.  (Python/initconfig.c) */
extern const char *_PyPerf_ConfigBackend(const PyConfig *config,
                                         const char **warning);
/* Whether a forked child copies the parent's files (-X perf_fork_copy,
   PYTHON_PERF_FORK_COPY; default 1), with *warning as above. */
extern int _PyPerf_ConfigForkCopy(const PyConfig *config,
                                  const char **warning);

#ifdef PY_HAVE_PERF_TRAMPOLINE

/* A new trampoline and its name, to be described to profilers. */
typedef struct {
    const void *code;
    const char *name;
    size_t name_size;
} _PyPerf_Entry;

/* An output that describes trampolines to profilers.  Functions return 0,
   or -1 with errno set; `path` receives the file's name for messages. */
typedef struct {
    /* Open this process's output (idempotent). */
    int (*init)(char *path, size_t path_size);
    /* Describe `count` new trampolines of code_size bytes each. */
    int (*write_entries)(const _PyPerf_Entry *entries, size_t count,
                         size_t code_size);
    /* Nonzero if a code object's first run also makes the trampolines of
       the code objects it defines (functions, classes, comprehensions),
       so that their entries go out in one write_entries(): for outputs
       where an entry costs a system call more than its bytes. */
    int define_nested;
    /* In a forked child: let go of the parent's output.  If `copy`, start
       the child's own, covering every trampoline described before the
       fork; otherwise write_entries starts it, empty.  No-op if never
       initialized. */
    int (*after_fork_child)(char *path, size_t path_size, int copy);
    /* Optional: at exit (also os._exit()), tidy the output up.  Every
       entry is complete in it before this: a process killed outright
       loses nothing. */
    void (*fini)(void);
    /* Optional: bytes of address space, from its start, that a trampoline
       of code_size bytes must own (valid after init); default: its code. */
    size_t (*span)(size_t code_size);
} _PyPerf_Backend;

extern const _PyPerf_Backend _PyPerf_MapBackend;
#ifdef PY_HAVE_PERF_JIT_TRAMPOLINE
extern const _PyPerf_Backend _PyPerf_JitBackend;
#endif

/* An upper bound on the length of a trampoline's name (no NUL). */
#define _PyPerf_MAX_NAME 3200

/* At most this many entries, with names of this many bytes in all, are
   written together. */
#define _PyPerf_BATCH 64
#define _PyPerf_BATCH_NAMES (4 * _PyPerf_MAX_NAME)

/* A byte a map line writes as \xNN (an ASCII control character or DEL),
   so that an entry is always one line. */
static inline int
_PyPerf_IsControl(unsigned char ch)
{
    return (ch < 0x20) | (ch == 0x7f);
}

/* How many of the `size` bytes at `s` are such bytes.  Almost every name
   has none, and looking is most of what a new trampoline spends on its
   name: so eight bytes at a time, whatever the compiler vectorizes (the
   extension is built with its interpreter's -O2, which does not), and the
   bytes of a word one by one only if it has one.  The last word ends at
   the last byte, overlapping the one before it. */
static inline size_t
_PyPerf_CountControls(const unsigned char *s, size_t size)
{
    const uint64_t ones = 0x0101010101010101u;
    const uint64_t high = 0x8080808080808080u;
    size_t n = 0;
    if (size < 8) {
        for (size_t i = 0; i < size; i++) {
            n += _PyPerf_IsControl(s[i]);
        }
        return n;
    }
    for (size_t i = 0; i < size; i += 8) {
        uint64_t w;
        memcpy(&w, s + Py_MIN(i, size - 8), 8);
        /* Each byte's high bit set before subtracting, so that nothing
           borrows across bytes: a result's high bit is then clear only
           where the byte's low seven bits are below 0x20 (or, XORed with
           0x7f, zero), and ~w keeps the bytes below 0x80. */
        uint64_t x = w ^ (0x7f * ones);
        uint64_t below = ~((w | high) - 0x20 * ones) & ~w;
        uint64_t del = ~((x | high) - ones) & ~x;
        if (((below | del) & high) == 0) {
            continue;
        }
        for (size_t j = i; j < Py_MIN(i + 8, size); j++) {
            n += _PyPerf_IsControl(s[j]);
        }
    }
    return n;
}

typedef enum {
    _PyPerf_ARENAS_UNTRIED,
    _PyPerf_ARENAS_OK,
    _PyPerf_ARENAS_REFUSED,     /* no executable memory: decided once */
} _PyPerf_ArenaStatus;

struct _PyPerf_Interp;

/* The core's state: one instance, changed only with the GIL held. */
typedef struct {
    /* co_extra index of the main interpreter's active backend, -1 if none:
       read on every fast-path call. */
    Py_ssize_t main_index;
    _PyPerf_ArenaStatus arena_status;
    int arena_errno;            /* why arenas were refused */
    size_t code_size;           /* bytes of the template */
    size_t return_offset;       /* _PyPerf_TemplateReturn's, in it */
    /* The main interpreter while its backend is read by frame-pointer
       walks, so that inlined calls may leave frame records
       (Python/ceval.c); otherwise NULL. */
    PyInterpreterState *records_interp;
    size_t slot_size;           /* code_size rounded up to a slot */
    char *next;                 /* next free slot of the current arena */
    char *limit;                /* end of the current arena */
    int warned;                 /* a run-time failure was reported */
    int fork_copy;              /* see _PyPerf_AfterForkChild() */
    int child_will_exec;
    int no_new;                 /* a child about to exec: no new trampolines */
    /* Where the map backend's unnamed trampoline returns to from the
       evaluator (see _PyPerf_EnterUnnamed()), or NULL. */
    void *unnamed_ret;
    struct _PyPerf_Interp *interps;   /* interpreters that activated */
    size_t interp_count;
    /* New trampolines' entries, gathered here (not on the C stack: that
       can run near the bottom of a deep one) until they are written. */
    _PyPerf_Entry entries[_PyPerf_BATCH];
    PyCodeObject *entry_code[_PyPerf_BATCH];    /* each one's code object */
    size_t entry_count;
    size_t names_used;
    char names[_PyPerf_BATCH_NAMES];
} _PyPerf_Core;

extern _PyPerf_Core _PyPerf_core;

/* The process is about to exit (also os._exit()). */
extern void _PyPerf_AtExit(void);

/* Make sure executable memory can be had, once: 0, or -1 with errno set
   (kept for every later call).  Then hand out a trampoline that owns
   `span` bytes (one slot or several), or NULL with errno set.
   (Python/perf_arena.c) */
extern int _PyPerf_InitArenas(void);
extern char *_PyPerf_NewSlot(size_t span);

/* Write the name of `co` to buf, which holds _PyPerf_MAX_NAME bytes (no
   NUL); return its length.  Cannot fail.  (Python/perf_name.c) */
extern size_t _PyPerf_FormatName(PyCodeObject *co, char *buf);

/* This thread's C stack (Python/perf_stack.c).
   Trampolines may be called where sp is in [limit, high), and while they
   add no more than `room` bytes more to it; below limit, frames entering
   the evaluator from C raise RecursionError.  Unknown (all 0) until the
   thread's first call through the hook or the fast path; a thread whose
   stack cannot be found never calls a trampoline. */
typedef struct {
    uintptr_t limit;
    uintptr_t high;
    uintptr_t low;              /* the lowest address the stack may reach */
    size_t room;
    int known;
    /* Set while a frame runs through the unnamed trampoline (see
       _PyPerf_EnterUnnamed()); `room` is 0 then. */
    int unnamed;
} _PyPerf_Stack;

/* initial-exec TLS needs no call to reach, but a library loaded with
   dlopen() may find no room for it: only the executable gets it. */
#if defined(Py_ENABLE_SHARED) || defined(PY_PERF_EXTENSION)
#  define _PyPerf_TLS _Thread_local
#else
#  define _PyPerf_TLS _Thread_local __attribute__((tls_model("initial-exec")))
#endif
extern _PyPerf_TLS _PyPerf_Stack _PyPerf_stack;
/* Set RecursionError and return 1 if sp, where a frame enters the
   evaluator from C, lies in this thread's reserve. */
extern int _PyPerf_StackExhaustedAt(PyThreadState *tstate, uintptr_t sp);
/* Whether a frame entering the evaluator from C at sp may go through its
   trampoline (then only while the room allows it). */
extern int _PyPerf_MayCallTrampoline(uintptr_t sp);

extern PyObject *_PyPerf_EvalFrame(
    PyThreadState *tstate, struct _PyInterpreterFrame *frame, int throwflag);
#ifdef PY_PERF_EXTENSION
/* A stock evaluator makes every Python call a C call while a hook is
   installed: the hook refuses a frame with RecursionError where the
   thread's C stack runs out.  A stack that is not the thread's own (a
   fiber's), or not found, is left unguarded, as without the extension. */
extern int _PyPerf_StackExhausted(PyThreadState *tstate);
#endif
/* The hook while another PEP 523 function is chained behind ours. */
extern PyObject *_PyPerf_EvalFrameChained(
    PyThreadState *tstate, struct _PyInterpreterFrame *frame, int throwflag);
extern _PyPerf_Trampoline _PyPerf_ForCallSlow(
    PyThreadState *tstate, PyCodeObject *co, uintptr_t sp);

/* True if tstate's interpreter runs frames through perf trampolines. */
#define _PyPerf_IS_INSTALLED(tstate) \
    ((tstate)->interp->eval_frame == _PyPerf_EvalFrame)

/* The trampoline of `co` stored at co_extra `index`, or NULL. */
static inline _PyPerf_Trampoline
_PyPerf_Lookup(PyCodeObject *co, Py_ssize_t index)
{
    _PyCodeObjectExtra *extra = (_PyCodeObjectExtra *)co->co_extra;
    /* One unsigned comparison also rejects index -1 (no backend). */
    if (extra == NULL || (size_t)index >= (size_t)extra->ce_size) {
        return NULL;
    }
    return (_PyPerf_Trampoline)extra->ce_extras[index];
}

/* The trampoline of `co` in the main interpreter, if it has one already:
   the case that must be fast. */
static inline _PyPerf_Trampoline
_PyPerf_MainTrampoline(PyInterpreterState *interp, PyCodeObject *co)
{
    if (interp->id != 0) {
        return NULL;
    }
    return _PyPerf_Lookup(co, _PyPerf_core.main_index);
}

/* Whether sp, this thread's stack pointer or near it, lies where
   trampolines may be called (Python/perf_trampoline.c); false also while
   the thread's stack is not known yet. */
#define _PyPerf_ABOVE_RESERVE(sp) \
    ((sp) >= _PyPerf_stack.limit && (sp) < _PyPerf_stack.high)

/* Read the register named `x86_64` or `aarch64` into `out`. */
#if defined(__x86_64__)
#  define _PyPerf_READ_REG(out, x86_64, aarch64) \
    __asm__ volatile ("mov %%" x86_64 ", %0" : "=r" (out))
#else
#  define _PyPerf_READ_REG(out, x86_64, aarch64) \
    __asm__ volatile ("mov %0, " aarch64 : "=r" (out))
#endif

static inline __attribute__((always_inline)) uintptr_t
_PyPerf_GetSP(void)
{
    uintptr_t sp;
    _PyPerf_READ_REG(sp, "rsp", "sp");
    return sp;
}

/* The bytes a call through a trampoline adds to the C stack, made where
   the calling function's CFA is `cfa`: the trampoline's frame, and a frame
   the size of the caller's (the caller's own, where it calls the
   trampoline instead of tail-calling the evaluator; a second evaluator
   frame, where the evaluator calls it instead of running the call
   inline). */
#define _PyPerf_CALL_COST(cfa) \
    ((uintptr_t)(cfa) - _PyPerf_GetSP() + _PyPerf_TRAMPOLINE_FRAME)

/* Where the room is used up, the frame goes through the thread's one
   unnamed trampoline instead, unless one runs already: perf names it, and
   every frame it runs, "py::[deeper frames, beyond the C stack room]",
   never after the innermost frame that got a trampoline (which did not
   call them directly).  Its entry keeps no records and it leaves the
   thread no room: no frame below it is named.  Returns NULL, or the
   trampoline with *room set as _PyPerf_TakeRoom() sets it. */
extern _PyPerf_Trampoline _PyPerf_EnterUnnamed(PyThreadState *tstate,
                                               size_t *room);

/* After a trampoline returns: put back the room taken before the call,
   and leave the unnamed trampoline's frames if it was that one (under it
   no other trampoline is called). */
static inline __attribute__((always_inline)) void
_PyPerf_LeaveTrampoline(size_t room)
{
    _PyPerf_stack.room = room;
    _PyPerf_stack.unnamed = 0;
}

/* Take `cost` bytes of this thread's room before calling a trampoline:
   returns 0 if fewer are left, otherwise 1 and, in *room, what to put back
   in _PyPerf_stack.room when the trampoline returns.  Put back, not added
   back: a stack switched while a trampoline ran (greenlet) returns to the
   room it left. */
static inline __attribute__((always_inline)) int
_PyPerf_TakeRoom(size_t cost, size_t *room)
{
    size_t left = _PyPerf_stack.room;
    if (cost > left) {
        return 0;
    }
    *room = left;
    _PyPerf_stack.room = left - cost;
    return 1;
}

/* The trampoline a Python-to-Python call of `co` goes through, or NULL to
   inline the call as usual.  The common case, the main interpreter calling
   code that has a trampoline on a stack with room, takes no call (in a
   static libpython: a shared one reaches _PyPerf_stack through
   __tls_get_addr).  Taking the frame address also gives the evaluator a
   frame record when nothing else would: --with-frame-pointers=python
   relies on it, so this is inlined even where nothing else is (not
   Py_ALWAYS_INLINE: a debug build defines that away).  A build without
   frame pointers reads a local's address instead: a frame record would
   take a register from the evaluator's loop (1-2% more instructions)
   for a chain that nothing walks there. */
static inline __attribute__((always_inline)) _PyPerf_Trampoline
_PyPerf_ForCall(PyThreadState *tstate, PyCodeObject *co)
{
#if defined(PY_WITHOUT_FRAME_POINTERS) || defined(PY_PERF_FRAME_RECORDS)
    char here;
    uintptr_t sp = (uintptr_t)&here;
#else
    uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
#endif
    if (_PyPerf_ABOVE_RESERVE(sp)) {
        _PyPerf_Trampoline t = _PyPerf_MainTrampoline(tstate->interp, co);
        if (t != NULL) {
            return t;
        }
    }
    return _PyPerf_ForCallSlow(tstate, co, sp);
}


/* ---- Frame records of inlined calls (Python/ceval.c) ------------------ */

/* PY_PERF_FRAME_RECORDS: the evaluator is compiled with the frame pointer
   register reserved (configure's PERF_EVAL_CFLAGS) and left to it.  It
   keeps there the head of a chain of frame records: a trampoline's, then
   one per Python call it runs inline, each naming the callee's
   trampoline.  A frame-pointer walk (perf record -g) reads them as the
   frames of those trampolines; unwinders that follow the call frame
   information (gdb, perf --call-graph=dwarf) never look at them. */
typedef struct _PyPerf_Record {
    struct _PyPerf_Record *prev;
    void *ret;
} _PyPerf_Record;

/* Records an evaluator entry has room for, in the bytes its trampoline
   left free (Python/asm_trampoline.S's RECORD_AREA: change both
   together); deeper inlined calls enter the evaluator again, through their
   trampolines.  The innermost is lowest: arm64's kernel walks only towards
   higher addresses. */
#define _PyPerf_RECORDS 8
#define _PyPerf_RECORD_AREA (_PyPerf_RECORDS * (int)sizeof(_PyPerf_Record))

/* The trampoline a record names `co` by: the main interpreter's, made if
   need be (no room taken: a record takes no stack of its own), or
   NULL.  An entry goes on keeping records after trampolines are switched
   off in it: its calls then learn that without a call. */
extern _PyPerf_Trampoline _PyPerf_RecordTrampolineSlow(
    PyThreadState *tstate, PyCodeObject *co);

static inline __attribute__((always_inline)) _PyPerf_Trampoline
_PyPerf_RecordTrampoline(PyThreadState *tstate, PyCodeObject *co)
{
    _PyPerf_Trampoline t = _PyPerf_Lookup(co, _PyPerf_core.main_index);
    if (t == NULL && _PyPerf_IS_INSTALLED(tstate)) {
        t = _PyPerf_RecordTrampolineSlow(tstate, co);
    }
    return t;
}

#ifdef PY_PERF_FRAME_RECORDS

static inline __attribute__((always_inline)) _PyPerf_Record *
_PyPerf_GetFP(void)
{
    _PyPerf_Record *fp;
    _PyPerf_READ_REG(fp, "rbp", "x29");
    return fp;
}

static inline __attribute__((always_inline)) void
_PyPerf_SetFP(_PyPerf_Record *fp)
{
#  if defined(__x86_64__)
    __asm__ volatile ("mov %0, %%rbp" : : "r" (fp) : "memory");
#  else
    __asm__ volatile ("mov x29, %0" : : "r" (fp) : "memory");
#  endif
}

/* Push the record {the frame pointer, ret}, the frame pointer's new
   place, in as few instructions as the frame pointer allows; pop it.  The
   record is written before the frame pointer moves to it: a walk may
   interrupt anywhere between. */
static inline __attribute__((always_inline)) void
_PyPerf_PushRecord(void *ret)
{
    Py_BUILD_ASSERT(sizeof(_PyPerf_Record) == 16);  /* the asm's steps */
#  if defined(__x86_64__)
    __asm__ volatile ("mov %%rbp, -16(%%rbp)\n\t"
                      "mov %0, -8(%%rbp)\n\t"
                      "lea -16(%%rbp), %%rbp" : : "r" (ret));
#  else
    /* Not a pre-indexed stp: its base may not be one of its sources. */
    __asm__ volatile ("stp x29, %0, [x29, #-16]\n\t"
                      "sub x29, x29, #16" : : "r" (ret));
#  endif
}

static inline __attribute__((always_inline)) void
_PyPerf_PopRecord(void)
{
#  if defined(__x86_64__)
    __asm__ volatile ("lea 16(%rbp), %rbp");
#  else
    __asm__ volatile ("add x29, x29, #16");
#  endif
}

/* A return address as the calling code holds it: on arm64 without the
   pointer authentication code that a function built with
   -mbranch-protection adds to its saved x30 (the trampoline's own copy of
   the address is plain).  Whether __builtin_return_address() strips it is
   up to the compiler, so it is stripped here: xpaclri, a hint (a nop
   without PAC), works on x30 only, and leaves a plain address as it is. */
static inline __attribute__((always_inline)) void *
_PyPerf_CodeAddress(void *ret)
{
#  if defined(__aarch64__)
    register void *x30 __asm__("x30") = ret;
    __asm__ ("hint #7" : "+r" (x30));       /* xpaclri */
    return x30;
#  else
    return ret;
#  endif
}

/* The record naming the trampoline that called the evaluator entry whose
   CFA and return address these are, or NULL if no trampoline called it
   (see Python/asm_trampoline.S).  The trampoline left the frame pointer at
   its frame record, its return address below that, and a free word below
   that, which this fills in. */
#  define _PyPerf_TRAMPOLINE_RECORD(CFA, RET) \
    ((char *)_PyPerf_GetFP() == (char *)(CFA) + _PyPerf_RECORD_AREA + 16 \
     && ((void **)_PyPerf_GetFP())[-1] == _PyPerf_CodeAddress(RET) \
     ? _PyPerf_NameTrampoline(_PyPerf_GetFP()) : NULL)

static inline _PyPerf_Record *
_PyPerf_NameTrampoline(_PyPerf_Record *frame_record)
{
    frame_record[-1].prev = frame_record;
    return &frame_record[-1];
}
#endif


/* ---- gdb's JIT interface (Python/perf_gdb_jit.c) ----------------------- */

/* Describe `size` bytes at `code`, filled with template copies every
   `slot_size` bytes, to debuggers.  Best effort: nothing is reported if it
   cannot be done. */
extern void _PyPerf_GdbRegisterCode(const void *code, size_t size,
                                    size_t slot_size);


/* ---- Profiler files in /tmp (Python/perf_files.c) ---------------------- */

/* Print one line to stderr without running Python code. */
extern void _PyPerf_Warn(const char *format, ...);
/* close() for error paths: errno stays what the failure set. */
extern void _PyPerf_CloseKeepErrno(int fd);

/* A profiler file of this process: the descriptor, the identity of the
   file it was opened on, and the bytes of whole records in it. */
typedef struct {
    int fd;                     /* -1: not open */
    int tagged;                 /* its description is tagged (perf_files.c) */
    int relock;                 /* another description holds the lock */
    dev_t dev;
    ino_t ino;
    off_t size;                 /* bytes at open, plus those appended */
    /* The file's size after our last write of lines, or 0 if not known
       (see _PyPerf_FileAppendLines). */
    off_t lines_end;
    char path[64];
} _PyPerf_File;

/* _PyPerf_FileOpen() flag: keep what this process wrote before an exec
   (file->size is then the file's size, for the caller to check);
   otherwise start empty. */
#define _PyPerf_FILE_KEEP 1

extern int _PyPerf_FileOpen(_PyPerf_File *file, const char *path,
                            int flags);
/* Append with one write() (the descriptor is O_APPEND).  *written is
   what went in, also when it fails part way: that is never cut back. */
extern int _PyPerf_FileAppend(_PyPerf_File *file, const void *buf,
                              size_t size, size_t *written);
/* The same for whole lines (a perf map's): they start on a line of their
   own, after a newline if the file ends inside someone else's line. */
extern int _PyPerf_FileAppendLines(_PyPerf_File *file, const char *lines,
                                   size_t size, size_t *written);
extern void _PyPerf_FileMarkEnd(_PyPerf_File *file);
extern int _PyPerf_FileOpenReadOnly(const _PyPerf_File *file);
extern int _PyPerf_FileDetach(_PyPerf_File *file, _PyPerf_File *parent);
extern void _PyPerf_FileForget(_PyPerf_File *file);
extern void _PyPerf_FileClose(_PyPerf_File *file);
extern int _PyPerf_FileReopen(_PyPerf_File *file);
/* Files of lines (the perf map): whole lines, many at a time, each batch
   ending with a newline, are passed to a function that returns 0 to go
   on. */
typedef int (*_PyPerf_LinesFunc)(char *lines, size_t size, void *arg);
extern int _PyPerf_ReadLines(const _PyPerf_File *from, off_t size,
                             _PyPerf_LinesFunc each, void *arg);
extern int _PyPerf_ReadLinesOf(const char *path, const _PyPerf_File *not_this,
                               _PyPerf_LinesFunc each, void *arg);


/* ---- Unwind description and DWARF (Python/perf_unwind.c) --------------- */

/* The rules of one stretch of the template, up to byte `end`: where the
   CFA is, and where the caller's fp and return address are. */
typedef struct {
    size_t end;
    unsigned int cfa_reg;
    unsigned int cfa_offset;
    unsigned int fp_below_cfa;  /* saved at CFA - this; 0: still in fp */
    unsigned int ra_below_cfa;  /* saved at CFA - this; 0: still in the
                                   return address register */
    int ra_signed;              /* aarch64: the return address is signed */
} _PyPerf_FrameRow;

/* The template's DWARF call frame information: the two CFA programs the
   jitdump's tables are built around, and the same rules as rows, for the
   gdb images' tables. */
typedef struct {
    unsigned int elf_machine;
    size_t code_size;           /* bytes of the template: an FDE's range */
    unsigned int code_align;    /* CIE code alignment factor */
    int data_align;             /* CIE data alignment factor */
    unsigned int ra_column;     /* CIE return address column */
    /* CIE initial instructions: the rules at the template's first byte */
    uint8_t initial[16];
    size_t initial_size;
    /* FDE instructions: the rules' changes through the template */
    uint8_t program[64];
    size_t program_size;
    /* The rows, in order; the last ends at code_size. */
    _PyPerf_FrameRow rows[8];
    size_t row_count;
    unsigned int pc_reg;        /* DWARF numbers of the pc and of fp */
    unsigned int fp_reg;
} _PyPerf_TemplateCFI;

/* Describe `code`, a copy of the template for `elf_machine`.  Returns 0, or
   -1 with errno set (ENOEXEC: the code does not match the description,
   also reported on stderr if `warn`; EINVAL: unknown machine; ENOSPC: the
   description does not fit `cfi`).  (This, _PyPerf_EmitCIE,
   _PyPerf_EmitSlotsFDE and _PyPerf_BuildEhFrame are exported for
   _testinternalcapi.) */
PyAPI_FUNC(int) _PyPerf_DescribeCode(unsigned int elf_machine,
                                     const uint8_t *code, size_t code_size,
                                     _PyPerf_TemplateCFI *cfi, int warn);

/* A DWARF output buffer.  Writes past `size` are counted, not stored: a
   buffer of size 0 measures what would be written. */
typedef struct {
    uint8_t *start;
    size_t size;
    size_t pos;
} _PyPerf_Dwarf;

#define _PyPerf_DWARF_OVERFLOWED(b) ((b)->pos > (b)->size)

/* .eh_frame pointer encodings (LSB) */
#define _PyPerf_DW_EH_PE_absptr 0x00
#define _PyPerf_DW_EH_PE_udata4 0x03
#define _PyPerf_DW_EH_PE_sdata4 0x0b
#define _PyPerf_DW_EH_PE_pcrel 0x10
#define _PyPerf_DW_EH_PE_datarel 0x30

extern void _PyPerf_EmitBytes(_PyPerf_Dwarf *b, const void *bytes,
                              size_t size);
extern void _PyPerf_EmitU8(_PyPerf_Dwarf *b, uint8_t v);
extern void _PyPerf_EmitU32(_PyPerf_Dwarf *b, uint32_t v);
/* A CIE for `cfi` whose FDEs encode pc_begin as `pointer_encoding`
   (absptr: 8 bytes; pcrel|sdata4: 4).  Returns the CIE's offset. */
PyAPI_FUNC(size_t) _PyPerf_EmitCIE(_PyPerf_Dwarf *b,
                                   const _PyPerf_TemplateCFI *cfi,
                                   uint8_t pointer_encoding);
/* An FDE for the CIE at `cie`, covering cfi->code_size bytes from
   `pc_begin`: an absolute address, or for pcrel the distance from this
   FDE's pc_begin field to the code.  Returns the FDE's offset. */
extern size_t _PyPerf_EmitFDE(_PyPerf_Dwarf *b, size_t cie,
                              const _PyPerf_TemplateCFI *cfi,
                              uint8_t pointer_encoding, int64_t pc_begin);

/* An FDE (absolute pointers) covering `size` bytes from `start`, filled
   with copies of the template every `slot_size` bytes from `start`, all
   described by one set of rules that pick the row from the pc's offset
   in its slot.  Returns the FDE's offset. */
PyAPI_FUNC(size_t) _PyPerf_EmitSlotsFDE(_PyPerf_Dwarf *b, size_t cie,
                                        const _PyPerf_TemplateCFI *cfi,
                                        uint64_t start, size_t size,
                                        size_t slot_size);

/* What the jitdump puts in an unwinding record for the template: .eh_frame
   then .eh_frame_hdr, for code lying `text_gap` bytes before .eh_frame.
   Returns the total size and stores the .eh_frame_hdr's in *hdr_size; -1
   with errno set if `buf` is too small. */
PyAPI_FUNC(Py_ssize_t) _PyPerf_BuildEhFrame(
    const _PyPerf_TemplateCFI *cfi, size_t text_gap, uint8_t *buf,
    size_t buf_size, size_t *hdr_size);

#else   /* !PY_HAVE_PERF_TRAMPOLINE */

#define _PyPerf_IS_INSTALLED(tstate) 0
#define _PyPerf_AtExit()

#endif  /* PY_HAVE_PERF_TRAMPOLINE */

#ifdef __cplusplus
}
#endif
#endif  /* !Py_INTERNAL_PERF_H */
