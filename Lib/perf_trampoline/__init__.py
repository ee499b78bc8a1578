"""Switch perf trampolines on or off in a Python process that is running:
the public API.  The command line is perf_trampoline.__main__

    python3.11 -I -m perf_trampoline --help

and the modules beside this one are its layers, lowest first: _elf and
_procfs (readers of ELF images and /proc), _attach (the attach protocol),
_namespaces (container maps), _output and _reports (reports), _record
(recording), and __main__; each imports only those below it.
"""

from perf_trampoline._attach import attach, detach, status
from perf_trampoline._elf import RemoteError

__all__ = ["attach", "detach", "status", "RemoteError"]
