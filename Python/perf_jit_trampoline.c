/*
 * The perf_jit backend: trampolines described in a jitdump file
 * ==============================================================
 *
 * Why.  The perf map backend (Python/perf_map.c) only names address
 * ranges; perf finds the trampolines on the stack by walking frame
 * pointers, so every C function between two Python frames must keep one.
 * Many interpreters are built without frame pointers, and there perf's
 * other unwinder, `perf record --call-graph dwarf`, is the one that works:
 * it copies a slice of the user stack with each sample and unwinds it
 * afterwards with DWARF call frame information (CFI).  The interpreter's
 * own functions have CFI in its .eh_frame; trampolines are made at run time
 * and have none.  This backend supplies it.
 *
 * How.  perf's jitdump format (tools/perf/Documentation/
 * jitdump-specification.txt) lets a JIT write, for every piece of code,
 * its name, address, bytes and unwind tables to /tmp/jit-<pid>.dump.  The
 * process maps the first page of that file executable so that `perf
 * record` sees an mmap of it; `perf inject --jit` later finds that event,
 * reads the dump and turns every code load into a small ELF file
 * (jitted-<pid>-<index>.so: .text, .eh_frame, .eh_frame_hdr, a symbol)
 * plus an mmap event placing it at the code's address.  Reports made from
 * the injected perf.data then unwind through trampolines like through any
 * shared library:
 *
 *     perf record -k 1 --call-graph dwarf ./python -X perf_jit app.py
 *     perf inject --jit -i perf.data -o perf.jit.data
 *     perf report -i perf.jit.data
 *
 * (-k 1: timestamps from CLOCK_MONOTONIC, the clock of our records.)
 *
 * The file.  All fields in host byte order:
 *
 *     +-------------------------------------------------------------+
 *     | header: magic "JiTD" 0x4A695444, version 1, header size,    |
 *     |         ELF machine, pad, pid, timestamp, flags (40 bytes)  |
 *     +-------------------------------------------------------------+
 *     | JIT_CODE_UNWINDING_INFO       } for each trampoline, in the |
 *     |   prefix (id 4, size, time)   } order they were made, one   |
 *     |   unwinding size, .eh_frame_hdr size, mapped size           |
 *     |   .eh_frame: CIE, FDE, terminator                           |
 *     |   .eh_frame_hdr: pointers + a one-entry search table        |
 *     | JIT_CODE_LOAD                 } append for both records     |
 *     |   prefix (id 0, size, time)                                 |
 *     |   pid, tid, vma, code address, code size, code index        |
 *     |   name "py::qualname:filename\0", then the code's bytes     |
 *     +-------------------------------------------------------------+
 *     | ...                                                         |
 *
 * perf applies an unwinding record to the code load that follows it.  The
 * specification says the unwinding data starts with the .eh_frame_hdr;
 * perf (genelf.c) reads it the other way round, .eh_frame first, and perf
 * is what we write for.
 *
 * The unwind tables.  perf's ELF places .eh_frame right after .text,
 * rounded up to 8 bytes, and .eh_frame_hdr right after .eh_frame:
 *
 *     ELF address:   T             T + A             T + A + E
 *                    | code (size) | pad | .eh_frame   | .eh_frame_hdr |
 *
 * with A = ALIGN_8(code size) and E = size of our .eh_frame (T, the text
 * offset, is a multiple of 16 in every perf version).  EH_FRAME_DISTANCE()
 * is A; jit_span() gives each trampoline [T, T + A + tables) so that
 * perf's mapping of it covers its tables.  The tables come from
 * Python/perf_unwind.c (_PyPerf_DescribeCode, _PyPerf_BuildEhFrame), which
 * derives their rules from the running template's instructions; all their
 * pointers are relative, so init_unwind_info() builds them once.
 *
 * Everything here runs with the GIL held.
 */

#include "Python.h"
#include "pycore_perf.h"          // _PyPerf_Backend

