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
 *     without                           with
 *
 *     _PyEval_EvalFrameDefault          _PyEval_EvalFrameDefault
 *     _PyEval_EvalFrameDefault          py::parse:/srv/app.py       <- trampoline
 *     _PyEval_EvalFrameDefault          _PyEval_EvalFrameDefault
 *     main                              py::<module>:/srv/app.py    <- trampoline
 *                                       main
 *
 * Trampolines are copies of the template in Python/asm_trampoline.S.  The
 * template keeps a frame record (saved frame pointer + return address), so
 * a frame-pointer unwinder steps from _PyEval_EvalFrameDefault into the
 * trampoline and on into the caller.  That requires the interpreter to be
 * built with frame pointers (configure's default when this is enabled); the
 * perf_jit backend instead describes the trampolines with DWARF unwind info.
 *
 * Memory.  Trampolines live in arenas: an arena is mapped read-write, filled
 * with template copies, then made read-execute (never writable and executable
 * at once) and handed out slot by slot with a bump pointer:
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
 * Entry.  The PEP 523 frame-evaluation hook, _PyPerfTrampoline_EvalFrame,
 * runs every frame that goes through _PyEval_EvalFrame via its trampoline.
 * Python-to-Python calls do not go through it: ceval.c keeps its
 * specialized call instructions while our hook is installed and calls the
 * callee's trampoline directly (_PyPerfTrampoline_ForCall), falling back to
 * its ordinary inlined call when the C stack runs low.  Anything that fails
 * here falls back to _PyEval_EvalFrameDefault: the hook never raises and
 * never changes what the program does.
 *
 * Output.  A backend tells the profiler about each new trampoline: the perf
 * map (/tmp/perf-<pid>.map, one "START SIZE NAME" line per trampoline, this
 * file) or a jitdump (Python/perf_jit_trampoline.c).  perf reads those files
 * at report time, long after the process is gone, so they are never removed.
 * A forked child has a new pid, so it starts its own file holding everything
 * it inherited.  Debuggers learn about each arena, all its slots at once,
 * when it is made (Python/perf_gdb_jit.c, gdb's JIT interface).
 *
 * Everything here runs with the GIL held (3.11 has one GIL for all
 * interpreters), which serializes all state changes and all file writes.
 */

#include "Python.h"
#include "pycore_ceval.h"         // _PyPerfTrampoline_EvalFrame
#include "pycore_code.h"          // _PyCodeObjectExtra
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_initconfig.h"    // _Py_GetEnv()
#include "pycore_interp.h"        // PyInterpreterState.eval_frame
#include "pycore_pystate.h"       // _PyInterpreterState_GET()

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <fcntl.h>                // open()
#include <pthread.h>              // pthread_getattr_np()
#include <stdarg.h>
#include <sys/mman.h>             // mmap(), mprotect()
#include <sys/resource.h>         // getrlimit()
#include <sys/stat.h>             // fstat()
#include <sys/syscall.h>          // SYS_gettid
#include <unistd.h>               // sysconf(), getpid()

/* ----------------------------------------------------------------------
 * Constants
 */

/* Bytes mapped per arena (rounded up to whole pages). */
#define ARENA_SIZE (64 * 1024)

/* Each trampoline starts on its own 16-byte boundary: branch targets. */
#define SLOT_ALIGN 16

/* Slots are described to gdb this many bytes at a time. */
#define GDB_CHUNK_SIZE 4096

/* Name budget in bytes (after escaping): a longer name is cut and ends in
   "...".  Keeps every entry one bounded line. */
#define MAX_QUALNAME 1024
#define MAX_FILENAME 2048

/* Fast-path calls may use at most 1/STACK_BUDGET_DIVISOR of a thread's C
   stack (about 360 bytes a call on x86_64: 5800 named levels in an 8 MiB
   main thread); the rest stays available to the program, which in stock
   3.11 needs no C stack for Python-to-Python calls at all. */
#define STACK_BUDGET_DIVISOR 4

/* Where the template has BTI landing pads, ask for them to be enforced in
   the arenas as they are in the interpreter's own text (a kernel without
   BTI support refuses PROT_BTI with EINVAL: the arena then goes without). */
#if defined(__aarch64__) && defined(__ARM_FEATURE_BTI_DEFAULT) \
    && defined(PROT_BTI)
#  define ARENA_PROT (PROT_READ | PROT_EXEC | PROT_BTI)
#else
#  define ARENA_PROT (PROT_READ | PROT_EXEC)
#endif

extern char _Py_trampoline_func_start[];
extern char _Py_trampoline_func_end[];

/* ----------------------------------------------------------------------
 * State
 */

typedef enum {
    PERF_STATUS_NO_INIT,          /* arenas not tried yet */
    PERF_STATUS_OK,
    PERF_STATUS_FAILED,           /* no executable memory: decided once */
} perf_status;

extern const _PyPerf_Backend _PyPerf_MapBackend;

static const _PyPerf_Backend *const backends[] = {
    &_PyPerf_MapBackend,
#ifdef PY_HAVE_PERF_JIT_TRAMPOLINE
    &_PyPerf_JitBackend,
#endif
};
#define BACKEND_COUNT ((int)(sizeof(backends) / sizeof(backends[0])))

/* An interpreter that activated trampolines at least once. */
typedef struct {
    int64_t interp_id;
    const _PyPerf_Backend *backend;     /* active backend, NULL if none */
    /* co_extra index per backend (each backend's trampolines are described
       in its own output), -1 until requested */
    Py_ssize_t extra_index[BACKEND_COUNT];
} perf_interp;

static struct {
    perf_status status;
    int saved_errno;              /* why status is FAILED */
    size_t code_size;             /* bytes of the template */
    size_t slot_size;             /* code_size rounded up to SLOT_ALIGN */
    char *next;                   /* next free slot in the current arena */
    char *described;              /* end of the part described to gdb */
    char *limit;                  /* end of the current arena */
    size_t arena_count;
    size_t trampoline_count;
    int warned;                   /* a runtime failure was reported */
    perf_interp *interps;
    size_t interp_count;
} perf_state;

/* co_extra index for the main interpreter's active backend (-1 if none):
   read on every fast-path call, so it lives outside the struct. */
Py_ssize_t _PyPerfTrampoline_MainIndex = -1;

/* The address below which a fast-path call on this thread takes the
   inlined path instead; UINTPTR_MAX until the thread's stack is known. */
_Py_PERF_TLS uintptr_t _PyPerfTrampoline_StackLimit = UINTPTR_MAX;
static _Py_PERF_TLS int stack_limit_known;

static int
backend_number(const _PyPerf_Backend *backend)
{
    for (int i = 0; i < BACKEND_COUNT; i++) {
        if (backends[i] == backend) {
            return i;
        }
    }
    Py_UNREACHABLE();
}

/* ----------------------------------------------------------------------
 * Files in /tmp, shared by the backends
 */

/* Print one line to stderr without running Python code: callers may be
   inside the eval hook, where calling sys.stderr could re-enter it. */
void
_PyPerf_Warn(const char *format, ...)
{
    char line[512];
    int n = PyOS_snprintf(line, sizeof(line) - 1, "Python perf trampolines: ");
    va_list vargs;
    va_start(vargs, format);
    int m = PyOS_vsnprintf(line + n, sizeof(line) - 1 - n, format, vargs);
    va_end(vargs);
    n = (m < 0) ? n : Py_MIN(n + m, (int)sizeof(line) - 2);
    line[n++] = '\n';
    (void)_PyPerf_WriteAll(STDERR_FILENO, line, n);
}

int
_PyPerf_WriteAll(int fd, const void *buf, size_t size)
{
    const char *p = buf;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0) {
            if (errno == EINTR) {
                continue;
            }
            return -1;
        }
        if (n == 0) {
            errno = ENOSPC;
            return -1;
        }
        p += n;
        size -= (size_t)n;
    }
    return 0;
}

