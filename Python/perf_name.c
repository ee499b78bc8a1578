/*
 * Perf trampolines: the names profilers show, "py::<qualname>:<filename>"
 * =======================================================================
 *
 * Written byte by byte from the str's code points, so it cannot fail or
 * raise (code objects' names are ready strings; anything else is "?"):
 * control characters (which could end a map line) become \xNN, lone
 * surrogates (not encodable as UTF-8) become \uXXXX, everything else is
 * UTF-8.  Each part has a byte budget: a longer one is cut and ends in
 * "...", which keeps every entry one bounded line.
 */

#include "Python.h"
#include "pycore_perf.h"

#ifdef PY_HAVE_PERF_TRAMPOLINE

/* The parts' budgets, in bytes after escaping. */
#define MAX_QUALNAME 1024
#define MAX_FILENAME 2048


static size_t
append_escaped(char *buf, size_t pos, size_t budget, PyObject *str)
{
    static const char hex[] = "0123456789abcdef";
    size_t end = pos + budget;
    if (!PyUnicode_Check(str) || !PyUnicode_IS_READY(str)) {
        buf[pos++] = '?';
        return pos;
    }
    int kind = PyUnicode_KIND(str);
    const void *data = PyUnicode_DATA(str);
    Py_ssize_t length = PyUnicode_GET_LENGTH(str);
    Py_ssize_t i = 0;
    if (PyUnicode_IS_ASCII(str)) {
        /* The common case: copy the printable prefix in one go (the
           whole string, or as much as the budget takes, for most). */
        const unsigned char *ascii = data;
        Py_ssize_t room = (Py_ssize_t)(end - pos) - 3;
        Py_ssize_t n = Py_MAX(Py_MIN(length, room), 0);
        if (_PyPerf_CountControls(ascii, (size_t)n) == 0) {
            i = n;
        }
        else {
            while (i < n && !_PyPerf_IsControl(ascii[i])) {
                i++;
            }
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

#endif  /* PY_HAVE_PERF_TRAMPOLINE */