#ifdef PY_HAVE_PERF_JIT_TRAMPOLINE

#include <errno.h>
#include <fcntl.h>                // open()
#include <pthread.h>              // pthread_atfork()
#include <stddef.h>               // offsetof()
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>             // mmap()
#include <sys/syscall.h>          // SYS_gettid
#include <time.h>                 // clock_gettime()
#include <unistd.h>               // pread(), getpid(), sysconf()

/* ----------------------------------------------------------------------
 * Constants
 */

/* jitdump (perf's jitdump-specification.txt) */
#define JITDUMP_MAGIC               0x4A695444u     /* "JiTD" */
#define JITDUMP_VERSION             1
#define JIT_CODE_LOAD               0
#define JIT_CODE_UNWINDING_INFO     4

/* Where perf puts .eh_frame relative to the code (see above). */
#define EH_FRAME_DISTANCE(code_size) _Py_SIZE_ROUND_UP((code_size), 8)

/* Bounds for the buffers below; init refuses a larger template. */
#define MAX_TEMPLATE_SIZE           64
#define MAX_UNWIND_SIZE             256

/* ----------------------------------------------------------------------
 * Records
 */

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint32_t total_size;        /* of this header */
    uint32_t elf_mach;
    uint32_t pad1;
    uint32_t pid;
    uint64_t timestamp;
    uint64_t flags;             /* 0: timestamps are CLOCK_MONOTONIC */
} jitdump_header;

typedef struct {
    uint32_t id;                /* JIT_CODE_* */
    uint32_t total_size;        /* of the record, this prefix included */
    uint64_t timestamp;
} record_prefix;

typedef struct {
    record_prefix p;            /* id JIT_CODE_UNWINDING_INFO */
    uint64_t unwinding_size;    /* .eh_frame + .eh_frame_hdr */
    uint64_t eh_frame_hdr_size;
    uint64_t mapped_size;       /* of the unwinding data in memory */
    /* followed by: .eh_frame, .eh_frame_hdr, zero padding to 8 */
} unwinding_record;

typedef struct {
    record_prefix p;            /* id JIT_CODE_LOAD */
    uint32_t pid;
    uint32_t tid;
    uint64_t vma;               /* = code_addr */
    uint64_t code_addr;
    uint64_t code_size;
    uint64_t code_index;        /* unique in the file, increasing */
    /* followed by: the name and a NUL, then code_size bytes of code
       (perf finds the code at the record's end: no padding) */
} code_load_record;

_Static_assert(sizeof(jitdump_header) == 40, "jitdump header layout");
_Static_assert(sizeof(record_prefix) == 16, "jitdump prefix layout");
_Static_assert(sizeof(unwinding_record) == 40, "unwinding record layout");
_Static_assert(sizeof(code_load_record) == 56, "code load record layout");

/* Bytes read at a time from a dump (copied for a forked child, or kept
   across an exec): a record per system call made a fork of a large parent
   take a third of a second. */
#define COPY_CHUNK (256 * 1024)

/* Largest record we write: a code load with the longest name. */
#define MAX_RECORD_SIZE \
    (sizeof(code_load_record) + _PyPerf_MAX_NAME + 1 + MAX_TEMPLATE_SIZE)

/* ----------------------------------------------------------------------
 * State
 */

typedef enum {
    UNWIND_UNTRIED,             /* the tables are not built yet */
    UNWIND_OK,
    UNWIND_REFUSED,             /* the template cannot be described */
} unwind_status;

