/*
 * The perf map backend: /tmp/perf-<pid>.map
 * ==========================================
 *
 * perf's oldest interface for code it finds no ELF file for
 * (tools/perf/Documentation/jit-interface.txt): one line per trampoline
 * (and per entry of the C API below),
 *
 *     START SIZE NAME\n
 *
 * START and SIZE in hex without "0x", NAME to the end of the line
 * ("py::<qualname>:<filename>", made by the core).  perf reads the file
 * when it resolves samples, long after the process is gone, so it is never
 * removed.
 *
 * A system call per line would cost more than the rest of a new
 * trampoline, so the core's lines wait in memory and are appended many at
 * a time when the core says (_PyPerf_Flush(): within microseconds while
 * Python code runs, before the program blocks or exits) or when the buffer
 * is full.  Each batch is appended with _PyPerf_FileAppend()
 * (Python/perf_files.c), which undoes a partial write, so the file only
 * ever holds whole lines: a process killed outright loses the lines that
 * waited, never half a line.
 *
 * Two kinds of writers share the file: the core, for trampolines, with the
 * GIL held, and the C API at the end of this file (PyUnstable_*, for JIT
 * compilers), from any thread, with or without the GIL.  One mutex
 * serializes them.  Only a JIT's threads ever compete with the core for
 * it; uncontended, it costs two atomic operations per new trampoline.  No
 * code that takes the GIL runs while it is held.
 *
 * A fork() while another thread holds the mutex would leave it locked
 * forever in the child, and the state half changed, so the mutex is held
 * across every fork() (pthread_atfork): the child starts with it free and
 * the state as it was between two writes.
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <pthread.h>              // pthread_mutex_t, pthread_atfork()
#include <unistd.h>               // getpid()

static struct {
    /* Guards everything below (see the top of this file). */
    pthread_mutex_t lock;
    _PyPerf_File file;
    /* PyUnstable_PerfMapState_Fini() closed the file: the next use opens
       it again (by name, keeping its lines, or anew if it is gone). */
    int closed;
    /* Lines not written yet, in the order they were made (the C API's
       are written at once, after them: see write_lines()). */
    size_t waiting;
    char lines[32 * 1024];
} perfmap = {.lock = PTHREAD_MUTEX_INITIALIZER, .file = {.fd = -1}};

/* ----------------------------------------------------------------------
 * The lock
 */

/* The fork handlers are registered once, before the mutex is first
   taken; 0, or why pthread_atfork() failed. */
static pthread_once_t fork_handlers_once = PTHREAD_ONCE_INIT;
static int fork_handlers_error;

static void
lock_before_fork(void)
{
    pthread_mutex_lock(&perfmap.lock);
}

static void
unlock_after_fork(void)
{
    /* In the child, the one thread there is the one that forked: the
       holder. */
    pthread_mutex_unlock(&perfmap.lock);
}

static void
register_fork_handlers(void)
{
    fork_handlers_error = pthread_atfork(lock_before_fork, unlock_after_fork,
                                         unlock_after_fork);
}

/* Take the map's mutex.  Returns 0, or -1 with errno set if the fork
   handlers cannot be registered (the mutex is then not taken: the map is
   not used). */
static int
lock_map(void)
{
    pthread_once(&fork_handlers_once, register_fork_handlers);
    if (fork_handlers_error != 0) {
        errno = fork_handlers_error;
        return -1;
    }
    pthread_mutex_lock(&perfmap.lock);
    return 0;
}

static void
unlock_map(void)
{
    pthread_mutex_unlock(&perfmap.lock);
}

/* ----------------------------------------------------------------------
 * Lines
 */

/* The longest line: two hex numbers, two spaces, a name, a newline. */
#define MAX_LINE (2 * 2 * sizeof(uintptr_t) + 3 + _PyPerf_MAX_NAME)

/* Append the waiting lines to the file.  Lines that cannot be written are
   dropped: keeping them would only make every later line wait behind
   them. */
