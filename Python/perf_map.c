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
 * How.  The file is plain text that only grows: every line goes in with
 * one write() on a descriptor opened O_APPEND, before its trampoline first
 * runs.  Then the line is in the kernel's page cache, where every reader
 * sees it and where it stays if the process is killed, aborts or crashes
 * right after making the function.  Each write moves the file's size and
 * mtime, which is how live readers (perf top, continuous profilers) learn
 * that there is more to read.  A reader sees a line's newline only once
 * every byte before it is there: a line that ends in a newline is whole.
 *
 * The file has a predictable name in a shared directory, so others can
 * open it: a profiler that rewrites it, a process with our pid number in
 * another pid namespace sharing /tmp (every container has a pid 1), a
 * program that opens its own map.  Nothing they do to it stops us:
 *
 *     truncated          the next line goes at its new end (O_APPEND)
 *     deleted, replaced  lines go on into the file we have open, which
 *                        readers no longer find by name
 *     lines appended     ours follow theirs
 *
 * and wherever the file ends inside a line (someone else's, unfinished,
 * or one cut short), ours start after a newline: every write looks
 * (_PyPerf_FileAppendLines()).
 *
 * It is never mapped (a store into a mapping of a file that someone cut
 * short is a SIGBUS), never cut back and never holds a NUL byte.
 *
 * Several lines that exist before any of them is used go in one write: a
 * module's or class's line with those of what it defines (the core's
 * batches, at most LINES_SIZE bytes each), a forked child's copy of its
 * parent's lines, PyUnstable_CopyPerfMapFile().
 *
 * An exec'd image keeps the file (the process start time survives exec,
 * see perf_files.c) and appends after what the image before wrote.
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
 * the state as it was between two writes.  The child writes to a file of
 * its own (perfmap_after_fork_child(), or on its first write if the fork
 * did not go through PyOS_AfterFork_Child()).
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <pthread.h>              // pthread_mutex_t, pthread_atfork()
#include <unistd.h>               // getpid(), lseek()

/* ----------------------------------------------------------------------
 * Constants and state
 */

/* The longest line of a name of `escaped` bytes: two hex numbers, two
   spaces, the name, a newline. */
#define LINE_SIZE(escaped) (2 * 2 * sizeof(uintptr_t) + 3 + (escaped))

/* Lines are made in a buffer of this many bytes, several at a time; it
   holds at least one line of a name of _PyPerf_MAX_NAME bytes.  The C
   API's longer names are written whole, from a buffer of their own. */
#define LINES_SIZE (4 * LINE_SIZE(_PyPerf_MAX_NAME))

static struct {
    /* Guards everything below (see the top of this file). */
    pthread_mutex_t lock;
    /* file.size: in a forked child, where the parent's lines ended at
       the fork (set by lock_before_fork()). */
    _PyPerf_File file;
    /* PyUnstable_PerfMapState_Fini() closed the file: the next use opens
       it again (by name, keeping its lines, or anew if it is gone). */
    int closed;
    /* Set in a forked child: `file` is the parent's until the child has
       its own. */
    int inherited;
    /* What goes in before the next line (see finish_line()): the end of
       one of ours that a failed write cut short. */
    char *rest;
    size_t rest_size;
    /* Lines are made here (not on the C stack, which may be deep). */
    char lines[LINES_SIZE];
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
    /* What the child copies: the lines up to the end of our last write
       (the parent goes on writing after the fork). */
    _PyPerf_FileMarkEnd(&perfmap.file);
}

static void
unlock_after_fork_parent(void)
{
    pthread_mutex_unlock(&perfmap.lock);
}

static void
unlock_after_fork_child(void)
{
    perfmap.inherited = (perfmap.file.path[0] != '\0');
    /* The one thread there is the one that forked: the holder. */
    pthread_mutex_unlock(&perfmap.lock);
}