static struct {
    unwind_status status;
    int saved_errno;            /* why status is UNWIND_REFUSED */
    size_t code_size;           /* the template's size */
    uint8_t unwind[MAX_UNWIND_SIZE];    /* .eh_frame + .eh_frame_hdr */
    size_t unwind_size;
    size_t eh_frame_hdr_size;
    _PyPerf_File file;          /* /tmp/jit-<pid>.dump */
    int torn;                   /* it ends in a record cut short */
    void *marker;               /* the file's first page, mapped PROT_EXEC */
    size_t marker_size;
    uint64_t code_index;        /* of the next code load */
    uint32_t pid;               /* 0: not asked since the last fork */
    int ids_kept;               /* forget_ids() runs at a fork */
    /* Records are built here, not on the C stack: this runs on the first
       call of a function, possibly deep in the C stack (the GIL
       serializes us). */
    char record[sizeof(unwinding_record) + MAX_UNWIND_SIZE + 8
                + MAX_RECORD_SIZE];
} jitdump = {.file = {.fd = -1}};

static uint64_t
monotonic_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) < 0) {
        return 0;
    }
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Every code load carries the pid and tid: asked of the kernel once per
   process and thread, not per record (they were two of a record's four
   system calls).  A fork() runs forget_ids() in the child, in the
   thread that forked; if the handler could not be registered, every
   record asks. */
static pthread_once_t ids_once = PTHREAD_ONCE_INIT;
static _Thread_local uint32_t thread_id;    /* 0: not asked yet */

static void
forget_ids(void)
{
    jitdump.pid = 0;
    thread_id = 0;
}

static void
register_forget_ids(void)
{
    jitdump.ids_kept = (pthread_atfork(NULL, NULL, forget_ids) == 0);
}

static uint32_t
current_pid(void)
{
    if (jitdump.pid == 0 || !jitdump.ids_kept) {
        jitdump.pid = (uint32_t)getpid();
    }
    return jitdump.pid;
}

static uint32_t
current_tid(void)
{
    if (thread_id == 0 || !jitdump.ids_kept) {
        thread_id = (uint32_t)syscall(SYS_gettid);
    }
    return thread_id;
}

/* Build the unwind tables once; the answer is kept. */
static int
init_unwind_info(void)
{
    if (jitdump.status == UNWIND_UNTRIED) {
        _PyPerf_TemplateCFI cfi;
        size_t code_size = _PyPerf_TemplateEnd - _PyPerf_TemplateStart;
        Py_ssize_t n = -1;
        if (code_size > MAX_TEMPLATE_SIZE) {
            errno = EFBIG;
        }
        else if (_PyPerf_DescribeCode(_PyPerf_EM_HOST,
                                      (const uint8_t *)_PyPerf_TemplateStart,
                                      code_size, &cfi, 1) == 0)
        {
            n = _PyPerf_BuildEhFrame(&cfi, EH_FRAME_DISTANCE(code_size),
                                     jitdump.unwind, sizeof(jitdump.unwind),
                                     &jitdump.eh_frame_hdr_size);
        }
        if (n < 0) {
            jitdump.status = UNWIND_REFUSED;
            jitdump.saved_errno = errno;
        }
        else {
            jitdump.status = UNWIND_OK;
            jitdump.code_size = code_size;
            jitdump.unwind_size = (size_t)n;
        }
    }
    if (jitdump.status == UNWIND_REFUSED) {
        errno = jitdump.saved_errno;
        return -1;
    }
    return 0;
}

/* ----------------------------------------------------------------------
 * The file
 */

/* Append whole records.  A write that fails part way leaves a record cut
   short, never cut back (see perf_files.c): it would hide every record
   after it from perf inject, so none are written after it. */
static int
append(const void *records, size_t size)
{
    if (jitdump.torn) {
        errno = EIO;
        return -1;
    }
    size_t written;
    int res = _PyPerf_FileAppend(&jitdump.file, records, size, &written);
    jitdump.torn = (res < 0 && written > 0);
    return res;
}

/* Map the file's first page executable: perf record logs the mmap, and
   that event is how perf inject finds the dump.  A read-only descriptor
   is all the mapping needs. */