/* A profiler file lives in /tmp under a predictable name, and in a
 * process that may do anything with file descriptors.  So:
 *
 * - It is opened without following a symlink, without blocking on a FIFO,
 *   and kept only if it is a plain file of ours with no other link; it is
 *   made private (0600).  A file left by a dead process that had our pid
 *   is emptied.
 * - A program may close descriptors it did not open (a daemon closing them
 *   all) and get the same number back from its next open().  Writing
 *   through the old number would put our records into its file, so every
 *   use checks the descriptor still refers to our file (device and inode),
 *   and reopens our file by name if the program closed it.
 * - A write cut short (a full disk) is undone, so the file only ever holds
 *   whole records: only this process writes to it.
 */

int
_PyPerf_FileOpen(_PyPerf_File *file, const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW
                        | O_CLOEXEC | O_NONBLOCK, 0600);
    if (fd < 0) {
        return -1;
    }
    struct stat st;
    if (fstat(fd, &st) < 0) {
        goto error;
    }
    if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()
        || st.st_nlink != 1)
    {
        errno = EPERM;
        goto error;
    }
    if (fchmod(fd, 0600) < 0 || ftruncate(fd, 0) < 0) {
        goto error;
    }
    file->fd = fd;
    file->dev = st.st_dev;
    file->ino = st.st_ino;
    file->size = 0;
    PyOS_snprintf(file->path, sizeof(file->path), "%s", path);
    return 0;

