/*
 * Profiler files in /tmp, for the perf trampoline backends
 * ========================================================
 *
 * perf reads /tmp/perf-<pid>.map and /tmp/jit-<pid>.dump by name, after
 * the process has gone (perf report reads the map, perf inject the dump).
 * A file under a predictable name in a shared directory,
 * written from inside a process that may do anything with its
 * descriptors, needs care:
 *
 * - It is opened without following a symlink, without blocking on a FIFO,
 *   and kept only if it is a plain file of ours with no other link; it is
 *   made private (0600).  A file left by a dead process that had our pid
 *   is emptied.
 * - Its descriptor is close-on-exec and never 0, 1 or 2: a program that
 *   closed the standard descriptors expects its next open() to return
 *   them, and whatever it then writes to stdout must not land in a map.
 * - A program may close descriptors it did not open (a daemon closing them
 *   all) and get the same number back from its next open().  Writing
 *   through the old number would put our records into its file, so every
 *   use checks that the descriptor still refers to our file (device and
 *   inode), and reopens our file by name if the program closed it.
 * - A write cut short (a full disk) is undone, so the file only ever holds
 *   whole records: only this process writes to it.
 *
 * Callers serialize the uses of each file: the GIL, and for the perf map
 * also its own lock (Python/perf_map.c), which C API callers without the
 * GIL take.
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <fcntl.h>                // open()
#include <stdarg.h>
#include <sys/stat.h>             // fstat()
#include <unistd.h>               // write(), pread()

/* Open flags of every profiler file: see the top of this file. */
#define FILE_FLAGS (O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)

static int
write_all(int fd, const void *buf, size_t size)
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
    (void)write_all(STDERR_FILENO, line, n);
}

void
_PyPerf_CloseKeepErrno(int fd)
{
    int saved = errno;
    close(fd);
    errno = saved;
}

/* open() whose result is never a standard descriptor (0, 1, 2). */
static int
open_above_stdio(const char *path, int flags, mode_t mode)
{
    int fd = open(path, flags, mode);
    if (fd < 0 || fd > STDERR_FILENO) {
        return fd;
    }
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
    _PyPerf_CloseKeepErrno(fd);
    return moved;
}

int
_PyPerf_FileOpen(_PyPerf_File *file, const char *path)
{
    int fd = open_above_stdio(path, O_WRONLY | O_CREAT | O_APPEND
                                    | FILE_FLAGS, 0600);
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

error:
    _PyPerf_CloseKeepErrno(fd);
    return -1;
}

static int
is_our_file(int fd, const _PyPerf_File *file)
{
    struct stat st;
    return (fstat(fd, &st) == 0 && st.st_dev == file->dev
            && st.st_ino == file->ino);
}

/* Open `path` with `flags`, keeping the descriptor only if it is our file
   (the program may have put another file under the name). */
static int
open_ours(const char *path, int flags, const _PyPerf_File *file)
{
    int fd = open_above_stdio(path, flags, 0);
    if (fd >= 0 && !is_our_file(fd, file)) {
        close(fd);
        errno = ESTALE;
        return -1;
    }
    return fd;
}

/* Make sure file->fd refers to our file.  Returns 0, or -1 with errno set
   (file->fd is then -1). */
static int
check_file(_PyPerf_File *file)
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
    int fd = open_ours(file->path, O_WRONLY | O_APPEND | FILE_FLAGS, file);
    if (fd < 0) {
        return -1;
    }
    file->fd = fd;
    return 0;
}

int
_PyPerf_FileAppend(_PyPerf_File *file, const void *buf, size_t size)
{
    if (check_file(file) < 0) {
        return -1;
    }
    if (write_all(file->fd, buf, size) < 0) {
        int saved = errno;
        /* Undo the partial write (see the top).  Should that fail too,
           the write's error is still the one to report.  (The result is
           tested, not cast to void: glibc's warn_unused_result, on with
           _FORTIFY_SOURCE as Debian builds, ignores such casts.) */
        if (ftruncate(file->fd, file->size) < 0) {
            /* nothing more to undo with */
        }
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
        fd = open_ours(fdpath, O_RDONLY | O_CLOEXEC, file);
    }
    if (fd < 0 && file->path[0] != '\0') {
        fd = open_ours(file->path, O_RDONLY | FILE_FLAGS, file);
    }
    return fd;
}

/* In a forked child: move the file inherited from the parent to *parent
   and leave *file closed, so that nothing is ever written to the parent's
   file again.  Returns 0 if the parent had no file. */