static int
map_marker(void)
{
    int rfd = _PyPerf_FileOpenReadOnly(&jitdump.file);
    if (rfd < 0) {
        return -1;
    }
    long page = sysconf(_SC_PAGESIZE);
    size_t size = page > 0 ? (size_t)page : 4096;
    void *mem = mmap(NULL, size, PROT_READ | PROT_EXEC, MAP_PRIVATE, rfd, 0);
    _PyPerf_CloseKeepErrno(rfd);
    if (mem == MAP_FAILED) {
        return -1;
    }
    jitdump.marker = mem;
    jitdump.marker_size = size;
    return 0;
}

static void
unmap_marker(void)
{
    if (jitdump.marker != NULL) {
        (void)munmap(jitdump.marker, jitdump.marker_size);
        jitdump.marker = NULL;
    }
}

/* Find the end of the whole records of a dump this process wrote before
   an exec (jitdump.file.size is the file's size on entry), cut off what
   follows (a pair of records the image before was writing when it went),
   and number the next code loads after every index used before.  Returns
   0, or -1 with errno set (EINVAL: not a dump of this process's).
   Cutting back is right here, unlike in the perf map: the header says this
   process wrote the file, and a record cut short would hide every record
   after it from perf inject. */
static int
adopt_records(void)
{
    int fd = jitdump.file.fd;
    off_t size = jitdump.file.size;
    jitdump_header header;
    if (pread(fd, &header, sizeof(header), 0) != (ssize_t)sizeof(header)
        || header.magic != JITDUMP_MAGIC
        || header.version != JITDUMP_VERSION
        || header.total_size != sizeof(header)
        || header.elf_mach != _PyPerf_EM_HOST
        || header.pid != current_pid())
    {
        errno = EINVAL;
        return -1;
    }
    /* Not on the C stack: this can run in a deep one. */
    char *buf = PyMem_RawMalloc(COPY_CHUNK);
    if (buf == NULL) {
        errno = ENOMEM;
        return -1;
    }
    off_t pos = sizeof(header);     /* the record at hand */
    off_t whole = pos;              /* after the last code load */
    ssize_t n = 0;
    off_t buf_start = pos;
    for (;;) {
        record_prefix prefix;
        if (pos + (off_t)sizeof(prefix) > buf_start + n) {
            /* Read on from this record. */
            buf_start = pos;
            n = pread(fd, buf, COPY_CHUNK, pos);
            if (n < 0) {
                /* Cut nothing off on the strength of a failed read. */
                int saved = errno;
                PyMem_RawFree(buf);
                errno = saved;
                return -1;
            }
            if (n < (ssize_t)sizeof(prefix)) {
                break;
            }
        }
        memcpy(&prefix, buf + (pos - buf_start), sizeof(prefix));
        if (prefix.total_size < sizeof(prefix)
            || prefix.total_size > MAX_RECORD_SIZE
            || pos + (off_t)prefix.total_size > size)
        {
            break;
        }
        pos += prefix.total_size;
        if (prefix.id == JIT_CODE_LOAD) {
            whole = pos;
        }
    }
    PyMem_RawFree(buf);
    if (whole < size && ftruncate(fd, whole) < 0) {
        return -1;
    }
    jitdump.file.size = whole;
    jitdump.code_index = (uint64_t)size;
    return 0;
}

/* Open this process's dump, unless it has one (perhaps closed by the
   program: reopened on use): a new one gets the header.  Then map the
   marker. */
static int
open_dump(char *path, size_t path_size)
{
    if (jitdump.file.path[0] != '\0') {
        return 0;
    }
    PyOS_snprintf(path, path_size, "/tmp/jit-%ld.dump", (long)current_pid());
    if (_PyPerf_FileOpen(&jitdump.file, path, _PyPerf_FILE_KEEP) < 0) {
        return -1;
    }
    jitdump.torn = 0;
    if (jitdump.file.size > 0 && adopt_records() < 0) {
        _PyPerf_FileForget(&jitdump.file);
        if (_PyPerf_FileOpen(&jitdump.file, path, 0) < 0) {
            return -1;
        }
    }
    if (jitdump.file.size == 0) {
        jitdump_header header = {
            .magic = JITDUMP_MAGIC,
            .version = JITDUMP_VERSION,
            .total_size = sizeof(header),
            .elf_mach = _PyPerf_EM_HOST,
            .pid = current_pid(),
            .timestamp = monotonic_ns(),
        };
        if (append(&header, sizeof(header)) < 0)
        {
            _PyPerf_FileForget(&jitdump.file);
            return -1;
        }
    }
    if (map_marker() < 0) {
        _PyPerf_FileForget(&jitdump.file);
        return -1;
    }
    return 0;
}

