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
 *   made private (0600).
 * - A file under our name that this process wrote before an exec (the
 *   process start time survives exec) is kept, and appended to: the names
 *   the image before the exec wrote are still needed.  A file older than
 *   the process was left by a dead one that had our pid: it is replaced,
 *   by unlinking it and creating a new one, never by truncating it,
 *   because a live process in another pid namespace sharing /tmp may
 *   still be writing it.  Such a process is told apart by the lock
 *   (flock) that writers hold on their file until exit or exec.  A lock
 *   belongs to an open file description, which a child forked without
 *   PyOS_AfterFork_Child() (C's fork(), daemon()) keeps open across our
 *   exec: so a held lock is another process's claim only if the kernel
 *   says (/proc/locks) that a process other than this one took it.  This
 *   image then takes the lock at a later write, once the child has let it
 *   go.
 * - Its descriptor is close-on-exec and never 0, 1 or 2: a program that
 *   closed the standard descriptors expects its next open() to return
 *   them, and whatever it then writes to stdout must not land in a map.
 * - A program may close descriptors it did not open (a daemon closing them
 *   all) and get the same number back from its next open().  Writing
 *   through the old number would put our records into its file, so every
 *   use checks that the number still refers to our open file description
 *   (it carries a tag, see DESCRIPTION_TAG), and reopens our file by name
 *   if the program closed it.
 * - Records are appended (O_APPEND), each with one write(), so they land
 *   after whatever the file holds, even if another process cut it short.
 *   Lines (the perf map's) go on a line of their own: after a newline
 *   where someone else left one unfinished or cut the file in one.  A
 *   write cut short (a full disk) is never cut back, since others may
 *   have written after it: the backend is told how much went in.
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
#include <sys/file.h>             // flock()
#include <sys/stat.h>             // fstat()
#include <sys/sysmacros.h>        // major(), minor()
#include <time.h>                 // clock_gettime()
#include <unistd.h>               // write(), pread(), lseek()

/* Open flags of every profiler file: see the top of this file. */
#define FILE_FLAGS (O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK)
/* Read (an exec'd image looks at what the one before wrote), append. */
#define FILE_ACCESS (O_RDWR | O_APPEND)

/* Write all of `buf`: one write() unless the kernel takes less.  Returns
   0, or -1 with errno set and *written the bytes that did go. */
static int
write_all(int fd, const void *buf, size_t size, size_t *written)
{
    const char *p = buf;
    *written = 0;
    while (*written < size) {
        ssize_t n = write(fd, p + *written, size - *written);
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n <= 0) {
            if (n == 0) {
                errno = ENOSPC;
            }
            return -1;
        }
        *written += (size_t)n;
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
    size_t written;
    (void)write_all(STDERR_FILENO, line, n, &written);
}

void
_PyPerf_CloseKeepErrno(int fd)
{
    int saved = errno;
    close(fd);
    errno = saved;
}

/* The tag of our open file descriptions: a signal number set with
   F_SETSIG, which the kernel would send only for O_ASYNC, never set on
   them.  Every description starts with 0, so a descriptor whose
   description has the tag is one we opened (or a dup of it). */
#define DESCRIPTION_TAG 62

static int
tag_description(int fd)
{
    return fcntl(fd, F_SETSIG, DESCRIPTION_TAG) == 0;
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

/* The wall-clock time this process started, from its start in clock
   ticks after boot (field 22 of its main thread's stat file, the same as
   /proc/self/stat's, which qemu-user makes up anew at each exec).
   Returns 0, or -1 if it cannot be had. */
static int
process_start_time(struct timespec *start)
{
    char buf[1024];
    /* Only this process's threads are under /proc/self/task: in another
       PID namespace's /proc, the number is missing or one of our
       threads, never another process's. */
    PyOS_snprintf(buf, sizeof(buf), "/proc/self/task/%ld/stat",
                  (long)getpid());
    int fd = open(buf, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fd = open("/proc/self/stat", O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0) {
        return -1;
    }
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    _PyPerf_CloseKeepErrno(fd);
    if (n <= 0) {
        return -1;
    }
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: count
       the fields after its last ')', which is followed by field 3. */
    char *p = strrchr(buf, ')');
    for (int field = 2; p != NULL && field < 22; field++) {
        p = strchr(p + 1, ' ');
    }
    long hz = sysconf(_SC_CLK_TCK);
    struct timespec boot, real;
    if (p == NULL || hz <= 0 || clock_gettime(CLOCK_BOOTTIME, &boot) < 0
        || clock_gettime(CLOCK_REALTIME, &real) < 0)
    {
        return -1;
    }
    unsigned long long ticks = strtoull(p + 1, NULL, 10);
    /* start = now - (time since boot - start after boot), in ns */
    long long ns = ((long long)real.tv_sec - boot.tv_sec) * 1000000000LL
                   + (real.tv_nsec - boot.tv_nsec)
                   + (long long)(ticks / (unsigned long)hz) * 1000000000LL
                   + (long long)(ticks % (unsigned long)hz)
                     * (1000000000LL / hz);
    start->tv_sec = ns / 1000000000LL;
    start->tv_nsec = ns % 1000000000LL;
    return 0;
}

/* Was the file last changed after this process started?  The start time
   is had in clock ticks (10 ms), rounded down: a dead process that had
   our pid and wrote its file within a tick before ours started is taken
   for us, which takes a pid reused within 10 ms.  Unknown: no. */
static int
written_since_start(const struct stat *st)
{
    struct timespec start;
    if (process_start_time(&start) < 0) {
        return 0;
    }
    return (st->st_mtim.tv_sec > start.tv_sec
            || (st->st_mtim.tv_sec == start.tv_sec
                && st->st_mtim.tv_nsec >= start.tv_nsec));
}

/* Open `path` with `access` (creating it, or only creating it with
   `excl`), and check that it is a plain file of ours with no other link.
   It is opened write-only first: read-write would open a FIFO planted
   there (and wake a writer waiting on it) where write-only, non-blocking,
   fails with ENXIO. */
static int
open_checked(const char *path, int access, int excl, struct stat *st)
{
    int fd = open_above_stdio(path, O_WRONLY | O_CREAT | (excl ? O_EXCL : 0)
                                    | FILE_FLAGS, 0600);
    if (fd < 0) {
        return -1;
    }
    if (fstat(fd, st) < 0) {
        goto error;
    }
    if (!S_ISREG(st->st_mode) || st->st_uid != geteuid()
        || st->st_nlink != 1)
    {
        errno = EPERM;
        goto error;
    }
    if (fchmod(fd, 0600) < 0) {
        goto error;
    }
    if ((access & O_ACCMODE) != O_WRONLY) {
        /* The same file again, read-write: the name may have been
           replaced meanwhile. */
        int rw = open_above_stdio(path, access | FILE_FLAGS, 0);
        struct stat again;
        if (rw < 0) {
            goto error;
        }
        if (fstat(rw, &again) < 0 || again.st_dev != st->st_dev
            || again.st_ino != st->st_ino)
        {
            _PyPerf_CloseKeepErrno(rw);
            errno = ESTALE;
            goto error;
        }
        /* Under the first one's number: the lowest free one, as the
           program expects of whatever opens a file next. */
        int moved = dup3(rw, fd, O_CLOEXEC);
        _PyPerf_CloseKeepErrno(rw);
        if (moved < 0) {
            goto error;
        }
    }
    return fd;

error:
    _PyPerf_CloseKeepErrno(fd);
    return -1;
}

static int read_lines(int in, off_t size, _PyPerf_LinesFunc each,
                      void *arg);

/* Take the writers' lock on `fd`.  Returns 1 if another open file
   description holds it (_PyPerf_File.relock: try again at each write),
   else 0. */
static int
take_lock(int fd)
{
    return flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK;
}

/* Reads /proc/locks for locked_by_us(). */
typedef struct {
    const struct stat *st;
    long self;
    int ours;                   /* locks on the file that we took */
    int others;                 /* ... that anyone else took */
} lock_owners;

static int
count_lock_owners(char *lines, size_t size, void *arg)
{
    lock_owners *owners = arg;
    char *end = lines + size;
    for (char *line = lines; line < end;) {
        char *nl = memchr(line, '\n', end - line);
        *nl = '\0';
        /* "ID: FLOCK  ADVISORY  WRITE PID MAJ:MIN:INODE 0 EOF", device
           numbers in hex; a waiter's line has "->" before FLOCK. */
        long pid;
        unsigned int maj, min;
        unsigned long long ino;
        if (sscanf(line, "%*[0-9]: FLOCK ADVISORY %*s %ld %x:%x:%llu",
                   &pid, &maj, &min, &ino) == 4
            && ino == (unsigned long long)owners->st->st_ino
            && maj == major(owners->st->st_dev)
            && min == minor(owners->st->st_dev))
        {
            if (pid == owners->self) {
                owners->ours++;
            }
            else {
                owners->others++;
            }
        }
        line = nl + 1;
    }
    return 0;
}

/* More of /proc/locks than any machine has (its size reads as 0). */
#define PROC_LOCKS_MAX ((off_t)1 << 30)

/* Was every flock on the file `st` describes taken by this process (the
   image before an exec), none by another with our pid number in another
   pid namespace?  The kernel keeps the pid of the process that took a
   flock, also while a child it forked holds it through the open file
   description it inherited.  /proc numbers that pid in its own pid
   namespace (a process it cannot see is left out), and this process as
   /proc/self.  Unknown (no /proc): no. */
static int
locked_by_us(const struct stat *st)
{
    char self[24];
    ssize_t n = readlink("/proc/self", self, sizeof(self) - 1);
    if (n <= 0) {
        return 0;
    }
    self[n] = '\0';
    char *end;
    lock_owners owners = {.st = st, .self = strtol(self, &end, 10)};
    if (*end != '\0' || owners.self <= 0) {
        return 0;
    }
    int in = open_above_stdio("/proc/locks", O_RDONLY | O_CLOEXEC, 0);
    if (in < 0) {
        return 0;
    }
    int res = read_lines(in, PROC_LOCKS_MAX, count_lock_owners, &owners);
    _PyPerf_CloseKeepErrno(in);
    return res == 0 && owners.ours > 0 && owners.others == 0;
}

int
_PyPerf_FileOpen(_PyPerf_File *file, const char *path, int flags)
{
    struct stat st;
    int fd = open_checked(path, FILE_ACCESS, 0, &st);
    if (fd < 0) {
        return -1;
    }
    /* A live process with our pid number (another pid namespace sharing
       /tmp) holds its file locked: never ours to keep.  The image before
       an exec of this process is no such process (see the top of this
       file). */
    int relock = take_lock(fd);
    int in_use = relock && !locked_by_us(&st);
    if (in_use
        || (st.st_size > 0
            && (!(flags & _PyPerf_FILE_KEEP) || !written_since_start(&st))))
    {
        /* See the top of this file. */
        _PyPerf_CloseKeepErrno(fd);
        if (unlink(path) < 0 && errno != ENOENT) {
            return -1;
        }
        fd = open_checked(path, FILE_ACCESS, 1, &st);
        if (fd < 0) {
            return -1;
        }
        relock = take_lock(fd);
    }
    file->fd = fd;
    file->relock = relock;
    file->tagged = tag_description(fd);
    file->dev = st.st_dev;
    file->ino = st.st_ino;
    file->size = st.st_size;
    PyOS_snprintf(file->path, sizeof(file->path), "%s", path);
    return 0;
}

static int
is_our_file(int fd, const _PyPerf_File *file)
{
    struct stat st;
    return (fstat(fd, &st) == 0 && st.st_dev == file->dev
            && st.st_ino == file->ino);
}

/* Is `fd` still the descriptor we opened on our file?  Asked before every
   write.  With the tag, one system call: only our open file description
   has it.  Without, two: the file (fstat), and the flags (F_GETFL), since
   a program that closed ours may have opened the same file itself and
   got the same number back. */
static int
is_our_descriptor(int fd, const _PyPerf_File *file)
{
    if (file->tagged) {
        return fcntl(fd, F_GETSIG) == DESCRIPTION_TAG;
    }
    int flags = fcntl(fd, F_GETFL);
    return (flags >= 0
            && (flags & (O_ACCMODE | O_APPEND | O_NONBLOCK))
               == (FILE_ACCESS | O_NONBLOCK)
            && is_our_file(fd, file));
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
    if (file->fd >= 0 && is_our_descriptor(file->fd, file)) {
        if (file->relock) {
            file->relock = take_lock(file->fd);
        }
        return 0;
    }
    /* The number is no longer ours (never close it: it may be the
       program's now).  Reopen our file by name, if it is still there. */
    file->fd = -1;
    if (file->path[0] == '\0') {
        errno = EBADF;
        return -1;
    }
    int fd = open_ours(file->path, FILE_ACCESS | FILE_FLAGS, file);
    if (fd < 0) {
        return -1;
    }
    file->fd = fd;
    file->relock = take_lock(fd);   /* the old descriptor's went */
    file->tagged = tag_description(fd);
    return 0;
}

/* Does the file end inside a line (someone else's, unfinished, or one
   cut short)?  *end receives its size.  Asked before every write of lines:
   one lseek() to the end, about 0.2 us, a seventh of what a new function's
   line costs when it is written alone (fstat() costs twice as much; the
   offset is where a write on this O_APPEND descriptor leaves it anyway).
   The file's last byte is read only if its size is not where our last
   write of lines left it (someone else wrote, or cut it, since).  A file
   cut and filled back to exactly that size passes for ours.  Returns 1 or
   0, or -1 with errno set. */
static int
ends_inside_line(const _PyPerf_File *file, off_t *end)
{
    *end = lseek(file->fd, 0, SEEK_END);
    if (*end < 0) {
        return -1;
    }
    if (*end == 0 || *end == file->lines_end) {
        return 0;
    }
    char last;
    ssize_t n = pread(file->fd, &last, 1, *end - 1);
    if (n < 0) {
        return -1;
    }
    /* (0: cut shorter meanwhile: what is left is not known, as when a
       writer gets in between this look and the write.) */
    return n == 1 && last != '\n';
}

/* Append `size` bytes with one write(); `lines`: whole lines, which start
   on a line of their own (a newline goes first, in a write of its own, if
   the file ends inside a line). */
static int
append(_PyPerf_File *file, const void *buf, size_t size, int lines,
       size_t *written)
{
    *written = 0;
    if (check_file(file) < 0) {
        return -1;
    }
    off_t end = 0;
    if (lines) {
        int inside = ends_inside_line(file, &end);
        size_t newline;
        if (inside < 0
            || (inside && write_all(file->fd, "\n", 1, &newline) < 0))
        {
            return -1;
        }
        file->size += inside;
        end += inside;
    }
    int res = write_all(file->fd, buf, size, written);
    file->size += (off_t)*written;
    /* After anything else (bytes that are not whole lines, or a write cut
       short), the next write of lines looks at the file's last byte. */
    file->lines_end = (lines && res == 0) ? end + (off_t)size : 0;
    return res;
}

int
_PyPerf_FileAppend(_PyPerf_File *file, const void *buf, size_t size,
                   size_t *written)
{
    return append(file, buf, size, 0, written);
}

int
_PyPerf_FileAppendLines(_PyPerf_File *file, const char *lines, size_t size,
                        size_t *written)
{
    return append(file, lines, size, 1, written);
}

/* Before a fork: file->size becomes the end of our last write (the
   descriptor's offset), the bytes a child copies.  The parent may write
   more after the fork, and others may have cut the file short. */
void
_PyPerf_FileMarkEnd(_PyPerf_File *file)
{
    if (file->fd >= 0 && is_our_descriptor(file->fd, file)) {
        off_t end = lseek(file->fd, 0, SEEK_CUR);
        if (end >= 0) {
            file->size = end;
        }
    }
}

/* A read-only descriptor of our file (e.g. to map it, or to copy it in a
   forked child), or -1 with errno set. */
int
_PyPerf_FileOpenReadOnly(const _PyPerf_File *file)
{
    char fdpath[64];
    int fd = -1;
    if (file->fd >= 0 && is_our_descriptor(file->fd, file)) {
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
    if (file->fd >= 0 && is_our_descriptor(file->fd, file)) {
        _PyPerf_CloseKeepErrno(file->fd);
    }
    file->fd = -1;
    file->size = 0;
    file->lines_end = 0;
    file->path[0] = '\0';
}

/* Bytes read at a time when lines are read: a longer line cannot be.
   (Ours are at most about 3.3 KiB.) */
#define LINES_BUFFER_SIZE (64 * 1024)

/* Pass the whole lines among the first `size` bytes of `in` to `each`,
   many at a time, each batch ending with a newline.  Bytes after the last
   newline are not a whole line: they are left out.  Returns 0, or -1 with
   errno set (EINVAL: a line longer than LINES_BUFFER_SIZE), or what
   `each` returned if not 0. */
static int
read_lines(int in, off_t size, _PyPerf_LinesFunc each, void *arg)
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
        res = each(buf, whole, arg);
        if (res != 0) {
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

/* The whole lines among the first `size` bytes of `from`, to `each`. */
int
_PyPerf_ReadLines(const _PyPerf_File *from, off_t size,
                  _PyPerf_LinesFunc each, void *arg)
{
    int in = _PyPerf_FileOpenReadOnly(from);
    if (in < 0) {
        return -1;
    }
    int res = read_lines(in, size, each, arg);
    _PyPerf_CloseKeepErrno(in);
    return res;
}

/* The whole lines of the file at `path`, as it is now, to `each`.  It
   must be a regular file, and not `not_this` (a file of ours being
   written).  Returns 0, or -1 with errno set (EISDIR: a directory;
   EINVAL: another kind of file, or `not_this`). */
int
_PyPerf_ReadLinesOf(const char *path, const _PyPerf_File *not_this,
                    _PyPerf_LinesFunc each, void *arg)
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
        || (not_this->path[0] != '\0' && st.st_dev == not_this->dev
            && st.st_ino == not_this->ino))
    {
        errno = EINVAL;
        goto done;
    }
    res = read_lines(in, st.st_size, each, arg);

done:
    _PyPerf_CloseKeepErrno(in);
    return res;
}

/* Close the descriptor (if it is still ours) but remember the file:
   _PyPerf_FileAppend and _PyPerf_FileReopen find it again by name. */
void
_PyPerf_FileClose(_PyPerf_File *file)
{
    if (file->fd >= 0 && is_our_descriptor(file->fd, file)) {
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
