/*
 * Perf trampolines: requests from another process
 * ===============================================
 *
 * A tool (Lib/perf_trampoline/: attach, record -p) switches a running
 * program's trampolines on or off by writing a request into
 * _PyPerf_remote (the protocol: Include/internal/pycore_perf.h); the main
 * interpreter acts on it at its next eval-breaker check, as
 * sys.activate_stack_trampoline() would, and logs the outcome for the
 * tool.
 */

#include "Python.h"
#include "pycore_perf.h"

#include <errno.h>

#ifdef PY_HAVE_PERF_TRAMPOLINE

/* Why the request failed, as an errno value for the tool. */
static int
request_error(PyObject *exc)
{
    if (PyErr_GivenExceptionMatches(exc, PyExc_OSError)) {
        PyObject *err = ((PyOSErrorObject *)exc)->myerrno;
        long value = err != NULL && PyLong_Check(err) ? PyLong_AsLong(err)
                                                      : -1;
        PyErr_Clear();
        return value > 0 ? (int)value : EIO;
    }
    if (PyErr_GivenExceptionMatches(exc, PyExc_ValueError)) {
        return EINVAL;          /* a backend this build does not have */
    }
    return EBUSY;               /* no co_extra index left */
}

/* Switch the main interpreter's trampolines for a request of `kind`, as
   sys.activate_stack_trampoline() would, without a word on the program's
   output; returns 0 or the errno of the failure, for the tool. */
static int
switch_for_request(PyThreadState *tstate, int kind)
{
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    int res;
    switch (kind) {
    case _PyPerf_REQUEST_PERF:
        res = _PyPerf_Activate(tstate, "perf");
        break;
    case _PyPerf_REQUEST_PERF_JIT:
        res = _PyPerf_Activate(tstate, "perf_jit");
        break;
    case _PyPerf_REQUEST_OFF:
        res = _PyPerf_Deactivate(tstate);
        break;
    default:
        PyErr_SetString(PyExc_ValueError, "unknown request");
        res = -1;
    }
    int error = 0;
    if (res < 0) {
        PyObject *etype, *evalue, *etb;
        PyErr_Fetch(&etype, &evalue, &etb);
        PyErr_NormalizeException(&etype, &evalue, &etb);
        error = request_error(evalue);
        Py_XDECREF(etype);
        Py_XDECREF(evalue);
        Py_XDECREF(etb);
    }
    PyErr_Restore(type, value, tb);
    return error;
}

#else   /* !PY_HAVE_PERF_TRAMPOLINE */

static int
switch_for_request(PyThreadState *tstate, int kind)
{
    return EOPNOTSUPP;
}

#endif  /* PY_HAVE_PERF_TRAMPOLINE */

_PyPerf_RemoteControl _PyPerf_remote = {
    .magic = _PyPerf_REMOTE_MAGIC,
    .version = _PyPerf_REMOTE_VERSION,
};

/* Set `request` back to 0 if it still holds `done`: a request a tool wrote
   while `done` was acted on stays for the next check. */
static void
clear_request(uint64_t done)
{
#if defined(__GNUC__) || defined(__clang__)
    __atomic_compare_exchange_n(&_PyPerf_remote.request, &done, 0, 0,
                                __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
#else
    if (_PyPerf_remote.request == done) {
        _PyPerf_remote.request = _PyPerf_REQUEST_NONE;
    }
#endif
}

/* Act on the tool's request (see pycore_perf.h); its outcome is left for
   the tool in _PyPerf_remote.log. */
void
_PyPerf_HandleRemoteRequest(PyThreadState *tstate)
{
    uint64_t request = _PyPerf_remote.request;
    if (request == _PyPerf_REQUEST_NONE) {
        return;
    }
    /* Say which word is being decided on, then act only if `request`
       still holds it.  A tool withdrawing its request writes 0, then reads
       `taken`: both sides store before they load, so either the tool sees
       its word here (and waits for the log), or the load below sees the 0
       and the request is never acted on. */
    _PyPerf_remote.taken = request;
    _Py_atomic_thread_fence(_Py_memory_order_seq_cst);
    if (_PyPerf_remote.request != request) {
        /* Withdrawn or replaced: a new request is taken at the next
           check. */
        _PyPerf_remote.taken = 0;
        return;
    }
    int error = switch_for_request(tstate, _PyPerf_REQUEST_KIND(request));
    uint32_t n = _PyPerf_remote.handled;
    volatile _PyPerf_RemoteOutcome *outcome =
        &_PyPerf_remote.log[n % _PyPerf_REMOTE_LOG];
    outcome->request = request;
    outcome->active = _PyPerf_remote.active;
    outcome->error = error;
    /* The entry is whole before the count that shows it to tools. */
    _Py_atomic_thread_fence(_Py_memory_order_release);
    _PyPerf_remote.handled = n + 1;
    clear_request(request);
}
