"""Linux perf support for the CPython 3.11 you already run.

Python functions appear in perf's call stacks as py::<qualname>:<filename>
through a jitdump (/tmp/jit-PID.dump) with unwind tables, for
``perf record -k 1 --call-graph dwarf`` and ``perf inject --jit``:

    activate()      run every Python frame through its trampoline
    deactivate()    stop (trampolines already running finish normally)
    is_active()     whether frames run through trampolines now
    status()        what is switched on, and any other frame evaluator

Switched on without editing the program: ``python3.11 -m perftramp311
app.py``, or a variable (perftramp311.pth, child processes too).  What
each switches on, where it is a nonzero integer:

                            built-in feature    perftramp311
    PYTHONPERFSUPPORT       perf (the map)      perf_jit
    PYTHON_PERF_JIT_SUPPORT perf_jit            perf_jit

and perf_jit where both are.  Stock builds keep no frame pointers, so
the map's frames could not be walked there.  On an interpreter with perf
trampolines built in, the built-in feature stays in charge and reads
them itself.
"""

import sys

__all__ = ["activate", "deactivate", "is_active", "status", "REFUSED"]
__version__ = "1.0"

#: Why this interpreter cannot have the extension's trampolines (one
#: line), or None.
REFUSED = None
#: This interpreter has perf trampolines of its own.
BUILT_IN = hasattr(sys, "activate_stack_trampoline")
_ext = None         # the extension module, once loaded and checked

if sys.version_info[:2] != (3, 11) or sys.implementation.name != "cpython":
    REFUSED = ("perftramp311: needs CPython 3.11, this is %s %d.%d.%d"
               % (sys.implementation.name, *sys.version_info[:3]))
elif not sys.platform.startswith("linux"):
    REFUSED = "perftramp311: perf trampolines exist on Linux only"
elif not BUILT_IN:
    try:
        import _perftramp311 as _core
    except ImportError as exc:
        REFUSED = "perftramp311: cannot load its extension module: %s" % exc
    else:
        REFUSED = _core.refusal()
        if REFUSED is None:
            _ext = _core


class RefusedError(RuntimeError):
    """This interpreter cannot have the extension's trampolines."""


def _built_in_note():
    print("perftramp311: this Python has perf trampolines built in; "
          "using them (-X perf, PYTHONPERFSUPPORT)", file=sys.stderr)


def activate(backend="perf_jit"):
    """Switch perf trampolines on: 'perf_jit' (the default: a jitdump with
    unwind tables, for perf's DWARF unwinder) or 'perf' (a perf map,
    /tmp/perf-PID.map, which needs frame pointers to walk)."""
    if REFUSED is not None:
        raise RefusedError(REFUSED)
    if BUILT_IN:
        _built_in_note()
        sys.activate_stack_trampoline(backend)
        return
    _ext.activate(backend)


def deactivate():
    """Switch them off (frames already in a trampoline finish in it)."""
    if BUILT_IN:
        sys.deactivate_stack_trampoline()
    elif _ext is not None:
        _ext.deactivate()


def is_active():
    """True while Python frames run through perf trampolines: False after
    another frame evaluator (PEP 523) replaced ours."""
    if BUILT_IN:
        return sys.is_stack_trampoline_active()
    return _ext is not None and _ext.is_active()


def status():
    """One line: what is switched on, and any other frame evaluator."""
    if REFUSED is not None:
        return REFUSED
    if BUILT_IN:
        return ("built in: %s" % ("active" if is_active() else "inactive"))
    backend, active, other = _ext.status()
    if backend is None:
        text = "inactive"
    elif active:
        text = "active (%s)" % backend
    else:
        text = ("replaced: another frame evaluator was installed after "
                "activate(%r); Python functions are not named" % backend)
    if other is not None and active:
        text += "; chained: %s" % other
    elif other is not None:
        text += "; frame evaluator: %s" % other
    return text
