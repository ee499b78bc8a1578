/*
 * An empty PEP 523 frame evaluation function, installed by importing this
 * module: what any such hook costs a stock 3.11, where installing one
 * stops the evaluator from running Python-to-Python calls inline (each
 * call is a C call through the hook).  perftramp311 pays that too, so
 * this is the floor under its costs.  bench/run_bench.py builds it for
 * the interpreter it measures, with that interpreter's compiler, flags
 * and headers; it is not shipped.
 */

#include "Python.h"

static PyObject *
forward(PyThreadState *tstate, struct _PyInterpreterFrame *frame,
        int throwflag)
{
    return _PyEval_EvalFrameDefault(tstate, frame, throwflag);
}

static struct PyModuleDef hook_module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "pep523_hook",
    .m_doc = "Importing it runs every frame through an empty hook.",
    .m_size = -1,
};

PyMODINIT_FUNC
PyInit_pep523_hook(void)
{
    PyObject *module = PyModule_Create(&hook_module);
    if (module != NULL) {
        _PyInterpreterState_SetEvalFrameFunc(PyInterpreterState_Get(),
                                             forward);
    }
    return module;
}