static void
register_fork_handlers(void)
{
    fork_handlers_error = pthread_atfork(lock_before_fork,
                                         unlock_after_fork_parent,
                                         unlock_after_fork_child);
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
 * The file
 */

/* Forget what finish_line() would have written (the file is let go). */
static void
drop_rest(void)
{
    PyMem_RawFree(perfmap.rest);
    perfmap.rest = NULL;
    perfmap.rest_size = 0;
}

/* Before anything else goes in, end our line that a failed write (a full
   disk, a file size limit) cut short, which is never cut back (others may
   have written after it).  Returns 0, or -1 with errno set (what is still
   to write is kept). */
static int
finish_line(void)
{
    if (perfmap.rest == NULL) {
        return 0;
    }
    size_t size = perfmap.rest_size;
    size_t written;
    int res = _PyPerf_FileAppend(&perfmap.file, perfmap.rest, size,
                                 &written);
    if (written == size) {
        drop_rest();
    }
    else if (written > 0) {
        memmove(perfmap.rest, perfmap.rest + written, size - written);
        perfmap.rest_size -= written;
    }
    return res;
}

/* Append `size` bytes of whole lines in one write. */
static int
append(const char *lines, size_t size)
{
    assert(size >= 2 && lines[size - 1] == '\n');
    if (finish_line() < 0) {
        return -1;
    }
    size_t written;
    if (_PyPerf_FileAppendLines(&perfmap.file, lines, size, &written) < 0) {
        if (written > 0) {
            /* Kept for finish_line(); without memory for it, the next
               line at least starts on a line of its own. */
            perfmap.rest = PyMem_RawMalloc(size - written);
            if (perfmap.rest != NULL) {
                memcpy(perfmap.rest, lines + written, size - written);
                perfmap.rest_size = size - written;
            }
        }
        return -1;
    }
    return 0;
}

/* Append the well-formed lines among `size` bytes of whole lines (another
   process's map), all in one write.  Empty lines and lines that hold a
   NUL are left out: no reader can use them.  `lines` is the caller's
   buffer: the lines kept are moved together in it. */
static int
append_lines(char *lines, size_t size, void *Py_UNUSED(arg))
{
    size_t kept = 0;
    for (size_t pos = 0; pos < size;) {
        char *nl = memchr(lines + pos, '\n', size - pos);
        assert(nl != NULL);
        size_t n = (size_t)(nl - (lines + pos)) + 1;
        if (n > 1 && memchr(lines + pos, '\0', n) == NULL) {
            memmove(lines + kept, lines + pos, n);
            kept += n;
        }
        pos += n;
    }
    return kept > 0 ? append(lines, kept) : 0;
}

/* Let go of the file: the parent's (a child), or one opened again by
   name. */
static void
forget_file(void)
{
    _PyPerf_FileForget(&perfmap.file);
    drop_rest();
    perfmap.inherited = 0;
}

/* Open this process's map, unless it has one (perhaps closed by the
   program: reopened on use).  After PyUnstable_PerfMapState_Fini(), the
   same file is opened again by name, its lines kept; if it is no longer
   there, a new one is started.  `path` receives the file's name only when
   it is opened. */
static int
open_map(char *path, size_t path_size)
{
    if (perfmap.file.path[0] != '\0' && !perfmap.closed
        && !perfmap.inherited)
    {
        return 0;               /* the common case: no system call */
    }
    if (perfmap.inherited) {
        /* A child whose fork did not go through PyOS_AfterFork_Child():
           a file of its own, without the inherited trampolines' lines. */
        forget_file();
    }
    PyOS_snprintf(path, path_size, "/tmp/perf-%ld.map", (long)getpid());
    if (perfmap.file.path[0] != '\0') {
        perfmap.closed = 0;
        if (_PyPerf_FileReopen(&perfmap.file) == 0) {
            return 0;
        }
        forget_file();
    }
    /* Keeping what this process wrote before an exec. */
    return _PyPerf_FileOpen(&perfmap.file, path, _PyPerf_FILE_KEEP);
}

/* ----------------------------------------------------------------------
 * Lines
 */

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

/* Append an entry's name, `escaped` bytes once escaped.  The core's names
   pass unchanged: it escapes them itself.  C API callers' names are bytes
   as given (UTF-8, presumably). */
static size_t
append_name(char *buf, size_t pos, const char *name, size_t name_size,
            size_t escaped)
{
    static const char hex[] = "0123456789abcdef";
    if (escaped == name_size) {
        memcpy(buf + pos, name, name_size);
        return pos + name_size;
    }
    for (size_t i = 0; i < name_size; i++) {
        unsigned char ch = (unsigned char)name[i];
        if (!_PyPerf_IsControl(ch)) {
            buf[pos++] = (char)ch;
        }
        else {
            buf[pos++] = '\\';
            buf[pos++] = 'x';
            buf[pos++] = hex[ch >> 4];
            buf[pos++] = hex[ch & 0xf];
        }
    }
    return pos;
}

/* Make the line "START SIZE NAME\n" at buf + pos, of a name of `escaped`
   bytes once escaped; return the position after it. */
static size_t
make_line(char *buf, size_t pos, const void *code, size_t code_size,
          const char *name, size_t name_size, size_t escaped)
{
    pos = append_hex(buf, pos, (uintptr_t)code);
    buf[pos++] = ' ';
    pos = append_hex(buf, pos, code_size);
    buf[pos++] = ' ';
    pos = append_name(buf, pos, name, name_size, escaped);
    buf[pos++] = '\n';
    return pos;
}

static size_t
escaped_size(const char *name, size_t name_size)
{
    return name_size + 3 * _PyPerf_CountControls(
        (const unsigned char *)name, name_size);
}

/* Append the line "START SIZE NAME\n" to the file.  A name is written
   whole, however long (a C API caller's may be): the line is made in a
   buffer of its own if it does not fit the usual one. */
static int
add_line(const void *code, size_t code_size, const char *name,
         size_t name_size)
{
    size_t escaped = escaped_size(name, name_size);
    size_t max = LINE_SIZE(escaped);
    char *line = perfmap.lines;
    if (max > sizeof(perfmap.lines)) {
        line = PyMem_RawMalloc(max);
        if (line == NULL) {
            errno = ENOMEM;
            return -1;
        }
    }
    size_t n = make_line(line, 0, code, code_size, name, name_size, escaped);
    assert(n <= max);
    int res = append(line, n);
    if (line != perfmap.lines) {
        int saved = errno;
        PyMem_RawFree(line);
        errno = saved;
    }
    return res;
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

/* The core's entries: as many lines in one write as the buffer holds
   (its names are at most _PyPerf_MAX_NAME bytes). */
static int
perfmap_write_entries(const _PyPerf_Entry *entries, size_t count,
                      size_t code_size)
{
    if (lock_map() < 0) {
        return -1;
    }
    char path[64];
    int res = open_map(path, sizeof(path));
    size_t pos = 0;
    for (size_t i = 0; i < count && res == 0; i++) {
        const _PyPerf_Entry *e = &entries[i];
        size_t escaped = escaped_size(e->name, e->name_size);
        assert(LINE_SIZE(escaped) <= sizeof(perfmap.lines));
        if (sizeof(perfmap.lines) - pos < LINE_SIZE(escaped)) {
            res = append(perfmap.lines, pos);
            pos = 0;
        }
        pos = make_line(perfmap.lines, pos, e->code, code_size, e->name,
                        e->name_size, escaped);
    }
    if (res == 0 && pos > 0) {
        res = append(perfmap.lines, pos);
    }
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
    perfmap.inherited = 0;
    _PyPerf_File parent;
    int res = 0;
    if (_PyPerf_FileDetach(&perfmap.file, &parent)) {
        drop_rest();            /* the parent's file's */
        if (copy) {
            res = open_map(path, path_size);
            if (res == 0 && parent.size > 0) {
                res = _PyPerf_ReadLines(&parent, parent.size, append_lines,
                                        NULL);
            }
        }
        _PyPerf_FileForget(&parent);
    }
    unlock_map();
    return res;
}

const _PyPerf_Backend _PyPerf_MapBackend = {
    .init = perfmap_init,
    .write_entries = perfmap_write_entries,
    .define_nested = 1,
    .after_fork_child = perfmap_after_fork_child,
};

/* ----------------------------------------------------------------------
 * The C API (Include/cpython/sysmodule.h, Doc/c-api/perfmaps.rst)
 *
 * For code generators of extensions (JIT compilers): from any thread, with
 * or without the GIL.  Their lines go to the map the trampolines' go to,
 * written at once.  The return values are upstream's
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
    res = _PyPerf_ReadLinesOf(parent_filename, &perfmap.file, append_lines,
                              NULL);
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
