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

import os
import sys

__all__ = ["activate", "deactivate", "is_active", "status", "REFUSED"]
__version__ = "1.0"

#: Why this interpreter cannot have the extension's trampolines (one
#: line), or None.
REFUSED = None
#: This interpreter has perf trampolines of its own.
BUILT_IN = hasattr(sys, "activate_stack_trampoline")
_ext = None         # the extension module, once loaded and checked
_environment_read = False

if sys.version_info[:2] != (3, 11) or sys.implementation.name != "cpython":
    REFUSED = ("perftramp311: needs CPython 3.11, this is %s %d.%d.%d"
               % (sys.implementation.name, *sys.version_info[:3]))
elif not sys.platform.startswith("linux"):
    REFUSED = "perftramp311: perf trampolines exist on Linux only"
elif not BUILT_IN:
    try:
        from . import _core
    except ImportError as exc:
        REFUSED = "perftramp311: cannot load its extension module: %s" % exc
    else:
        _differs = _core.check(lambda: None)
        if _differs is not None:
            REFUSED = ("perftramp311: built for other CPython 3.11 "
                       "internals than this one's (%s differs); rebuild it "
                       "for this interpreter" % _differs)
        else:
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


# The variables of the table above, in the order the interpreter reads
# them: the last one on decides.
SWITCHES = ("PYTHONPERFSUPPORT", "PYTHON_PERF_JIT_SUPPORT")


def _switched_on(name):
    """Whether the variable `name` is on, as the interpreter reads it: a
    nonzero integer; empty or unset is off, anything else off with a
    warning."""
    value = os.environ.get(name, "")
    if not value:
        return False
    try:
        # int() would take what the interpreter does not: "1 ", "1_0".
        if value != value.rstrip() or "_" in value:
            raise ValueError
        return int(value) != 0
    except ValueError:
        print("perftramp311: %s is not an integer; taken as 0" % name,
              file=sys.stderr)
        return False


def backend_from_environment():
    """The backend the variables switch on here (the table in this
    module's help), or None."""
    if BUILT_IN or sys.flags.ignore_environment:
        return None     # the interpreter reads them itself, or not at all
    on = [name for name in SWITCHES if _switched_on(name)]
    return "perf_jit" if on else None


def _from_environment():
    """The .pth hook: a failure is one line, never a stopped program.
    In a venv site reads the .pth twice (site.venv() and site.main()
    each add its site-packages): once is enough."""
    global _environment_read
    if _environment_read:
        return
    _environment_read = True
    backend = backend_from_environment()
    if backend is None:
        return
    try:
        activate(backend)
    except Exception as exc:
        print(exc if isinstance(exc, RefusedError) else
              "perftramp311: not switched on: %s" % exc, file=sys.stderr)


if _ext is not None:
    # A forked child has a pid of its own: it starts its own files,
    # holding the trampolines it inherited.
    os.register_at_fork(after_in_child=_ext.after_fork_child)