/* In a forked child: copy the parent's records (from the parent's file,
   up to `end`) into ours.  They become the child's: its pid and tid in
   every code load, and the time of the copy, which follows the fork, so
   perf places the child's mappings after it created the child.  Read and
   written COPY_CHUNK bytes at a time. */

static int
copy_parent_records(const _PyPerf_File *parent, off_t end)
{
    int in = _PyPerf_FileOpenReadOnly(parent);
    if (in < 0) {
        return -1;
    }
    char *buf = PyMem_RawMalloc(COPY_CHUNK);
    if (buf == NULL) {
        _PyPerf_CloseKeepErrno(in);
        errno = ENOMEM;
        return -1;
    }
    uint32_t pid = current_pid();
    uint32_t tid = current_tid();
    uint64_t now = monotonic_ns();
    off_t offset = sizeof(jitdump_header);
    size_t have = 0;            /* bytes in buf, from offset */
    int res = 0;
    while (offset < end) {
        /* Fill the buffer after the part of a record left from the last
           round. */
        size_t want = (size_t)Py_MIN((off_t)(COPY_CHUNK - have),
                                     end - offset - (off_t)have);
        ssize_t n = want > 0 ? pread(in, buf + have, want,
                                     offset + (off_t)have) : 0;
        if (n < 0 && errno == EINTR) {
            continue;
        }
        if (n < 0 || (n == 0 && want > 0)) {
            if (n == 0) {
                errno = EIO;
            }
            res = -1;
            break;
        }
        have += (size_t)n;
        /* Patch the whole records in the buffer. */
        size_t pos = 0;
        while (pos + sizeof(record_prefix) <= have) {
            record_prefix prefix;
            memcpy(&prefix, buf + pos, sizeof(prefix));
            if (prefix.total_size < sizeof(prefix)
                || prefix.total_size > MAX_RECORD_SIZE)
            {
                errno = EIO;        /* not a file we wrote */
                res = -1;
                break;
            }
            if (pos + prefix.total_size > have) {
                break;
            }
            char *record = buf + pos;
            memcpy(record + offsetof(record_prefix, timestamp), &now,
                   sizeof(now));
            if (prefix.id == JIT_CODE_LOAD) {
                memcpy(record + offsetof(code_load_record, pid), &pid,
                       sizeof(pid));
                memcpy(record + offsetof(code_load_record, tid), &tid,
                       sizeof(tid));
            }
            pos += prefix.total_size;
        }
        if (res < 0) {
            break;
        }
        if (pos == 0) {
            errno = EIO;            /* a record cut short at the end */
            res = -1;
            break;
        }
        if (append(buf, pos) < 0) {
            res = -1;
            break;
        }
        memmove(buf, buf + pos, have - pos);
        have -= pos;
        offset += (off_t)pos;
    }
    PyMem_RawFree(buf);
    _PyPerf_CloseKeepErrno(in);
    return res;
}

/* ----------------------------------------------------------------------
 * The backend
 */

static int
jit_init(char *path, size_t path_size)
{
    pthread_once(&ids_once, register_forget_ids);
    if (init_unwind_info() < 0) {
        PyOS_snprintf(path, path_size, "/tmp/jit-%ld.dump",
                      (long)current_pid());
        return -1;
    }
    return open_dump(path, path_size);
}

