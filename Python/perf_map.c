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
 * When.  A line is in the file, that is in the kernel's page cache where
 * every reader sees it, before its trampoline first runs: a process that
 * is killed, aborts or crashes right after making a function loses none of
 * its names.  A system call per line would cost more than the rest of a
 * new trampoline, so the file is mapped shared and lines are copied into
 * the mapping:
 *
 *     file:  | line | line | line |\0\0\0\0\0\0\0\0\0\0\0\0|
 *            0                    ^ size        allocated ^
 *                                 next line goes here
 *
 * The file is grown GROW_SIZE bytes at a time with pwrite() of zeros:
 * writing the bytes (rather than ftruncate()) allocates the disk blocks
 * then, so a full disk is an error from pwrite(), not a SIGBUS in a later
 * store to the mapping.  The NULs after the last line hold no newline:
 * to a reader they are the start of one more line, which begins with a
 * NUL and names nothing.  A clean exit cuts them off.
 *
 * No torn lines.  A reader may copy the file at any moment (perf top,
 * continuous profilers), and a copy of many pages is not made at one
 * instant: it may hold the start of a line from before the line was
 * written and its end from after.  So a line is stored with its first
 * byte last: its other bytes, newline included, then the first hex digit
 * with a release store.  Until then the part of it a reader sees belongs
 * to a line that starts with a NUL, since no newline stands between the
 * last whole line and it.  (That holds for a reader on another CPU as far
 * as the CPU orders its loads: x86 does; arm64 may, in principle, load a
 * line's later bytes before its first within one copy.)  (A process killed during those few stores
 * leaves such a line behind: an exec'd image overwrites it.)
 *
 * Where mapping a file is not safe (a filesystem that may need new blocks
 * to overwrite old ones, such as btrfs, or one over the network), each
 * line is written with one pwrite() instead: still in the file before it
 * is used, at the cost of a system call.
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
 * the state as it was between two writes.  The mapping is not inherited
 * (MADV_DONTFORK): the child writes to a file of its own
 * (perfmap_after_fork_child(), or on its first write if the fork did not
 * go through PyOS_AfterFork_Child()).
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <linux/magic.h>          // TMPFS_MAGIC, ...
#include <pthread.h>              // pthread_mutex_t, pthread_atfork()
#include <sys/mman.h>             // mmap(), madvise()
#include <sys/uio.h>              // pwritev()
#include <sys/vfs.h>              // fstatfs()
#include <unistd.h>               // getpid(), sysconf()

/* ----------------------------------------------------------------------
 * Constants and state
 */

/* Bytes the file grows by: one pwrite() per a few hundred lines. */
#define GROW_SIZE (16 * 1024)
/* Bytes of the file mapped at a time (a new window is mapped when a line
   would not fit): address space, not memory. */
#define WINDOW_SIZE (1024 * 1024)

/* The longest line: two hex numbers, two spaces, a name, a newline. */
#define MAX_LINE (2 * 2 * sizeof(uintptr_t) + 3 + _PyPerf_MAX_NAME)

static struct {
    /* Guards everything below (see the top of this file). */
    pthread_mutex_t lock;
    /* file.size: the end of the last whole line. */
    _PyPerf_File file;
    /* PyUnstable_PerfMapState_Fini() closed the file: the next use opens
       it again (by name, keeping its lines, or anew if it is gone). */
    int closed;
    /* Set in a forked child: `file` is the parent's until the child has
       its own. */
    int inherited;
    /* The file can be mapped (its filesystem is known to overwrite in
       place); otherwise every line is written with pwrite(). */
    int mappable;
    /* Bytes of the file: [file.size, allocated) holds NULs only. */
    off_t allocated;
    /* WINDOW_SIZE bytes of the file from window_offset, or NULL. */
    char *window;
    off_t window_offset;
    /* A line is made here (not on the C stack, which may be deep). */
    char line[MAX_LINE];
} perfmap = {.lock = PTHREAD_MUTEX_INITIALIZER, .file = {.fd = -1}};

/* A page of the file's fill. */
static const char zeros[4096];

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
unlock_after_fork_parent(void)
{
    pthread_mutex_unlock(&perfmap.lock);
}

static void
unlock_after_fork_child(void)
{
    /* The mapping is not in the child (MADV_DONTFORK), and the file is
       the parent's. */
    perfmap.window = NULL;
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
 * The file and its mapping
 */

/* Filesystems that overwrite a file's existing blocks in place, so that a
   store to a mapping of them needs no new space.  (overlayfs: the file is
   on its upper filesystem, which is one of these where containers run.) */
static int
maps_in_place(int fd)
{
    struct statfs sfs;
    if (fstatfs(fd, &sfs) < 0) {
        return 0;
    }
    switch ((unsigned long)sfs.f_type) {
    case TMPFS_MAGIC:
    case EXT4_SUPER_MAGIC:      /* also ext2 and ext3 */
    case XFS_SUPER_MAGIC:
    case OVERLAYFS_SUPER_MAGIC:
        return 1;
    default:
        return 0;
    }
}

static void
unmap_window(void)
{
    if (perfmap.window != NULL) {
        (void)munmap(perfmap.window, WINDOW_SIZE);
        perfmap.window = NULL;
    }
}

/* Write NULs over [start, end) of the file. */
static int
fill_zeros(off_t start, off_t end)
{
    while (start < end) {
        struct iovec iov[GROW_SIZE / sizeof(zeros)];
        int count = 0;
        off_t n = 0;
        while (count < (int)Py_ARRAY_LENGTH(iov) && start + n < end) {
            size_t part = (size_t)Py_MIN((off_t)sizeof(zeros),
                                         end - start - n);
            iov[count].iov_base = (void *)zeros;
            iov[count].iov_len = part;
            count++;
            n += (off_t)part;
        }
        ssize_t done = pwritev(perfmap.file.fd, iov, count, start);
        if (done < 0 && errno == EINTR) {
            continue;
        }
        if (done <= 0) {
            if (done == 0) {
                errno = ENOSPC;
            }
            return -1;
        }
        start += done;
    }
    return 0;
}

/* Make [file.size, end) of the file writable through the window. */
static int
reserve(off_t end)
{
    if (end > perfmap.allocated) {
        off_t grown = _Py_SIZE_ROUND_UP(end, GROW_SIZE);
        if (_PyPerf_FileReopen(&perfmap.file) < 0
            || fill_zeros(perfmap.allocated, grown) < 0)
        {
            return -1;
        }
        perfmap.allocated = grown;
    }
    if (perfmap.window == NULL
        || end > perfmap.window_offset + WINDOW_SIZE)
    {
        unmap_window();
        long page = sysconf(_SC_PAGESIZE);
        off_t offset = perfmap.file.size & ~(off_t)(page > 0 ? page - 1
                                                             : 4095);
        if (end - offset > WINDOW_SIZE
            || _PyPerf_FileReopen(&perfmap.file) < 0)
        {
            return -1;
        }
        void *mem = mmap(NULL, WINDOW_SIZE, PROT_READ | PROT_WRITE,
                         MAP_SHARED, perfmap.file.fd, offset);
        if (mem == MAP_FAILED) {
            return -1;
        }
        (void)madvise(mem, WINDOW_SIZE, MADV_DONTFORK);
        perfmap.window = mem;
        perfmap.window_offset = offset;
    }
    return 0;
}

/* Cut the fill off the end of the file, and the window with it: no
   mapping may reach past the new end.  errno is kept on success. */
static int
cut_fill(void)
{
    unmap_window();
    if (perfmap.allocated > perfmap.file.size) {
        int saved = errno;
        if (_PyPerf_FileReopen(&perfmap.file) < 0
            || ftruncate(perfmap.file.fd, perfmap.file.size) < 0)
        {
            return -1;
        }
        perfmap.allocated = perfmap.file.size;
        errno = saved;
    }
    return 0;
}

/* Append the line of `size` bytes at `line` (ending with a newline) to
   the file (see the top of this file). */
static int
put_line(const char *line, size_t size)
{
    assert(size >= 2 && line[size - 1] == '\n');
    if (!perfmap.mappable) {
        return _PyPerf_FileAppend(&perfmap.file, line, size);
    }
    off_t end = perfmap.file.size + (off_t)size;
    if (reserve(end) < 0) {
        if (errno != ENOMEM || cut_fill() < 0) {
            return -1;
        }
        /* No address space for a window (RLIMIT_AS): a system call a
           line from now on, after the whole lines, never into the fill,
           where a reader could see a line being written. */
        perfmap.mappable = 0;
        return _PyPerf_FileAppend(&perfmap.file, line, size);
    }
    char *to = perfmap.window + (perfmap.file.size - perfmap.window_offset);
    assert(to[0] == '\0');
    memcpy(to + 1, line + 1, size - 1);
    __atomic_store_n(&to[0], line[0], __ATOMIC_RELEASE);
    perfmap.file.size = end;
    return 0;
}

static int
put_lines(const char *lines, size_t size, void *Py_UNUSED(arg))
{
    while (size > 0) {
        const char *nl = memchr(lines, '\n', size);
        assert(nl != NULL);
        size_t n = (size_t)(nl - lines) + 1;
        /* Not copied: a line being written, a mapped file's fill, and a
           line longer than any we write (another program's file): an
           exec'd image looks for the last line within that bound. */
        if (n > 1 && n <= MAX_LINE && lines[0] != '\0'
            && put_line(lines, n) < 0)
        {
            return -1;
        }
        lines += n;
        size -= n;
    }
    return 0;
}

/* Find the end of the whole lines in a file this process wrote before an
   exec, using `buf` (GROW_SIZE + MAX_LINE bytes): file.size is the file's
   size on entry.  The fill after them is NULs; a last line that still
   starts with NUL, or has no newline, was being written when the image
   before went: it becomes fill. */
static int
find_end(char *buf)
{
    off_t size = perfmap.file.size;
    off_t end = size;           /* [0, end) holds no trailing NUL */
    for (;;) {
        off_t start = Py_MAX(end - (off_t)GROW_SIZE, 0);
        if (start == end) {
            break;
        }
        ssize_t n = pread(perfmap.file.fd, buf, (size_t)(end - start),
                          start);
        if (n != end - start) {
            if (n >= 0) {
                errno = EIO;
            }
            return -1;
        }
        while (n > 0 && buf[n - 1] == '\0') {
            n--;
        }
        end = start + n;
        if (n > 0) {
            break;
        }
    }
    perfmap.allocated = size;
    perfmap.file.size = 0;
    if (end == 0) {
        return 0;
    }
    /* The last whole line ends at the last newline before `end`, and
       starts after the newline before that one. */
    off_t from = Py_MAX(end - (off_t)(2 * MAX_LINE), 0);
    ssize_t n = pread(perfmap.file.fd, buf, (size_t)(end - from), from);
    if (n != end - from) {
        if (n >= 0) {
            errno = EIO;
        }
        return -1;
    }
    off_t whole = from;         /* the end of the whole lines */
    char *nl = memrchr(buf, '\n', (size_t)n);
    if (nl != NULL) {
        char *prev = memrchr(buf, '\n', (size_t)(nl - buf));
        char *line = prev == NULL ? buf : prev + 1;
        whole = from + (line - buf);
        if (line[0] != '\0' && (prev != NULL || from == 0)) {
            whole = from + (nl - buf) + 1;
        }
    }
    perfmap.file.size = whole;
    return fill_zeros(whole, end);
}

static int
adopt_lines(void)
{
    /* Not on the C stack: this can run in a deep one. */
    char *buf = PyMem_RawMalloc(GROW_SIZE + MAX_LINE);
    if (buf == NULL) {
        errno = ENOMEM;
        return -1;
    }
    int res = find_end(buf);
    int saved = errno;
    PyMem_RawFree(buf);
    errno = saved;
    return res;
}

/* Open `path`, keeping what this process wrote before an exec. */
static int
start_file(const char *path)
{
    if (_PyPerf_FileOpen(&perfmap.file, path,
                         _PyPerf_FILE_KEEP | _PyPerf_FILE_MAPPABLE) < 0)
    {
        return -1;
    }
    perfmap.mappable = maps_in_place(perfmap.file.fd);
    perfmap.allocated = perfmap.file.size;
    if (perfmap.file.size > 0 && adopt_lines() < 0) {
        _PyPerf_FileForget(&perfmap.file);
        return -1;
    }
    return 0;
}

/* Let go of the file without cutting its fill: the parent's (a child), or
   one opened again by name. */
static void
forget_file(void)
{
    unmap_window();
    _PyPerf_FileForget(&perfmap.file);
    perfmap.allocated = 0;
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
    return start_file(path);
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

/* Bytes that `ch` takes in a map line. */
static size_t
escaped_size(unsigned char ch)
{
    return _PyPerf_IsControl(ch) ? 4 : 1;
}

/* Append an entry's name, escaped; a name longer than _PyPerf_MAX_NAME
   bytes (escaped) is cut to end in "...".  The core's names pass
   unchanged: it escapes them itself, within that budget.  C API callers'
   names are bytes as given (UTF-8, presumably). */
static size_t
append_name(char *buf, size_t pos, const char *name, size_t name_size)
{
    static const char hex[] = "0123456789abcdef";
    size_t total = name_size + 3 * _PyPerf_CountControls(
        (const unsigned char *)name, name_size);
    if (total == name_size && total <= _PyPerf_MAX_NAME) {
        memcpy(buf + pos, name, name_size);
        return pos + name_size;
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

/* Append the line "START SIZE NAME\n" to the file. */
static int
add_line(const void *code, size_t code_size, const char *name,
         size_t name_size)
{
    char *line = perfmap.line;
    size_t n = append_hex(line, 0, (uintptr_t)code);
    line[n++] = ' ';
    n = append_hex(line, n, code_size);
    line[n++] = ' ';
    n = append_name(line, n, name, name_size);
    line[n++] = '\n';
    assert(n <= MAX_LINE);
    return put_line(line, n);
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
        perfmap.allocated = 0;
        if (copy) {
            res = open_map(path, path_size);
            if (res == 0 && parent.size > 0) {
                res = _PyPerf_ReadLines(&parent, parent.size, put_lines,
                                        NULL);
            }
        }
        _PyPerf_FileForget(&parent);
    }
    unlock_map();
    return res;
}

/* At exit: cut the fill off, so that a file left by a clean exit holds
   only its lines. */
static void
perfmap_fini(void)
{
    if (lock_map() < 0) {
        return;
    }
    int saved = errno;
    if (perfmap.file.path[0] != '\0' && !perfmap.inherited) {
        (void)cut_fill();
    }
    errno = saved;
    unlock_map();
}

const _PyPerf_Backend _PyPerf_MapBackend = {
    .init = perfmap_init,
    .write_entry = perfmap_write_entry,
    .after_fork_child = perfmap_after_fork_child,
    .fini = perfmap_fini,
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
    res = _PyPerf_ReadLinesOf(parent_filename, &perfmap.file, put_lines,
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
