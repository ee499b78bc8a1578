/*
 * _perftramp311: perf trampolines for a stock CPython 3.11.x
 * ==========================================================
 *
 * The patched interpreter builds Python/perf_*.c and the template into
 * libpython; this module builds the same files against an installed
 * 3.11's headers (PY_PERF_EXTENSION) and stands in for the interpreter's
 * side of them: activation, from Python or from the environment at
 * start-up, the forked child's files, the checks below.  What a stock
 * interpreter lacks:
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
 * written: a mismatch is a refusal, in one line.
 *
 * The module is top-level so that perftramp311.pth can switch on at
 * start-up by importing it alone (the perftramp311 package is its API).
 */

#include "Python.h"
#include "pycore_code.h"          // _PyCodeObjectExtra
#include "pycore_frame.h"         // _PyInterpreterFrame
#include "pycore_initconfig.h"    // _Py_str_to_int()
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

/* Return NULL if every layout the core reads matches, else what differs.
   `func` runs once, and its code raises AssertionError (refusal()). */
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
    if (res != NULL || !PyErr_ExceptionMatches(PyExc_AssertionError)) {
        Py_XDECREF(res);
        PyErr_Clear();
        return "the frame evaluation hook";
    }
    PyErr_Clear();
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
       takes its own when activated; a process has 255, and this runs
       once: refusal()). */
    Py_ssize_t index = _PyEval_RequestCodeExtraIndex(NULL);
    if (index < 0) {
        return "a code object extra index (none is left)";
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

/* The one-line refusal if this build's layouts are not the running
   interpreter's, else NULL.  Checked once, with a function of its own:
   PyCode_NewEmpty's code raises AssertionError, and the probe only needs
   it entered.  If the check could not run: NULL, *error set and an
   exception. */
static const char *
refusal(int *error)
{
    static int checked;
    static char line[200];
    *error = 0;
    if (checked) {
        return line[0] != '\0' ? line : NULL;
    }
    PyObject *globals = PyDict_New();
    PyCodeObject *code = PyCode_NewEmpty("<perftramp311>", "probe", 0);
    PyObject *func = NULL;
    if (globals != NULL && code != NULL) {
        func = PyFunction_New((PyObject *)code, globals);
    }
    Py_XDECREF(globals);
    Py_XDECREF(code);
    if (func == NULL) {
        *error = 1;
        return NULL;
    }
    const char *differs = check_layouts(func);
    Py_DECREF(func);
    checked = 1;
    if (differs != NULL) {
        PyOS_snprintf(line, sizeof(line), "perftramp311: built for other "
                      "CPython 3.11 internals than this one's (%s differs); "
                      "rebuild it for this interpreter", differs);
        return line;
    }
    return NULL;
}

/* ----------------------------------------------------------------------
 * State
 */

/* The backend activate() last switched on in the main interpreter, or
   NULL: if the hook is no longer ours, someone replaced it. */
static const char *wanted;

static PyObject *
core_after_fork_child(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    _PyPerf_AfterForkChild(PyThreadState_Get());
    Py_RETURN_NONE;
}

static PyMethodDef after_fork_child_def = {
    "after_fork_child", core_after_fork_child, METH_NOARGS,
    "In a forked child: start its own files."
};

/* A forked child has a pid of its own: it starts its own files, holding
   the trampolines it inherited.  Registered on the first activation. */
static int
register_at_fork(void)
{
    static int registered;
    if (registered) {
        return 0;
    }
    PyObject *os = PyImport_ImportModule("os");
    if (os == NULL) {
        return -1;
    }
    PyObject *handler = PyCFunction_New(&after_fork_child_def, NULL);
    PyObject *args = PyTuple_New(0);
    PyObject *kwargs = Py_BuildValue("{sO}", "after_in_child", handler);
    PyObject *res = NULL;
    if (handler != NULL && args != NULL && kwargs != NULL) {
        PyObject *func = PyObject_GetAttrString(os, "register_at_fork");
        if (func != NULL) {
            res = PyObject_Call(func, args, kwargs);
            Py_DECREF(func);
        }
    }
    Py_DECREF(os);
    Py_XDECREF(handler);
    Py_XDECREF(args);
    Py_XDECREF(kwargs);
    if (res == NULL) {
        return -1;
    }
    Py_DECREF(res);
    registered = 1;
    return 0;
}

static int
activate(PyThreadState *tstate, const char *backend)
{
    if (!_Py_IsMainInterpreter(tstate->interp)) {
        PyErr_SetString(PyExc_RuntimeError,
                        "perftramp311 works in the main interpreter only");
        return -1;
    }
    if (register_at_fork() < 0 || _PyPerf_Activate(tstate, backend) < 0) {
        return -1;
    }
    wanted = strcmp(backend, "perf") == 0 ? "perf" : "perf_jit";
    return 0;
}

/* ----------------------------------------------------------------------
 * Switching on from the environment (perftramp311.pth)
 */

/* The backend PYTHONPERFSUPPORT and PYTHON_PERF_JIT_SUPPORT switch on, or
   NULL: read as the interpreter reads its PYTHON* variables (empty is
   unset, -E ignores them) and as one with perf trampolines built in
   reads these (a nonzero integer is on; anything else is off, with a
   warning).  Both mean the jitdump here: the table in perftramp311's
   help says why. */
static const char *
backend_from_environment(PyInterpreterState *interp)
{
    static const char *const names[] = {"PYTHONPERFSUPPORT",
                                        "PYTHON_PERF_JIT_SUPPORT"};
    if (!_PyInterpreterState_GetConfig(interp)->use_environment) {
        return NULL;
    }
    const char *backend = NULL;
    for (size_t i = 0; i < Py_ARRAY_LENGTH(names); i++) {
        const char *value = getenv(names[i]);
        int number;
        if (value == NULL || value[0] == '\0') {
            continue;
        }
        if (_Py_str_to_int(value, &number) < 0) {
            PySys_WriteStderr("perftramp311: %s is not an integer; "
                              "taken as 0\n", names[i]);
        }
        else if (number != 0) {
            backend = "perf_jit";
        }
    }
    return backend;
}

/* perftramp311.pth calls this at start-up when a variable is set.  A
   failure is one line on stderr, never an exception: site would print a
   traceback and skip the rest of the file.  In a venv site reads the .pth
   twice; only the first call, and only in the main interpreter, acts. */
static PyObject *
core_from_environment(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    static int done;
    PyThreadState *tstate = PyThreadState_Get();
    if (done || !_Py_IsMainInterpreter(tstate->interp)) {
        Py_RETURN_NONE;
    }
    done = 1;
    if (PySys_GetObject("activate_stack_trampoline") != NULL) {
        Py_RETURN_NONE;     /* built in: the interpreter reads them itself */
    }
    const char *backend = backend_from_environment(tstate->interp);
    if (backend == NULL) {
        Py_RETURN_NONE;
    }
    int error;
    const char *refused = refusal(&error);
    if (refused != NULL) {
        PySys_WriteStderr("%s\n", refused);
    }
    else if (error || activate(tstate, backend) < 0) {
        PyObject *type, *value, *tb;
        PyErr_Fetch(&type, &value, &tb);
        PyErr_NormalizeException(&type, &value, &tb);
        PySys_FormatStderr("perftramp311: not switched on: %S\n",
                           value != NULL ? value : Py_None);
        Py_XDECREF(type);
        Py_XDECREF(value);
        Py_XDECREF(tb);
    }
    Py_RETURN_NONE;
}

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
    if (activate(PyThreadState_Get(), backend) < 0) {
        return NULL;
    }
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
core_refusal(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    int error;
    const char *refused = refusal(&error);
    if (error) {
        return NULL;
    }
    if (refused != NULL) {
        return PyUnicode_FromString(refused);
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
    {"refusal", core_refusal, METH_NOARGS,
     "None if this build's layouts are the interpreter's, else a line "
     "saying what differs."},
    {"_from_environment", core_from_environment, METH_NOARGS,
     "Switch on as PYTHONPERFSUPPORT and PYTHON_PERF_JIT_SUPPORT say (for "
     "perftramp311.pth)."},
    {"_probe_address", core_probe_address, METH_NOARGS,
     "Address of a pass-through frame evaluation function (for tests)."},
    {NULL, NULL, 0, NULL}
};

static struct PyModuleDef core_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_perftramp311",
    .m_doc = "Perf trampolines for a stock CPython 3.11.x "
             "(use the perftramp311 package).",
    .m_size = -1,
    .m_methods = core_methods,
};

PyMODINIT_FUNC
PyInit__perftramp311(void)
{
    return PyModule_Create(&core_module);
}
