/*
 * perftramp311._core: perf trampolines for a stock CPython 3.11.x
 * ================================================================
 *
 * The patched interpreter builds Python/perf_*.c and the template into
 * libpython; this module builds the same files against an installed
 * 3.11's headers (PY_PERF_EXTENSION) and stands in for the interpreter's
 * side of them: activation from Python, the forked child's files, the
 * checks below.  What a stock interpreter lacks:
 *
 *   - the CALL fast path: every Python call goes through the PEP 523 hook,
 *     as while any hook is installed, so each one is a C call; the core's
 *     hook refuses frames with RecursionError where the C stack runs out;
 *   - frame pointers: perf walks the stack with DWARF (perf record
 *     --call-graph dwarf), so the default backend is the jitdump, whose
 *     records carry the trampolines' unwind tables (perf inject --jit);
 *   - the eval-frame setter's chaining: a function installed before us is
 *     chained, one installed after us replaces ours, which status() says.
 *
 * The core reads interpreter structures directly (the hook field, the
 * interpreter id, the code object's extras, name and file, the frame's
 * code).  Those layouts come from the headers this was built with, so
 * they are checked against the running interpreter before anything is
 * written: a mismatch refuses to import, in one line.
 */

#include "Python.h"
#include "pycore_code.h"          // _PyCodeObjectExtra
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_interp.h"        // PyInterpreterState.eval_frame
#include "pycore_perf.h"
#include "pycore_pystate.h"       // _PyInterpreterState_Main()

#include <dlfcn.h>                // dladdr()

#if PY_VERSION_HEX < 0x030B0000 || PY_VERSION_HEX >= 0x030C0000
#  error "perftramp311 is for CPython 3.11"
#endif

/* ----------------------------------------------------------------------
 * Checks: the layouts of this build against the running interpreter
 */

static PyCodeObject *probe_code;      /* set by probe_eval */

static PyObject *
probe_eval(PyThreadState *tstate, _PyInterpreterFrame *frame, int throwflag)
{
    if (probe_code == NULL) {
        probe_code = frame->f_code;
    }
    return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
}

/* Return NULL if every layout the core reads matches, else what differs. */
static const char *
check_layouts(PyObject *func)
{
    PyThreadState *tstate = PyThreadState_Get();
    PyInterpreterState *interp = tstate->interp;
    if ((Py_Version >> 16) != (PY_VERSION_HEX >> 16)) {
        return "the interpreter's version";
    }
    if (interp->id != PyInterpreterState_GetID(interp)) {
        return "PyInterpreterState.id";
    }
    if (_PyInterpreterState_Main() != PyInterpreterState_Main()) {
        return "the runtime's main interpreter";
    }
    /* The hook field: set through the API, read here. */
    _PyFrameEvalFunction saved = interp->eval_frame;
    _PyInterpreterState_SetEvalFrameFunc(interp, probe_eval);
    int hook_ok = (interp->eval_frame == probe_eval);
    /* The frame's code: what the probe saw run. */
    probe_code = NULL;
    PyObject *res = NULL;
    if (hook_ok) {
        res = PyObject_CallNoArgs(func);
    }
    interp->eval_frame = saved;
    if (!hook_ok) {
        return "PyInterpreterState.eval_frame";
    }
    if (res == NULL) {
        PyErr_Clear();
        return "the frame evaluation hook";
    }
    Py_DECREF(res);
    PyCodeObject *co = (PyCodeObject *)PyFunction_GetCode(func);
    if (probe_code != co) {
        return "_PyInterpreterFrame.f_code";
    }
    /* The code object's name, file and extras. */
    PyObject *qualname = PyObject_GetAttrString((PyObject *)co,
                                                "co_qualname");
    PyObject *filename = PyObject_GetAttrString((PyObject *)co,
                                                "co_filename");
    Py_XDECREF(qualname);
    Py_XDECREF(filename);
    if (qualname == NULL || filename == NULL) {
        PyErr_Clear();
        return "PyCodeObject attributes";
    }
    if (qualname != co->co_qualname || filename != co->co_filename) {
        return "PyCodeObject.co_qualname/co_filename";
    }
    /* co_extra with the core's lookup: an index of our own (the core
       takes its own when activated; a process has 255). */
    static Py_ssize_t index = -1;
    if (index < 0) {
        index = _PyEval_RequestCodeExtraIndex(NULL);
        if (index < 0) {
            return "a code object extra index (none is left)";
        }
    }
    if (_PyCode_SetExtra((PyObject *)co, index, (void *)co) < 0) {
        PyErr_Clear();
        return "_PyCode_SetExtra";
    }
    void *got = NULL;
    int looked = _PyCode_GetExtra((PyObject *)co, index, &got);
    void *ours = (void *)_PyPerf_Lookup(co, index);
    (void)_PyCode_SetExtra((PyObject *)co, index, NULL);
    if (looked < 0 || got != (void *)co || ours != (void *)co) {
        PyErr_Clear();
        return "PyCodeObject.co_extra";
    }
    return NULL;
}