static int
write_lines(void)
{
    if (perfmap.waiting == 0) {
        return 0;
    }
    int res = _PyPerf_FileAppend(&perfmap.file, perfmap.lines,
                                 perfmap.waiting);
    perfmap.waiting = 0;
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

/* Bytes that `ch` takes in a map line: ASCII control characters are
   written as \xNN, so that an entry is always one line. */
static size_t
escaped_size(unsigned char ch)
{
    return (ch < 0x20 || ch == 0x7f) ? 4 : 1;
}

/* Append an entry's name, escaped; a name longer than _PyPerf_MAX_NAME
   bytes (escaped) is cut to end in "...".  The core's names pass
   unchanged: it escapes them itself, within that budget.  C API callers'
   names are bytes as given (UTF-8, presumably). */
static size_t
append_name(char *buf, size_t pos, const char *name, size_t name_size)
{
    static const char hex[] = "0123456789abcdef";
    size_t total = 0;
    for (size_t i = 0; i < name_size; i++) {
        total += escaped_size((unsigned char)name[i]);
    }
    int cut = (total > _PyPerf_MAX_NAME);
    size_t end = pos + (cut ? _PyPerf_MAX_NAME - 3 : total);
    for (size_t i = 0; i < name_size; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (pos + escaped_size(ch) > end) {
            break;
        }
        if (escaped_size(ch) == 1) {
            buf[pos++] = (char)ch;
        }
        else {
            buf[pos++] = '\\';
            buf[pos++] = 'x';
            buf[pos++] = hex[ch >> 4];
            buf[pos++] = hex[ch & 0xf];
        }
    }
    if (cut) {
        memcpy(buf + pos, "...", 3);
        pos += 3;
    }
    return pos;
}

/* Add the line "START SIZE NAME\n" to the waiting ones, after writing
   them if it might not fit.  Returns 0, or -1 with errno set if they could
   not be written (the line is added all the same). */
static int
add_line(const void *code, size_t code_size, const char *name,
         size_t name_size)
{
    int res = 0;
    if (perfmap.waiting + MAX_LINE > sizeof(perfmap.lines)) {
        res = write_lines();
    }
    char *line = perfmap.lines + perfmap.waiting;
    size_t n = append_hex(line, 0, (uintptr_t)code);
    line[n++] = ' ';
    n = append_hex(line, n, code_size);
    line[n++] = ' ';
    n = append_name(line, n, name, name_size);
    line[n++] = '\n';
    assert(n <= MAX_LINE);
    perfmap.waiting += n;
    return res;
}

/* Open this process's map, unless it has one (perhaps closed by the
   program: reopened on use).  After PyUnstable_PerfMapState_Fini(), the
   same file is opened again by name, its lines kept; if it is no longer
   there, a new one is started.  `path` receives the file's name only when
   it is opened. */
static int
open_map(char *path, size_t path_size)
{
    if (perfmap.file.path[0] != '\0' && !perfmap.closed) {
        return 0;               /* the common case: no system call */
    }
    PyOS_snprintf(path, path_size, "/tmp/perf-%ld.map", (long)getpid());
    if (perfmap.file.path[0] != '\0') {
        if (!perfmap.closed) {
            return 0;
        }
        perfmap.closed = 0;
        if (_PyPerf_FileReopen(&perfmap.file) == 0) {
            return 0;
        }
        _PyPerf_FileForget(&perfmap.file);
    }
    return _PyPerf_FileOpen(&perfmap.file, path);
}

/* ----------------------------------------------------------------------
 * The backend (the core calls these with the GIL held)
 */

static int
perfmap_init(char *path, size_t path_size)
{
    if (lock_map() < 0) {
        return -1;
    }
    int res = open_map(path, path_size);
    unlock_map();
    return res;
}

/* The line waits: the core calls perfmap_flush() soon. */
static int
perfmap_write_entry(const void *code, size_t code_size,
                    const char *name, size_t name_size)
{
    if (lock_map() < 0) {
        return -1;
    }
    char path[64];
    int res = open_map(path, sizeof(path));
    if (res == 0) {
        res = add_line(code, code_size, name, name_size);
    }
    unlock_map();
    return res;
}

static int
perfmap_flush(void)
{
    if (lock_map() < 0) {
        return -1;
    }
    int res = write_lines();
    unlock_map();
    return res;
}

static int
perfmap_after_fork_child(char *path, size_t path_size, int copy)
{
    if (lock_map() < 0) {
        return -1;
    }
    perfmap.closed = 0;
    _PyPerf_File parent;
    int res = 0;
    if (_PyPerf_FileDetach(&perfmap.file, &parent)) {
        if (copy) {
            res = open_map(path, path_size);
            if (res == 0 && parent.size > 0) {
                res = _PyPerf_CopyLines(&parent, parent.size,
                                        &perfmap.file);
            }
            if (res == 0) {
                /* Lines the parent had not written yet: it will, to its
                   file. */
                res = write_lines();
            }
        }
        else {
            /* inherited trampolines: not ours to name */
            perfmap.waiting = 0;
        }
        _PyPerf_FileForget(&parent);
    }
    unlock_map();
    return res;
}

const _PyPerf_Backend _PyPerf_MapBackend = {
    .init = perfmap_init,
    .write_entry = perfmap_write_entry,
    .after_fork_child = perfmap_after_fork_child,
    .flush = perfmap_flush,
};

/* ----------------------------------------------------------------------
 * The C API (Include/cpython/sysmodule.h, Doc/c-api/perfmaps.rst)
 *
 * For code generators of extensions (JIT compilers): from any thread, with
 * or without the GIL.  Their lines go to the map the trampolines' go to,
 * written at once (with the trampolines' that wait, before them).  The return values are upstream's
 * (3.12): 0; -1 if the file cannot be used, with errno set; -2 if the lock
 * cannot be (here: its fork handlers cannot be registered).
 */

/* Take the lock and open the map.  Returns 0 with the lock held, or -1
   (the file) or -2 (the lock) without it. */
static int
api_begin(void)
{
    if (lock_map() < 0) {
        return -2;
    }
    char path[64];
    if (open_map(path, sizeof(path)) < 0) {
        unlock_map();
        return -1;
    }
    return 0;
}

int
PyUnstable_PerfMapState_Init(void)
{
    int res = api_begin();
    if (res == 0) {
        unlock_map();
    }
    return res;
}

int
PyUnstable_WritePerfMapEntry(const void *code_addr, unsigned int code_size,
                             const char *entry_name)
{
    if (entry_name == NULL) {
        errno = EINVAL;
        return -1;
    }
    int res = api_begin();
    if (res < 0) {
        return res;
    }
    res = add_line(code_addr, code_size, entry_name, strlen(entry_name));
    if (write_lines() < 0) {
        res = -1;
    }
    unlock_map();
    return res;
}

/* Close the map's descriptor.  The file is remembered: the next write
   (the API's or a new trampoline's) opens it again, see open_map(). */
void
PyUnstable_PerfMapState_Fini(void)
{
    int saved = errno;
    if (lock_map() < 0) {
        errno = saved;
        return;
    }
    if (perfmap.file.path[0] != '\0' && !perfmap.closed) {
        (void)write_lines();
        _PyPerf_FileClose(&perfmap.file);
        perfmap.closed = 1;
    }
    unlock_map();
    errno = saved;
}

int
PyUnstable_CopyPerfMapFile(const char *parent_filename)
{
    if (parent_filename == NULL) {
        errno = EINVAL;
        return -1;
    }
    int res = api_begin();
    if (res < 0) {
        return res;
    }
    /* After the lines made before this call. */
    res = write_lines();
    if (res == 0) {
        res = _PyPerf_AppendLinesOf(parent_filename, &perfmap.file);
    }
    unlock_map();
    return res;
}

#else   /* !PY_HAVE_PERF_TRAMPOLINE */

/* No profiler files in this build: the C API exists, and succeeds without
   doing anything, as upstream's does where perf maps are not supported. */

int
PyUnstable_PerfMapState_Init(void)
{
    return 0;
}

int
PyUnstable_WritePerfMapEntry(const void *code_addr, unsigned int code_size,
                             const char *entry_name)
{
    return 0;
}

void
PyUnstable_PerfMapState_Fini(void)
{
}

int
PyUnstable_CopyPerfMapFile(const char *parent_filename)
{
    return 0;
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
