/*
 * The perf map backend: /tmp/perf-<pid>.map
 * ==========================================
 *
 * perf's oldest interface for code it finds no ELF file for
 * (tools/perf/Documentation/jit-interface.txt): one line per trampoline,
 *
 *     START SIZE NAME\n
 *
 * START and SIZE in hex without "0x", NAME to the end of the line
 * ("py::<qualname>:<filename>", made by the core).  perf reads the file
 * when it resolves samples, long after the process is gone, so it is never
 * removed.  Each line (during startup, each batch of lines) is appended
 * with _PyPerf_FileAppend() (Python/perf_files.c), which undoes a partial
 * write, so the file only ever holds whole lines.
 *
 * Everything here runs with the GIL held.
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

#include <errno.h>
#include <unistd.h>               // getpid()

static struct {
    _PyPerf_File file;
    /* Lines made during interpreter startup (site and what it imports)
       are written together when startup ends, instead of with a system
       call each.  After that every line is written as it is
       made, so a process that dies leaves a complete map. */
    int gathering;
    size_t gathered;
    char startup_lines[32 * 1024];
    /* A line is built here, not on the C stack (the GIL serializes us). */
    char line[64 + _PyPerf_MAX_NAME];
} perfmap = {.file = {.fd = -1}};

static int
flush_startup_lines(void)
{
    if (perfmap.gathered == 0) {
        return 0;
    }
    int res = _PyPerf_FileAppend(&perfmap.file, perfmap.startup_lines,
                                 perfmap.gathered);
    perfmap.gathered = 0;
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

/* Open this process's map, unless it has one (perhaps closed by the
   program: reopened on use). */
static int
open_map(char *path, size_t path_size)
{
    PyOS_snprintf(path, path_size, "/tmp/perf-%ld.map", (long)getpid());
    if (perfmap.file.path[0] != '\0') {
        return 0;
    }
    return _PyPerf_FileOpen(&perfmap.file, path);
}

static int
perfmap_init(char *path, size_t path_size, int at_startup)
{
    perfmap.gathering = at_startup;
    return open_map(path, path_size);
}

static int
perfmap_write_entry(const void *code, size_t code_size,
                    const char *name, size_t name_size)
{
    char path[64];
    if (open_map(path, sizeof(path)) < 0) {
        return -1;
    }
    char *line = perfmap.line;
    size_t n = append_hex(line, 0, (uintptr_t)code);
    line[n++] = ' ';
    n = append_hex(line, n, code_size);
    line[n++] = ' ';
    assert(n + name_size + 1 <= sizeof(perfmap.line));
    memcpy(line + n, name, name_size);
    n += name_size;
    line[n++] = '\n';
    if (perfmap.gathering) {
        if (perfmap.gathered + n > sizeof(perfmap.startup_lines)
            && flush_startup_lines() < 0)
        {
            return -1;
        }
        memcpy(perfmap.startup_lines + perfmap.gathered, line, n);
        perfmap.gathered += n;
        return 0;
    }
    return _PyPerf_FileAppend(&perfmap.file, line, n);
}

static int
perfmap_after_fork_child(char *path, size_t path_size, int copy)
{
    _PyPerf_File parent;
    if (!_PyPerf_FileDetach(&perfmap.file, &parent)) {
        return 0;
    }
    int res = 0;
    if (copy) {
        res = open_map(path, path_size);
        if (res == 0 && parent.size > 0) {
            res = _PyPerf_CopyLines(&parent, parent.size,
                                    &perfmap.file);
        }
        if (res == 0) {
            /* Lines the parent had not written yet: it will, to its
               file. */
            res = flush_startup_lines();
        }
    }
    else {
        perfmap.gathered = 0;   /* inherited trampolines: not ours to name */
    }
    _PyPerf_FileForget(&parent);
    return res;
}

static int
perfmap_startup_done(void)
{
    perfmap.gathering = 0;
    return flush_startup_lines();
}

const _PyPerf_Backend _PyPerf_MapBackend = {
    .init = perfmap_init,
    .write_entry = perfmap_write_entry,
    .after_fork_child = perfmap_after_fork_child,
    .startup_done = perfmap_startup_done,
};

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