/* ----------------------------------------------------------------------
 * State
 */

/* The backend activate() last switched on in the main interpreter, or
   NULL: if the hook is no longer ours, someone replaced it. */
static const char *wanted;

/* ----------------------------------------------------------------------
 * Module functions
 */

static PyObject *
core_activate(PyObject *module, PyObject *args)
{
    const char *backend = "perf_jit";
    if (!PyArg_ParseTuple(args, "|s:activate", &backend)) {
        return NULL;
    }
    PyThreadState *tstate = PyThreadState_Get();
    if (!_Py_IsMainInterpreter(tstate->interp)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "perftramp311 works in the main interpreter only");
        return NULL;
    }
    if (_PyPerf_Activate(tstate, backend) < 0) {
        return NULL;
    }
    wanted = strcmp(backend, "perf") == 0 ? "perf" : "perf_jit";
    Py_RETURN_NONE;
}

static PyObject *
core_deactivate(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyThreadState *tstate = PyThreadState_Get();
    if (_Py_IsMainInterpreter(tstate->interp)) {
        (void)_PyPerf_Deactivate(tstate);
        wanted = NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *
core_is_active(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyBool_FromLong(_PyPerf_IsActive(PyThreadState_Get()));
}

/* The name of the function at `addr`, or its address. */
static PyObject *
function_name(void *addr)
{
    Dl_info info;
    if (dladdr(addr, &info) != 0 && info.dli_sname != NULL
        && info.dli_saddr == addr)
    {
        return PyUnicode_FromString(info.dli_sname);
    }
    return PyUnicode_FromFormat("%p", addr);
}

/* (backend asked for or None, hook installed, the other evaluator's name
   or None): the other one is chained while ours is installed, and has
   replaced ours if ours is not. */
static PyObject *
core_status(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    PyThreadState *tstate = PyThreadState_Get();
    PyInterpreterState *interp = tstate->interp;
    int active = _PyPerf_IsActive(tstate);
    _PyFrameEvalFunction other = _PyPerf_OtherEvalFrame(interp);
    PyObject *other_name;
    if (other == NULL || other == _PyEval_EvalFrameDefault) {
        other_name = Py_NewRef(Py_None);
    }
    else {
        other_name = function_name((void *)other);
        if (other_name == NULL) {
            return NULL;
        }
    }
    return Py_BuildValue("(zON)", wanted, active ? Py_True : Py_False,
                         other_name);
}

static PyObject *
core_after_fork_child(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    _PyPerf_AfterForkChild(PyThreadState_Get());
    Py_RETURN_NONE;
}

static PyObject *
core_check(PyObject *module, PyObject *func)
{
    if (!PyFunction_Check(func)) {
        PyErr_SetString(PyExc_TypeError, "a Python function is needed");
        return NULL;
    }
    const char *differs = check_layouts(func);
    if (differs != NULL) {
        return PyUnicode_FromString(differs);
    }
    Py_RETURN_NONE;
}

/* The probe above is an ordinary pass-through PEP 523 function: the tests
   install it with ctypes as "another evaluator" (chained before, replacing
   ours after activate()). */
static PyObject *
core_probe_address(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromVoidPtr((void *)probe_eval);
}

static PyMethodDef core_methods[] = {
    {"activate", core_activate, METH_VARARGS,
     "activate(backend='perf_jit')\n--\n\n"
     "Run Python frames through perf trampolines ('perf_jit': the jitdump "
     "/tmp/jit-PID.dump; 'perf': the map /tmp/perf-PID.map)."},
    {"deactivate", core_deactivate, METH_NOARGS,
     "Stop making and entering trampolines."},
    {"is_active", core_is_active, METH_NOARGS,
     "True while frames run through trampolines."},
    {"status", core_status, METH_NOARGS,
     "(backend activated or None, hook installed, other evaluator or None)"},
    {"after_fork_child", core_after_fork_child, METH_NOARGS,
     "In a forked child: start its own files."},
    {"check", core_check, METH_O,
     "check(func): None if the interpreter's layouts match this build "
     "(func is run once), else what differs."},
    {"_probe_address", core_probe_address, METH_NOARGS,
     "Address of a pass-through frame evaluation function (for tests)."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "perftramp311._core",
    .m_doc = "Perf trampolines for a stock CPython 3.11.x "
             "(use the perftramp311 package).",
    .m_size = -1,
    .m_methods = core_methods,
};

PyMODINIT_FUNC
PyInit__core(void)
{
    return PyModule_Create(&core_module);
}