int
_PyPerf_FileDetach(_PyPerf_File *file, _PyPerf_File *parent)
{
    *parent = *file;
    *file = (_PyPerf_File){.fd = -1};
    return parent->path[0] != '\0';
}

/* Let go of the file (in a forked child: it is the parent's), closing the
   descriptor only if it is still ours.  errno is kept. */
void
_PyPerf_FileForget(_PyPerf_File *file)
{
    if (file->fd >= 0 && is_our_file(file->fd, file)) {
        _PyPerf_CloseKeepErrno(file->fd);
    }
    file->fd = -1;
    file->size = 0;
    file->path[0] = '\0';
}

/* Bytes read at a time when lines are copied: a line longer than this
   cannot be copied.  (Ours are at most about 3.3 KiB.) */
#define LINES_BUFFER_SIZE (64 * 1024)

/* Append the whole lines among the first `size` bytes of `in` to `to`,
   each write() ending with a newline, so that a write cut short leaves
   whole lines behind (_PyPerf_FileAppend undoes it).  Bytes after the last
   newline are not a whole line: they are left out.  Returns 0, or -1 with
   errno set (EINVAL: a line longer than LINES_BUFFER_SIZE). */
static int
append_lines(int in, off_t size, _PyPerf_File *to)
{
    char *buf = PyMem_RawMalloc(LINES_BUFFER_SIZE);
    if (buf == NULL) {
        errno = ENOMEM;
        return -1;
    }
    int res = 0;
    size_t held = 0;            /* bytes of an unfinished line in buf */
    off_t done = 0;
    while (done < size) {
        size_t want = (size_t)Py_MIN((off_t)(LINES_BUFFER_SIZE - held),
                                     size - done);
        ssize_t n = pread(in, buf + held, want, done);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            /* 0: the file is shorter than it was; what was read counts. */
            res = n < 0 ? -1 : 0;
            break;
        }
        done += n;
        held += (size_t)n;
        char *last = memrchr(buf, '\n', held);
        if (last == NULL) {
            if (held == LINES_BUFFER_SIZE) {
                errno = EINVAL;
                res = -1;
                break;
            }
            continue;
        }
        size_t whole = (size_t)(last - buf) + 1;
        if (_PyPerf_FileAppend(to, buf, whole) < 0) {
            res = -1;
            break;
        }
        held -= whole;
        memmove(buf, buf + whole, held);
    }
    int saved = errno;
    PyMem_RawFree(buf);
    errno = saved;
    return res;
}

/* Append the first `size` bytes of `from`, whole lines, to `to`. */
int
_PyPerf_CopyLines(const _PyPerf_File *from, off_t size, _PyPerf_File *to)
{
    int in = _PyPerf_FileOpenReadOnly(from);
    if (in < 0) {
        return -1;
    }
    int res = append_lines(in, size, to);
    _PyPerf_CloseKeepErrno(in);
    return res;
}

/* Append the whole lines of the file at `path`, as it is now, to `to`.
   It must be a regular file, and not `to` itself.  Returns 0, or -1 with
   errno set (EISDIR: a directory; EINVAL: another kind of file, or `to`). */
int
_PyPerf_AppendLinesOf(const char *path, _PyPerf_File *to)
{
    /* O_NONBLOCK: a FIFO under the name must not block us. */
    int in = open_above_stdio(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK, 0);
    if (in < 0) {
        return -1;
    }
    int res = -1;
    struct stat st;
    if (fstat(in, &st) < 0) {
        goto done;
    }
    if (S_ISDIR(st.st_mode)) {
        errno = EISDIR;
        goto done;
    }
    if (!S_ISREG(st.st_mode)
        || (to->path[0] != '\0' && st.st_dev == to->dev
            && st.st_ino == to->ino))
    {
        errno = EINVAL;
        goto done;
    }
    res = append_lines(in, st.st_size, to);

done:
    _PyPerf_CloseKeepErrno(in);
    return res;
}

/* Close the descriptor (if it is still ours) but remember the file:
   _PyPerf_FileAppend and _PyPerf_FileReopen find it again by name. */
void
_PyPerf_FileClose(_PyPerf_File *file)
{
    if (file->fd >= 0 && is_our_file(file->fd, file)) {
        _PyPerf_CloseKeepErrno(file->fd);
    }
    file->fd = -1;
}

/* Make file->fd refer to our file again, reopening it by name if needed.
   Returns 0, or -1 with errno set (the name no longer leads to it). */
int
_PyPerf_FileReopen(_PyPerf_File *file)
{
    return check_file(file);
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
