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
 * Memory.  Trampolines live in arenas of executable memory
 * (Python/perf_arena.c); a slot, once handed out, belongs to its code
 * object forever.  The trampoline is found through a co_extra slot of the
 * code object (one index per interpreter and backend), created on the
 * first call.
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
 * but for a RecursionError where the C stack is nearly used up
 * (Python/perf_stack.c).
 *
 * Output.  A backend tells the profiler about each new trampoline: the perf
 * map (/tmp/perf-<pid>.map, Python/perf_map.c) or a jitdump
 * (Python/perf_jit_trampoline.c), both through the small interface in
 * Include/internal/pycore_perf.h; this file knows nothing of their
 * formats.  perf reads those files (perf report, perf inject) long after the
 * process is gone, so they are never removed.  A forked child has a new
 * pid, so it starts its own file holding everything it inherited, and
 * takes its new trampolines from arenas of its own (perf names what the
 * child inherited from the parent's file).  The names are
 * Python/perf_name.c's.  Another process may switch trampolines on and off
 * (Python/perf_remote.c).
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
#include <pthread.h>              // pthread_once()

/* ----------------------------------------------------------------------
 * Constants
 */

/* How deep in class bodies a code object's first run looks for the code
   objects they define (see new_nested()). */
#define MAX_CLASS_NESTING 4

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
#define NO_ARENA \
    "cannot map more executable memory; functions called from now on get " \
    "no trampoline"

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

/* The bytes each of `backend`'s trampolines owns. */
static size_t
backend_span(const _PyPerf_Backend *backend)
{
    size_t code_size = _PyPerf_core.code_size;
    return backend->span != NULL ? backend->span(code_size) : code_size;
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
    char *slot = _PyPerf_NewSlot(a->span);
    if (slot == NULL) {
        report_failure(NO_ARENA);
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
    _PyPerf_core.entries[i].name_size = _PyPerf_FormatName(co, name);
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
        .span = backend_span(pi->backend),
        .first = co,
    };
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

/* The unnamed trampoline of each backend: made on first need, never
   freed (a forked child's perf names it from the parent's file). */
static char *unnamed[BACKEND_COUNT];

#define UNNAMED_NAME "py::[deeper frames, beyond the C stack room]"

static _PyPerf_Trampoline
unnamed_trampoline(const perf_interp *pi)
{
    int b = backend_number(pi->backend);
    if (unnamed[b] == NULL && _PyPerf_core.arena_status == _PyPerf_ARENAS_OK
        && !_PyPerf_core.no_new)
    {
        char *slot = _PyPerf_NewSlot(backend_span(pi->backend));
        if (slot == NULL) {
            report_failure(NO_ARENA);
            return NULL;
        }
        _PyPerf_Entry entry = {slot, UNNAMED_NAME, strlen(UNNAMED_NAME)};
        if (pi->backend->write_entries(&entry, 1,
                                       _PyPerf_core.code_size) < 0)
        {
            report_failure(WRITE_FAILED);
            return NULL;
        }
        unnamed[b] = slot;
    }
    if (pi->backend == &_PyPerf_MapBackend && unnamed[b] != NULL) {
        _PyPerf_core.unnamed_ret = unnamed[b] + _PyPerf_core.return_offset;
    }
    return (_PyPerf_Trampoline)unnamed[b];
}

_PyPerf_Trampoline
_PyPerf_EnterUnnamed(PyThreadState *tstate, size_t *room)
{
    if (_PyPerf_stack.unnamed || !_PyPerf_stack.known) {
        return NULL;
    }
    perf_interp *pi = find_interp(tstate->interp);
    if (pi == NULL || pi->backend == NULL) {
        return NULL;
    }
    _PyPerf_Trampoline t = unnamed_trampoline(pi);
    if (t != NULL) {
        *room = _PyPerf_stack.room;
        _PyPerf_stack.room = 0;
        _PyPerf_stack.unnamed = 1;
    }
    return t;
}

/* Call `eval` through trampoline `t` from a function whose CFA is `cfa`,
   if the C stack has room for it (Python/perf_stack.c), otherwise `eval`
   itself.  The extension keeps no account: it cannot run calls inline, so
   every frame goes through its trampoline, and the call is a tail call. */
#ifdef PY_PERF_EXTENSION
#  define CALL_TRAMPOLINE(t, cfa, tstate, frame, throwflag, eval) \
    return (t)((tstate), (frame), (throwflag), (eval))
#else
#  define CALL_TRAMPOLINE(t, cfa, tstate, frame, throwflag, eval) \
    do { \
        size_t room; \
        _PyPerf_Trampoline via = (t); \
        if (!_PyPerf_TakeRoom(_PyPerf_CALL_COST(cfa), &room) \
            && (via = _PyPerf_EnterUnnamed((tstate), &room)) == NULL) \
        { \
            return (eval)((tstate), (frame), (throwflag)); \
        } \
        PyObject *res = via((tstate), (frame), (throwflag), (eval)); \
        _PyPerf_LeaveTrampoline(room); \
        return res; \
    } while (0)
#endif

static Py_NO_INLINE PyObject *
eval_frame_slow(PyThreadState *tstate, _PyInterpreterFrame *frame,
                int throwflag, uintptr_t sp)
{
    if (_PyPerf_StackExhaustedAt(tstate, sp)) {
        return NULL;
    }
    _PyPerf_Trampoline t = NULL;
    if (_PyPerf_MayCallTrampoline(sp)) {
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
   where the C stack allows it (Python/perf_stack.c).  The common case is a
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

_PyPerf_Trampoline
_PyPerf_ForCallSlow(PyThreadState *tstate, PyCodeObject *co, uintptr_t sp)
{
    if (!_PyPerf_MayCallTrampoline(sp)) {
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
    if (_PyPerf_StackExhaustedAt(tstate, sp)) {
        return NULL;
    }
    perf_interp *pi = find_interp(tstate->interp);
    _PyFrameEvalFunction next = _PyEval_EvalFrameDefault;
    if (pi != NULL && pi->chained != NULL) {
        next = pi->chained;
    }
    _PyPerf_Trampoline t = NULL;
    if (_PyPerf_MayCallTrampoline(sp)) {
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
    if (_PyPerf_InitArenas() < 0) {
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
