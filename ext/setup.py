"""Build perftramp311: perf trampolines for a stock CPython 3.11.x.

The C is the patch's own (Python/perf_*.c, Python/asm_trampoline.S,
Include/internal/pycore_perf.h), compiled against the installed
interpreter's headers; only perftramp311/_core.c is the extension's.  The
shared files are taken from the repository (../Python) or, in an unpacked
source distribution, from shared/ (make ext-stage puts them there).
"""

import os
import shutil
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_C = [
    "perf_trampoline.c", "perf_map.c", "perf_jit_trampoline.c",
    "perf_files.c", "perf_unwind.c", "perf_gdb_jit.c",
]
TEMPLATE = "asm_trampoline.S"
HEADER = "pycore_perf.h"


def shared_dirs():
    """(directory of the .c and .S files, directory of the header)."""
    repo = os.path.dirname(HERE)
    if os.path.exists(os.path.join(repo, "Python", TEMPLATE)):
        return (os.path.join(repo, "Python"),
                os.path.join(repo, "Include", "internal"))
    staged = os.path.join(HERE, "shared")
    if os.path.exists(os.path.join(staged, TEMPLATE)):
        return staged, staged
    sys.exit("perftramp311: the shared C sources are missing: build from "
             "the repository's ext/ directory, or run 'make ext-stage' first")


class BuildExt(build_ext):
    """Compiles the shared sources from a copy in the build directory
    (their object files stay there), and the template's .S file, which
    setuptools does not know as a source: gcc preprocesses and assembles
    it like any other source."""

    def build_extensions(self):
        if ".S" not in self.compiler.src_extensions:
            self.compiler.src_extensions.append(".S")
        src, inc = shared_dirs()
        copy = os.path.join(self.build_temp, "shared")
        os.makedirs(copy, exist_ok=True)
        for name in SHARED_C + [TEMPLATE]:
            shutil.copy2(os.path.join(src, name), copy)
        shutil.copy2(os.path.join(inc, HEADER), copy)
        for ext in self.extensions:
            ext.sources = [os.path.join(copy, name)
                           for name in SHARED_C + [TEMPLATE]] + ext.sources
            ext.include_dirs.insert(0, copy)
        super().build_extensions()


class BuildPy(build_py):
    """Puts perftramp311.pth next to the package: site-packages runs it at
    startup (PYTHONPERFSUPPORT=1, also in child processes)."""

    def run(self):
        super().run()
        self.copy_file(os.path.join(HERE, "perftramp311.pth"),
                       os.path.join(self.build_lib, "perftramp311.pth"))


internal = os.path.join(sysconfig.get_path("include"), "internal")
core = Extension(
    "perftramp311._core",
    sources=["perftramp311/_core.c"],
    include_dirs=[internal],
    define_macros=[
        ("Py_BUILD_CORE_MODULE", "1"),
        ("PY_PERF_EXTENSION", "1"),
        ("PY_HAVE_PERF_TRAMPOLINE", "1"),
        ("PY_HAVE_PERF_JIT_TRAMPOLINE", "1"),
    ],
    extra_compile_args=["-fvisibility=hidden", "-std=gnu11"],
    # Only the module's init function is exported: the shared files'
    # internal names stay inside the .so.
    extra_link_args=["-Wl,--version-script=" +
                     os.path.join(HERE, "perftramp311", "exports.map")],
)

setup(
    name="perftramp311",
    version="1.0",
    description="Linux perf support (perf map, jitdump) for stock "
                "CPython 3.11.x",
    packages=["perftramp311"],
    ext_modules=[core],
    cmdclass={"build_ext": BuildExt, "build_py": BuildPy},
    python_requires="==3.11.*",
)