error:;
    int saved = errno;
    close(fd);
    errno = saved;
    return -1;
}

static int
is_our_file(int fd, const _PyPerf_File *file)
{
    struct stat st;
    return (fstat(fd, &st) == 0 && st.st_dev == file->dev
            && st.st_ino == file->ino);
}

/* Make sure file->fd refers to our file.  Returns 0, or -1 with errno set
   (file->fd is then -1). */
int
_PyPerf_FileCheck(_PyPerf_File *file)
{
    if (file->fd >= 0 && is_our_file(file->fd, file)) {
        return 0;
    }
    /* The number is no longer ours (never close it: it may be the
       program's now).  Reopen our file by name, if it is still there. */
    file->fd = -1;
    if (file->path[0] == '\0') {
        errno = EBADF;
        return -1;
    }
    int fd = open(file->path, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC
                              | O_NONBLOCK);
    if (fd < 0) {
        return -1;
    }
    if (!is_our_file(fd, file)) {
        close(fd);
        errno = ESTALE;
        return -1;
    }
    file->fd = fd;
    return 0;
}

int
_PyPerf_FileAppend(_PyPerf_File *file, const void *buf, size_t size)
{
    if (_PyPerf_FileCheck(file) < 0) {
        return -1;
    }
    if (_PyPerf_WriteAll(file->fd, buf, size) < 0) {
        int saved = errno;
        (void)ftruncate(file->fd, file->size);
        errno = saved;
        return -1;
    }
    file->size += (off_t)size;
    return 0;
}

/* A read-only descriptor of our file (e.g. to map it, or to copy it in a
   forked child), or -1 with errno set. */
