/*
 * Perf trampolines: the C stack they may take
 * ===========================================
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
 * RecursionError (_PyPerf_StackExhaustedAt()), where without perf the
 * program would go on for those few more bytes, or raise RecursionError
 * at its recursion limit, or crash.  Neither crash nor recursion limit comes
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

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <fcntl.h>                // open()
#include <pthread.h>              // pthread_getattr_np()
#include <sys/resource.h>         // getrlimit()
#include <sys/syscall.h>          // SYS_gettid
#include <unistd.h>               // getpid()

/* Trampolines, and the evaluator frames of the calls run through them
   instead of inline, may hold at most 1/STACK_ROOM_DIVISOR of a thread's
   C stack at a time. */
#define STACK_ROOM_DIVISOR 25

/* Frames entering the evaluator from C within this many bytes of the
   bottom of a thread's C stack raise RecursionError: room to raise it,
   unwind and report it: 1/STACK_RESERVE_DIVISOR of the stack, from
   STACK_RESERVE_MIN to STACK_RESERVE (the extension, PY_PERF_EXTENSION:
   STACK_RESERVE), and never more than a quarter of it. */
#define STACK_RESERVE_DIVISOR 64
#define STACK_RESERVE_MIN (4 * 1024)
#define STACK_RESERVE (64 * 1024)

_PyPerf_TLS _PyPerf_Stack _PyPerf_stack;


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

int
_PyPerf_StackExhaustedAt(PyThreadState *tstate, uintptr_t sp)
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

int
_PyPerf_MayCallTrampoline(uintptr_t sp)
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

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