static int
jit_write_entry(const void *code, size_t code_size,
                const char *name, size_t name_size)
{
    if (code_size != jitdump.code_size) {
        errno = EINVAL;         /* not a copy of the described template */
        return -1;
    }
    char path[64];
    if (open_dump(path, sizeof(path)) < 0) {
        return -1;
    }

    /* Both records in one buffer and one append(), so they are
       written or undone together: perf applies the unwinding record to the
       code load after it. */
    char *buf = jitdump.record;
    uint64_t now = monotonic_ns();
    size_t unwind_padded = _Py_SIZE_ROUND_UP(jitdump.unwind_size, 8);
    unwinding_record unwinding = {
        .p = {
            .id = JIT_CODE_UNWINDING_INFO,
            .total_size = (uint32_t)(sizeof(unwinding) + unwind_padded),
            .timestamp = now,
        },
        .unwinding_size = jitdump.unwind_size,
        .eh_frame_hdr_size = jitdump.eh_frame_hdr_size,
        /* perf's ELF puts the tables right after the code (see the top
           of this file) and its unwinder looks them up at those
           addresses, in whatever mapping it has there.  jit_span() gave
           each trampoline that address range to itself, and declaring the
           tables mapped makes perf's mapping of this trampoline cover it;
           otherwise the address after the code lies in a later
           neighbour's mapping and unwinding stops there. */
        .mapped_size = jitdump.unwind_size,
    };
    code_load_record load = {
        .p = {
            .id = JIT_CODE_LOAD,
            .total_size = (uint32_t)(sizeof(load) + name_size + 1
                                     + code_size),
            .timestamp = now,
        },
        .pid = current_pid(),
        .tid = current_tid(),
        .vma = (uintptr_t)code,
        .code_addr = (uintptr_t)code,
        .code_size = code_size,
        .code_index = jitdump.code_index,
    };
    assert(name_size <= _PyPerf_MAX_NAME);
    char *p = buf;
    memcpy(p, &unwinding, sizeof(unwinding));
    p += sizeof(unwinding);
    memcpy(p, jitdump.unwind, jitdump.unwind_size);
    memset(p + jitdump.unwind_size, 0, unwind_padded - jitdump.unwind_size);
    p += unwind_padded;
    memcpy(p, &load, sizeof(load));
    p += sizeof(load);
    memcpy(p, name, name_size);
    p += name_size;
    *p++ = '\0';
    memcpy(p, code, code_size);
    p += code_size;
    size_t size = (size_t)(p - buf);
    assert(size <= sizeof(jitdump.record));
    if (append(buf, size) < 0) {
        return -1;
    }
    jitdump.code_index++;
    return 0;
}

static int
jit_write_entries(const _PyPerf_Entry *entries, size_t count,
                  size_t code_size)
{
    for (size_t i = 0; i < count; i++) {
        if (jit_write_entry(entries[i].code, code_size, entries[i].name,
                            entries[i].name_size) < 0)
        {
            return -1;
        }
    }
    return 0;
}

static int
jit_after_fork_child(char *path, size_t path_size, int copy)
{
    _PyPerf_File parent;
    if (!_PyPerf_FileDetach(&jitdump.file, &parent)) {
        return 0;
    }
    unmap_marker();             /* the parent's file, too */
    int res = 0;
    if (copy) {
        res = open_dump(path, path_size);
        if (res == 0) {
            res = copy_parent_records(&parent, parent.size);
        }
    }
    _PyPerf_FileForget(&parent);
    return res;
}

/* The address range perf attributes to a trampoline: its code, padded to
   8, then the unwind tables (see jit_write_entry). */
static size_t
jit_span(size_t code_size)
{
    return EH_FRAME_DISTANCE(code_size) + jitdump.unwind_size;
}

const _PyPerf_Backend _PyPerf_JitBackend = {
    .init = jit_init,
    .write_entries = jit_write_entries,
    .after_fork_child = jit_after_fork_child,
    .span = jit_span,
};

#endif  /* PY_HAVE_PERF_JIT_TRAMPOLINE */