int
_PyPerf_FileOpenReadOnly(const _PyPerf_File *file)
{
    char fdpath[64];
    int fd = -1;
    if (file->fd >= 0 && is_our_file(file->fd, file)) {
        PyOS_snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", file->fd);
        fd = open(fdpath, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0 && file->path[0] != '\0') {
        fd = open(file->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    }
    if (fd < 0) {
        return -1;
    }
    if (!is_our_file(fd, file)) {
        close(fd);
        errno = ESTALE;
        return -1;
    }
    return fd;
}

/* Let go of the file (in a forked child: it is the parent's), closing the
   descriptor only if it is still ours. */
void
_PyPerf_FileForget(_PyPerf_File *file)
{
    if (file->fd >= 0 && is_our_file(file->fd, file)) {
        close(file->fd);
    }
    file->fd = -1;
    file->size = 0;
    file->path[0] = '\0';
}

/* Append the first `size` bytes of `from` to `to`. */
int
_PyPerf_CopyFile(const _PyPerf_File *from, off_t size, _PyPerf_File *to)
{
    int in = _PyPerf_FileOpenReadOnly(from);
    if (in < 0) {
        return -1;
    }
    char buf[16384];
    off_t done = 0;
    while (done < size) {
        size_t want = (size_t)Py_MIN((off_t)sizeof(buf), size - done);
        ssize_t n = pread(in, buf, want, done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0 || _PyPerf_FileAppend(to, buf, (size_t)n) < 0) {
            if (n == 0) {
                errno = EIO;
            }
            int saved = errno;
            close(in);
            errno = saved;
            return -1;
        }
        done += n;
    }
    close(in);
    return 0;
}

/* ----------------------------------------------------------------------
 * The perf map backend: /tmp/perf-<pid>.map
 *
 * One line per trampoline, "START SIZE NAME\n" with START and SIZE in hex
 * without "0x", written with a single write() on an O_APPEND descriptor
 * (_PyPerf_FileAppend), so the file only ever holds whole lines.  perf
 * reads it when it resolves samples.
 */

static _PyPerf_File perfmap = {.fd = -1};

/* Lines made during interpreter startup (importlib, site: some 150
   functions) are written together when startup ends, instead of with two
   system calls each.  After that every line is written as it is made, so
   a process that dies leaves a complete map. */
static struct {
    int active;
    size_t len;
    char data[32 * 1024];
} startup_lines;

static int
perfmap_flush_startup_lines(void)
{
    if (startup_lines.len == 0) {
        return 0;
    }
    int res = _PyPerf_FileAppend(&perfmap, startup_lines.data,
                                 startup_lines.len);
    startup_lines.len = 0;
    return res;
}

/* Append `value` in lowercase hex without "0x" (what perf expects). */
static size_t
append_hex(char *buf, size_t pos, uintptr_t value)
{
    char digits[2 * sizeof(value)];
    int n = 0;
    do {
        digits[n++] = "0123456789abcdef"[value & 0xf];
        value >>= 4;
    } while (value != 0);
    while (n > 0) {
        buf[pos++] = digits[--n];
    }
    return pos;
}

static int
perfmap_init(char *path, size_t path_size)
{
    if (perfmap.path[0] == '\0') {
        PyOS_snprintf(perfmap.path, sizeof(perfmap.path),
                      "/tmp/perf-%ld.map", (long)getpid());
    }
    PyOS_snprintf(path, path_size, "%s", perfmap.path);
    if (perfmap.fd >= 0 || perfmap.size > 0) {
        /* Open already (or closed by the program: reopened on use). */
        return 0;
    }
    return _PyPerf_FileOpen(&perfmap, path);
}

static int
perfmap_write_entry(const void *code, size_t code_size,
                    const char *name, size_t name_size)
{
    static char line[64 + _PyPerf_MAX_NAME];     /* under the GIL */
    size_t n = append_hex(line, 0, (uintptr_t)code);
    line[n++] = ' ';
    n = append_hex(line, n, code_size);
    line[n++] = ' ';
    assert(n + name_size + 1 <= sizeof(line));
    memcpy(line + n, name, name_size);
    n += name_size;
    line[n++] = '\n';
    if (startup_lines.active) {
        if (startup_lines.len + n > sizeof(startup_lines.data)
            && perfmap_flush_startup_lines() < 0)
        {
            return -1;
        }
        memcpy(startup_lines.data + startup_lines.len, line, n);
        startup_lines.len += n;
        return 0;
    }
    return _PyPerf_FileAppend(&perfmap, line, n);
}

static int
perfmap_after_fork_child(char *path, size_t path_size)
{
    if (perfmap.path[0] == '\0') {
        return 0;
    }
    /* The inherited file is the parent's: never write to it again. */
    _PyPerf_File parent = perfmap;
    perfmap = (_PyPerf_File){.fd = -1};
    PyOS_snprintf(path, path_size, "/tmp/perf-%ld.map", (long)getpid());
    int res = _PyPerf_FileOpen(&perfmap, path);
    if (res == 0 && parent.size > 0) {
        res = _PyPerf_CopyFile(&parent, parent.size, &perfmap);
    }
    if (res == 0) {
        /* Lines the parent had not written yet: it will, to its file. */
        res = perfmap_flush_startup_lines();
    }
    int saved = errno;
    _PyPerf_FileForget(&parent);
    errno = saved;
    return res;
}

const _PyPerf_Backend _PyPerf_MapBackend = {
    .name = "perf",
    .init = perfmap_init,
    .write_entry = perfmap_write_entry,
    .after_fork_child = perfmap_after_fork_child,
};

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
    size_t count = size / perf_state.slot_size;
    size_t filled = perf_state.slot_size;
    memcpy(mem, _Py_trampoline_func_start, perf_state.code_size);
    while (filled < count * perf_state.slot_size) {
        size_t chunk = Py_MIN(filled, count * perf_state.slot_size - filled);
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
    perf_state.next = mem;
    perf_state.described = mem;
    perf_state.limit = mem + count * perf_state.slot_size;
    perf_state.arena_count++;
    return 0;
}

/* Make sure executable memory can be had: the first arena.  The answer is
   kept, so a refusal (e.g. SELinux execmem) is decided once. */
static int
init_arenas(void)
{
    if (perf_state.status == PERF_STATUS_NO_INIT) {
        perf_state.code_size = _Py_trampoline_func_end
                               - _Py_trampoline_func_start;
        perf_state.slot_size = _Py_SIZE_ROUND_UP(perf_state.code_size,
                                                 SLOT_ALIGN);
        if (new_arena() < 0) {
            perf_state.status = PERF_STATUS_FAILED;
            perf_state.saved_errno = errno;
        }
        else {
            perf_state.status = PERF_STATUS_OK;
        }
    }
    if (perf_state.status == PERF_STATUS_FAILED) {
        errno = perf_state.saved_errno;
        return -1;
    }
    return 0;
}

/* Every slot of an arena holds a trampoline from the start, so gdb can be
   told about them ahead of use (Python/perf_gdb_jit.c); that is done a
   page of slots at a time, as they are handed out, so that its cost
   follows use. */
static void
describe_to_debuggers(void)
{
    size_t chunk = _Py_SIZE_ROUND_UP(GDB_CHUNK_SIZE, perf_state.slot_size);
    char *end = perf_state.described
                + _Py_SIZE_ROUND_UP(perf_state.next - perf_state.described,
                                    chunk);
    end = Py_MIN(end, perf_state.limit);
    _PyPerf_GdbRegisterCode(perf_state.described,
                            end - perf_state.described,
                            perf_state.slot_size);
    perf_state.described = end;
}

/* Hand out a trampoline that owns `span` bytes of address space: one slot,
   or several consecutive ones (the first holds the trampoline). */
static char *
new_slot(size_t span)
{
    size_t size = _Py_SIZE_ROUND_UP(Py_MAX(span, perf_state.code_size),
                                    perf_state.slot_size);
    if ((size_t)(perf_state.limit - perf_state.next) < size
        && new_arena() < 0)
    {
        /* Don't try again for every new code object. */
        perf_state.status = PERF_STATUS_FAILED;
        perf_state.saved_errno = errno;
        return NULL;
    }
    char *slot = perf_state.next;
    perf_state.next += size;
    if (perf_state.next > perf_state.described) {
        describe_to_debuggers();
    }
    perf_state.trampoline_count++;
    return slot;
}

/* ----------------------------------------------------------------------
 * Names: "py::<qualname>:<filename>"
 *
 * Written byte by byte from the str's code points, so it cannot fail or
 * raise: control characters (which could end a map line) become \xNN,
 * lone surrogates (not encodable as UTF-8) become \uXXXX, everything else
 * is UTF-8.  Each part has a byte budget.
 */

static size_t
append_escaped(char *buf, size_t pos, size_t budget, PyObject *str)
{
    static const char hex[] = "0123456789abcdef";
    size_t end = pos + budget;
    if (!PyUnicode_Check(str) || PyUnicode_READY(str) < 0) {
        buf[pos++] = '?';
        return pos;
    }
    int kind = PyUnicode_KIND(str);
    const void *data = PyUnicode_DATA(str);
    Py_ssize_t length = PyUnicode_GET_LENGTH(str);
    Py_ssize_t i = 0;
    if (PyUnicode_IS_ASCII(str)) {
        /* The common case: copy the printable prefix in one go. */
        const unsigned char *ascii = data;
        Py_ssize_t room = (Py_ssize_t)(end - pos) - 3;
        while (i < length && i < room && ascii[i] >= 0x20 && ascii[i] != 0x7f) {
            i++;
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
size_t
_PyPerf_FormatName(PyCodeObject *co, char *buf)
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
    for (size_t i = 0; i < perf_state.interp_count; i++) {
        if (perf_state.interps[i].interp_id == interp->id) {
            return &perf_state.interps[i];
        }
    }
    return NULL;
}

static inline _PyPerf_Trampoline
lookup(PyCodeObject *co, Py_ssize_t index)
{
    _PyCodeObjectExtra *extra = (_PyCodeObjectExtra *)co->co_extra;
    if (extra == NULL || index >= extra->ce_size) {
        return NULL;
    }
    return (_PyPerf_Trampoline)extra->ce_extras[index];
}

/* Report the first run-time failure (errno says why) on stderr; the
   program goes on either way. */
static void
report_failure(const char *what)
{
    if (!perf_state.warned) {
        perf_state.warned = 1;
        _PyPerf_Warn("%s: %s", what, strerror(errno));
    }
}

/* Give `co` a trampoline of its own and describe it to the backend.
   Returns NULL (without an exception) if that cannot be done. */
static _PyPerf_Trampoline
compile_trampoline(PyCodeObject *co, const perf_interp *pi)
{
    if (perf_state.status != PERF_STATUS_OK) {
        return NULL;
    }
    Py_ssize_t index = pi->extra_index[backend_number(pi->backend)];
    size_t span = perf_state.code_size;
    if (pi->backend->span != NULL) {
        span = pi->backend->span(perf_state.code_size);
    }
    char *slot = new_slot(span);
    if (slot == NULL) {
        report_failure("cannot map more executable memory; functions "
                       "called from now on get no trampoline");
        return NULL;
    }
    /* _PyCode_SetExtra can fail (memory), and may set an exception then;
       whatever exception the frame carries (throw()) must survive. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int res = _PyCode_SetExtra((PyObject *)co, index, slot);
    PyErr_Clear();
    PyErr_Restore(type, value, tb);
    if (res < 0) {
        /* The slot stays unused: harmless, and rare. */
        return NULL;
    }
    /* Static (the GIL serializes us): this can run near the bottom of a
       deep C stack, and names take kilobytes. */
    static char name[_PyPerf_MAX_NAME];
    size_t name_size = _PyPerf_FormatName(co, name);
    if (pi->backend->write_entry(slot, perf_state.code_size,
                                 name, name_size) < 0) {
        report_failure("cannot write the profiler's file; new functions "
                       "are missing from it");
    }
    return (_PyPerf_Trampoline)slot;
}

/* The trampoline of `co` in the main interpreter, if it has one already:
   the case that must be fast. */
static inline _PyPerf_Trampoline
main_lookup(PyInterpreterState *interp, PyCodeObject *co)
{
    if (interp->id != 0 || _PyPerfTrampoline_MainIndex < 0) {
        return NULL;
    }
    return lookup(co, _PyPerfTrampoline_MainIndex);
}

/* Everything else: subinterpreters, and code run for the first time. */
static Py_NO_INLINE _PyPerf_Trampoline
trampoline_for_slow(PyInterpreterState *interp, PyCodeObject *co)
{
    perf_interp *pi = find_interp(interp);
    if (pi == NULL || pi->backend == NULL) {
        return NULL;
    }
    Py_ssize_t index = pi->extra_index[backend_number(pi->backend)];
    _PyPerf_Trampoline t = lookup(co, index);
    if (t != NULL) {
        return t;
    }
    return compile_trampoline(co, pi);
}

static inline _PyPerf_Trampoline
trampoline_for(PyInterpreterState *interp, PyCodeObject *co)
{
    _PyPerf_Trampoline t = main_lookup(interp, co);
    return t != NULL ? t : trampoline_for_slow(interp, co);
}

static Py_NO_INLINE PyObject *
eval_frame_slow(PyThreadState *tstate, _PyInterpreterFrame *frame,
                int throwflag)
{
    _PyPerf_Trampoline t = trampoline_for_slow(tstate->interp,
                                               frame->f_code);
    if (t == NULL) {
        return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
    }
    return t(tstate, frame, throwflag, _PyEval_EvalFrameDefault);
}

/* The PEP 523 hook: run the frame through its code object's trampoline.
   The common case is a few loads and a jump to the trampoline; both exits
   are tail calls, so the hook leaves no frame of its own. */
PyObject *
_PyPerfTrampoline_EvalFrame(PyThreadState *tstate,
                            _PyInterpreterFrame *frame, int throwflag)
{
    _PyPerf_Trampoline t = main_lookup(tstate->interp, frame->f_code);
    if (t == NULL) {
        return eval_frame_slow(tstate, frame, throwflag);
    }
    return t(tstate, frame, throwflag, _PyEval_EvalFrameDefault);
}

/* ----------------------------------------------------------------------
 * The fast path's C stack budget
 *
 * 3.11 runs Python-to-Python calls without using the C stack.  The fast
 * path puts one native frame per call back (trampoline + evaluator), so it
 * may only be taken while the thread has stack to spare: below the limit
 * computed here the call is inlined as usual (those frames then merge into
 * their caller in a profile, and the program behaves as without perf).
 */

/* glibc's top of the main thread's stack (weak: absent elsewhere). */
extern void *__libc_stack_end __attribute__((weak));

static void
compute_stack_limit(void)
{
    stack_limit_known = 1;
    /* The main thread: pthread_getattr_np() would parse /proc/self/maps,
       a noticeable part of -X perf's startup cost.  Its stack ends at
       __libc_stack_end and may grow to RLIMIT_STACK. */
    struct rlimit rl;
    if (&__libc_stack_end != NULL && __libc_stack_end != NULL
        && getpid() == (pid_t)syscall(SYS_gettid)
        && getrlimit(RLIMIT_STACK, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
        && rl.rlim_cur < (uintptr_t)__libc_stack_end)
    {
        _PyPerfTrampoline_StackLimit = (uintptr_t)__libc_stack_end
                                       - rl.rlim_cur / STACK_BUDGET_DIVISOR;
        return;
    }
    pthread_attr_t attr;
    void *low;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) {
        return;   /* unknown: this thread never takes the fast path */
    }
    int err = pthread_attr_getstack(&attr, &low, &size);
    pthread_attr_destroy(&attr);
    if (err != 0 || size == 0) {
        return;
    }
    /* The stack grows down from low + size. */
    _PyPerfTrampoline_StackLimit = (uintptr_t)low + size
                                   - size / STACK_BUDGET_DIVISOR;
}

_PyPerf_Trampoline
_PyPerfTrampoline_ForCallSlow(PyThreadState *tstate, PyCodeObject *co,
                              uintptr_t sp)
{
    if (!stack_limit_known) {
        compute_stack_limit();
    }
    if (sp < _PyPerfTrampoline_StackLimit) {
        return NULL;
    }
    return trampoline_for(tstate->interp, co);
}

/* ----------------------------------------------------------------------
 * Activation
 */

static const _PyPerf_Backend *
find_backend(const char *name)
{
    for (int i = 0; i < BACKEND_COUNT; i++) {
        if (strcmp(backends[i]->name, name) == 0) {
            return backends[i];
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
    size_t n = perf_state.interp_count + 1;
    perf_interp *table = PyMem_RawRealloc(perf_state.interps,
                                          n * sizeof(perf_interp));
    if (table == NULL) {
        PyErr_NoMemory();
        return NULL;
    }
    perf_state.interps = table;
    pi = &table[perf_state.interp_count];
    perf_state.interp_count = n;
    pi->interp_id = interp->id;
    pi->backend = NULL;
    for (int i = 0; i < (int)Py_ARRAY_LENGTH(pi->extra_index); i++) {
        pi->extra_index[i] = -1;
    }
    return pi;
}

int
_PyPerfTrampoline_Activate(PyThreadState *tstate, const char *name)
{
    PyInterpreterState *interp = tstate->interp;
    const _PyPerf_Backend *backend = find_backend(name);
    if (backend == NULL) {
        PyErr_Format(PyExc_ValueError,
                     "invalid stack trampoline backend: '%s' (available: %s)",
                     name, _PyPerfTrampoline_BACKEND_NAMES);
        return -1;
    }
    if (interp->eval_frame != NULL
        && interp->eval_frame != _PyPerfTrampoline_EvalFrame)
    {
        PyErr_SetString(PyExc_RuntimeError,
                        "cannot activate the stack trampoline: another "
                        "frame evaluation function (PEP 523) is installed");
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
                            "cannot activate the stack trampoline: no free "
                            "code object extra slot (PEP 523)");
            return -1;
        }
    }
    pi->backend = backend;
    if (interp->id == 0) {
        _PyPerfTrampoline_MainIndex = pi->extra_index[b];
    }
    _PyInterpreterState_SetEvalFrameFunc(interp, _PyPerfTrampoline_EvalFrame);
    return 0;
}

int
_PyPerfTrampoline_Deactivate(PyThreadState *tstate)
{
    PyInterpreterState *interp = tstate->interp;
    /* Only unhook: frames may still be running inside trampolines. */
    if (interp->eval_frame == _PyPerfTrampoline_EvalFrame) {
        _PyInterpreterState_SetEvalFrameFunc(interp, NULL);
    }
    perf_interp *pi = find_interp(interp);
    if (pi != NULL) {
        pi->backend = NULL;
    }
    if (interp->id == 0) {
        _PyPerfTrampoline_MainIndex = -1;
    }
    return 0;
}

int
_PyPerfTrampoline_IsActive(PyThreadState *tstate)
{
    return tstate->interp->eval_frame == _PyPerfTrampoline_EvalFrame;
}

void
_PyPerfTrampoline_FiniInterp(PyInterpreterState *interp)
{
    /* Forget the interpreter: a later one may have the same id (the main
       interpreter after Py_Finalize + Py_Initialize), with fresh co_extra
       indexes. */
    perf_interp *pi = find_interp(interp);
    if (pi == NULL) {
        return;
    }
    if (interp->id == 0) {
        _PyPerfTrampoline_MainIndex = -1;
    }
    size_t i = pi - perf_state.interps;
    memmove(pi, pi + 1, (perf_state.interp_count - i - 1) * sizeof(*pi));
    perf_state.interp_count--;
}

void
_PyPerfTrampoline_AfterForkChild(void)
{
    for (int i = 0; i < BACKEND_COUNT; i++) {
        char path[256];
        path[0] = '\0';
        if (backends[i]->after_fork_child(path, sizeof(path)) < 0) {
            _PyPerf_Warn("cannot start %s for the child process: %s",
                         path, strerror(errno));
        }
    }
}

#else   /* !PY_HAVE_PERF_TRAMPOLINE */

int
_PyPerfTrampoline_Activate(PyThreadState *tstate, const char *name)
{
    PyErr_Format(PyExc_ValueError,
                 "stack trampolines ('%s') are not available: this Python "
                 "was built without perf trampoline support", name);
    return -1;
}

int
_PyPerfTrampoline_Deactivate(PyThreadState *tstate)
{
    return 0;
}

int
_PyPerfTrampoline_IsActive(PyThreadState *tstate)
{
    return 0;
}

void
_PyPerfTrampoline_FiniInterp(PyInterpreterState *interp)
{
}

void
_PyPerfTrampoline_AfterForkChild(void)
{
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */

/* ----------------------------------------------------------------------
 * Startup: -X perf, -X perf_jit, PYTHONPERFSUPPORT, PYTHON_PERF_JIT_SUPPORT
 *
 * The environment is read only when the configuration allows it (not under
 * -E or -I); an -X option overrides the environment, and the last -X option
 * wins.  Activation problems are a warning, never a startup failure.
 */

/* Which backend, if any, the configuration asks for.  Each backend has an
 * -X option and an environment variable; the -X option (the last one, if
 * repeated) decides for its backend, the variable only when there is no
 * such option.  If both backends end up on, perf_jit is used.  Invalid
 * values are configuration errors: initconfig.c checks them with the rest
 * of the configuration, before anything runs.
 */
PyStatus
_PyPerfTrampoline_ConfigBackend(const PyConfig *config, const char **backend)
{
    static const struct {
        const char *backend;
        const wchar_t *xoption;
        const char *env;
        const char *xoption_error;
        const char *env_error;
    } switches[] = {
        {"perf", L"perf", "PYTHONPERFSUPPORT",
         "-X perf: invalid value; use -X perf, -X perf=1 or -X perf=0",
         "PYTHONPERFSUPPORT: invalid value; expected an integer "
         "(0 to disable)"},
        {"perf_jit", L"perf_jit", "PYTHON_PERF_JIT_SUPPORT",
         "-X perf_jit: invalid value; use -X perf_jit, -X perf_jit=1 or "
         "-X perf_jit=0",
         "PYTHON_PERF_JIT_SUPPORT: invalid value; expected an integer "
         "(0 to disable)"},
    };
    *backend = NULL;
    for (size_t i = 0; i < Py_ARRAY_LENGTH(switches); i++) {
        size_t len = wcslen(switches[i].xoption);
        int on = -1;
        for (Py_ssize_t j = 0; j < config->xoptions.length; j++) {
            const wchar_t *opt = config->xoptions.items[j];
            if (wcsncmp(opt, switches[i].xoption, len) != 0
                || (opt[len] != L'\0' && opt[len] != L'='))
            {
                continue;
            }
            if (opt[len] == L'\0' || wcscmp(opt + len + 1, L"1") == 0) {
                on = 1;
            }
            else if (wcscmp(opt + len + 1, L"0") == 0) {
                on = 0;
            }
            else {
                return _PyStatus_ERR(switches[i].xoption_error);
            }
        }
        if (on < 0) {
            const char *value = _Py_GetEnv(config->use_environment,
                                           switches[i].env);
            int number = 0;
            if (value != NULL && _Py_str_to_int(value, &number) != 0) {
                return _PyStatus_ERR(switches[i].env_error);
            }
            on = (number != 0);
        }
        if (on) {
            *backend = switches[i].backend;
        }
    }
    return _PyStatus_OK();
}

PyStatus
_PyPerfTrampoline_InitFromConfig(PyThreadState *tstate)
{
    const PyConfig *config = _PyInterpreterState_GetConfig(tstate->interp);
    const char *backend;
    PyStatus status = _PyPerfTrampoline_ConfigBackend(config, &backend);
    if (_PyStatus_EXCEPTION(status) || backend == NULL) {
        return status;
    }
#ifdef PY_HAVE_PERF_TRAMPOLINE
    startup_lines.active = 1;
#endif
    if (_PyPerfTrampoline_Activate(tstate, backend) == 0) {
        return _PyStatus_OK();
    }
    /* Profiling support must never stop the program: one line, go on. */
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *msg = value != NULL ? PyObject_Str(value) : NULL;
    const char *text = msg != NULL ? PyUnicode_AsUTF8(msg) : NULL;
    PyErr_Clear();
#ifdef PY_HAVE_PERF_TRAMPOLINE
    _PyPerf_Warn("cannot enable the '%s' backend at startup (%s); "
                 "running without it", backend,
                 text != NULL ? text : "unknown error");
#else
    (void)text;
    if (_Py_IsMainInterpreter(tstate->interp)) {
        PySys_FormatStderr("Python: perf trampolines ('%s') are not "
                           "supported by this build; ignored\n", backend);
    }
#endif
    Py_XDECREF(msg);
    Py_XDECREF(type);
    Py_XDECREF(value);
    Py_XDECREF(tb);
    PyErr_Clear();
    return _PyStatus_OK();
}

/* The interpreter finished starting: write what startup made. */
void
_PyPerfTrampoline_StartupDone(void)
{
#ifdef PY_HAVE_PERF_TRAMPOLINE
    startup_lines.active = 0;
    if (perfmap_flush_startup_lines() < 0) {
        report_failure("cannot write the profiler's file; new functions "
                       "are missing from it");
    }
#endif
}
