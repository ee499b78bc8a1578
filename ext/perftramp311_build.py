"""The build backend of perftramp311 (PEP 517): the standard library only.

pip runs it in place (``pip install ./ext``) with nothing to install
first, so it needs no setuptools or wheel, and works offline:

    build_wheel()   compiles the C with the running interpreter's compiler
                    and flags (sysconfig), writes the wheel (a zip with a
                    RECORD, per the wheel format)
    build_sdist()   writes a standalone source tree, as a .tar.gz

The C is the patch's own (Python/perf_*.c, Python/asm_trampoline.S,
Include/internal/pycore_perf.h); only _perftramp311.c is the
extension's.  The operators' tools (Lib/perf_trampoline) are installed
beside it, with the flame graph template their reports fill in.  All are
taken from the repository around this directory or, in an unpacked
sdist, from the copies build_sdist() put in it:

    repository              sdist (standalone)
    ../Python/perf_*.c      shared/perf_*.c
    ../Include/internal/    shared/pycore_perf.h
    ../Lib/perf_trampoline  perf_trampoline/
    the template (below)    perf_trampoline/d3-flamegraph-base.html
    ../LICENSE              LICENSE

The template is third-party code, never in the repository: a tree built
there has a copy, and tools/fetch-flamegraph.sh keeps one in the user's
cache, checked against the SHA-256 in tools/lib.sh, as it is here.

Still needed: a C compiler and the interpreter's headers, its internal
ones included (Debian: python3.11-dev).
"""

import base64
import hashlib
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import time
import zipfile

NAME = "perftramp311"
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

SHARED_C = ["perf_trampoline.c", "perf_arena.c", "perf_name.c",
            "perf_stack.c", "perf_remote.c", "perf_map.c",
            "perf_jit_trampoline.c", "perf_files.c", "perf_unwind.c",
            "perf_gdb_jit.c", "asm_trampoline.S"]
SHARED_H = ["pycore_perf.h"]
STAGED_SHARED = "shared"
TOOLS = "perf_trampoline"
TEMPLATE = "d3-flamegraph-base.html"
# Read by site at startup: PYTHONPERFSUPPORT=1 switches on, in child
# processes too.  It goes to the root of site-packages.
PTH = f"{NAME}.pth"
# The package's files, relative to this directory; the sdist has these,
# this module and what is staged.
PACKAGE = sorted(f"{NAME}/{name}" for name in os.listdir(
    os.path.join(HERE, NAME)) if name.endswith(".py"))
# The C module is top-level, beside the package: the .pth imports it
# alone, without the package, to switch on at start-up.
MODULE = f"_{NAME}"
EXT_SOURCES = [f"{MODULE}.c", f"{MODULE}.map"]
SDIST_FILES = (["pyproject.toml", os.path.basename(__file__), PTH,
                "tests/test_perftramp311.py"] + PACKAGE + EXT_SOURCES)

DEFINES = ["Py_BUILD_CORE_MODULE", "PY_PERF_EXTENSION",
           "PY_HAVE_PERF_TRAMPOLINE", "PY_HAVE_PERF_JIT_TRAMPOLINE"]
# Hidden symbols, and a version script exporting only its PyInit: the
# shared files' internal names stay inside the .so.
COMPILE_FLAGS = ["-fvisibility=hidden", "-std=gnu11"]
SUMMARY = "Linux perf support (perf map, jitdump) for stock CPython 3.11.x"


def _say(text):
    print(f"{NAME}: {text}", file=sys.stderr, flush=True)


def _version():
    """perftramp311.__version__, read without importing the package."""
    with open(os.path.join(HERE, "perftramp311", "__init__.py"),
              encoding="utf-8") as f:
        found = re.search(r'^__version__ = "([^"]+)"$', f.read(), re.M)
    return found.group(1)


def _metadata():
    return (f"Metadata-Version: 2.1\nName: {NAME}\n"
            f"Version: {_version()}\nSummary: {SUMMARY}\n"
            f"License: PSF-2.0\nRequires-Python: ==3.11.*\n")


# ----------------------------------------------------------------------
# Sources: the repository's, or an sdist's staged copies

def _sources():
    """{name in the sdist: path} of the shared C, its header, the
    perf_trampoline package's modules and the license."""
    if os.path.exists(os.path.join(REPO, "Python", SHARED_C[-1])):
        c_dir = os.path.join(REPO, "Python")
        h_dir = os.path.join(REPO, "Include", "internal")
        tools = os.path.join(REPO, "Lib", TOOLS)
        found = {"LICENSE": os.path.join(REPO, "LICENSE")}
    elif os.path.exists(os.path.join(HERE, STAGED_SHARED, SHARED_C[-1])):
        c_dir = h_dir = os.path.join(HERE, STAGED_SHARED)
        tools = os.path.join(HERE, TOOLS)
        found = {"LICENSE": os.path.join(HERE, "LICENSE")}
    else:
        raise SystemExit(f"{NAME}: the shared C sources are in neither "
                         f"{REPO}/Python nor {HERE}/{STAGED_SHARED}: build "
                         f"from the repository's ext/ directory or from "
                         f"an sdist")
    found.update({f"{STAGED_SHARED}/{name}": os.path.join(c_dir, name)
                  for name in SHARED_C})
    found.update({f"{STAGED_SHARED}/{name}": os.path.join(h_dir, name)
                  for name in SHARED_H})
    for name in sorted(os.listdir(tools)):
        if name.endswith(".py"):
            found[f"{TOOLS}/{name}"] = os.path.join(tools, name)
    found[f"{TOOLS}/{TEMPLATE}"] = _template(tools)
    return found


def _lib_sh(name):
    """The value of `name`=... in the repository's tools/lib.sh."""
    with open(os.path.join(REPO, "tools", "lib.sh"), encoding="utf-8") as f:
        return re.search(rf"^{name}=(\S+)$", f.read(), re.M).group(1)


def _template(tools):
    """The path of the flame graph template: staged beside the tools (an
    sdist), or in the repository's tree or the user's cache, checked."""
    staged = os.path.join(tools, TEMPLATE)
    if tools == os.path.join(HERE, TOOLS):
        if os.path.exists(staged):
            return staged
        raise SystemExit(f"{NAME}: this sdist has no {TOOLS}/{TEMPLATE}")
    cache = (os.environ.get("PERF_TRAMPOLINE_CACHE")
             or os.path.join(os.environ.get("XDG_CACHE_HOME")
                             or os.path.expanduser("~/.cache"),
                             "perf-trampolines"))
    want = _lib_sh("FLAMEGRAPH_SHA256")
    for path in (staged, os.path.join(cache, "d3-flamegraph-base-%s.html"
                                      % _lib_sh("FLAMEGRAPH_VERSION"))):
        if (os.path.isfile(path)
                and hashlib.sha256(_read(path)).hexdigest() == want):
            return path
    raise SystemExit(f"{NAME}: the flame graph template is not in {cache}: "
                     f"fetch it once with tools/fetch-flamegraph.sh (npm), "
                     f"or make ext")


# ----------------------------------------------------------------------
# Compiling, as setuptools would: the interpreter's compiler and flags,
# CC and LDSHARED from the environment in their place, CPPFLAGS, CFLAGS
# and LDFLAGS from it added

def _config(name, extra=()):
    words = shlex.split(os.environ.get(name)
                        or sysconfig.get_config_var(name) or "")
    for added in extra:
        words += shlex.split(os.environ.get(added, ""))
    return words


def _run(args):
    _say(" ".join(shlex.quote(arg) for arg in args))
    proc = subprocess.run(args)
    if proc.returncode != 0:
        raise SystemExit(f"{NAME}: {args[0]} failed (exit "
                         f"{proc.returncode}); a C compiler and this "
                         f"Python's headers are needed (Debian: "
                         f"build-essential python3.11-dev)")


def _compile(sources, tmp):
    """Build the extension module in `tmp`; return its path."""
    shared = os.path.join(tmp, STAGED_SHARED)
    os.makedirs(shared)
    # The shared files are copied: the object files stay in `tmp`, and
    # only pycore_perf.h of the repository's headers is seen (the others
    # are the installed interpreter's).
    for name, path in sources.items():
        if name.startswith(STAGED_SHARED + "/"):
            shutil.copy2(path, os.path.join(tmp, name))
    include = sysconfig.get_path("include")
    includes = dict.fromkeys([shared, os.path.join(include, "internal"),
                              include, sysconfig.get_path("platinclude")])
    compile_args = (_config("CC", ["CPPFLAGS"]) + _config("CFLAGS")
                    + _config("CCSHARED") + COMPILE_FLAGS
                    + [f"-D{name}=1" for name in DEFINES]
                    + ["-I" + path for path in includes])
    objects = []
    c_files = [os.path.join(shared, name) for name in SHARED_C]
    c_files.append(os.path.join(HERE, EXT_SOURCES[0]))
    for path in c_files:
        obj = os.path.join(tmp, os.path.basename(path) + ".o")
        _run(compile_args + ["-c", path, "-o", obj])
        objects.append(obj)
    module = os.path.join(tmp, MODULE + sysconfig.get_config_var(
        "EXT_SUFFIX"))
    exports = os.path.join(HERE, EXT_SOURCES[1])
    _run(_config("LDSHARED", ["LDFLAGS"]) + objects
         + ["-Wl,--version-script=" + exports, "-o", module])
    return module


# ----------------------------------------------------------------------
# Archives

def _timestamp():
    """SOURCE_DATE_EPOCH if set (reproducible builds), else now."""
    return int(os.environ.get("SOURCE_DATE_EPOCH", time.time()))


def _tag():
    """The wheel's tag: this interpreter, its ABI, its platform."""
    version = "cp%d%d" % sys.version_info[:2]
    platform = re.sub(r"[^\w]", "_", sysconfig.get_platform())
    return f"{version}-{version}{sys.abiflags}-{platform}"


def _hash(data):
    digest = hashlib.sha256(data).digest()
    return "sha256=" + base64.urlsafe_b64encode(digest).decode().rstrip("=")


def _dist_info(tag):
    """{name: text} of the .dist-info directory, RECORD aside."""
    return {"METADATA": _metadata(),
            "WHEEL": (f"Wheel-Version: 1.0\nGenerator: "
                      f"{NAME}_build\nRoot-Is-Purelib: false\n"
                      f"Tag: {tag}\n"),
            "top_level.txt": f"{MODULE}\n{NAME}\n{TOOLS}\n"}


def _write_wheel(path, files, dist_info):
    """`files`: [(name in the wheel, bytes, mode)]; RECORD last."""
    when = time.gmtime(max(_timestamp(), 315532800))[:6]   # zip: >= 1980
    record = []
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        for name, data, mode in files:
            info = zipfile.ZipInfo(name, when)
            info.external_attr = (0o100000 | mode) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            wheel.writestr(info, data)
            record.append(f"{name},{_hash(data)},{len(data)}")
        record.append(f"{dist_info}/RECORD,,")
        info = zipfile.ZipInfo(f"{dist_info}/RECORD", when)
        info.external_attr = 0o100644 << 16
        wheel.writestr(info, "\n".join(record) + "\n",
                       zipfile.ZIP_DEFLATED)


def _read(path):
    with open(path, "rb") as f:
        return f.read()


# ----------------------------------------------------------------------
# The PEP 517 hooks

def get_requires_for_build_wheel(config_settings=None):
    return []


def get_requires_for_build_sdist(config_settings=None):
    return []


def prepare_metadata_for_build_wheel(metadata_directory,
                                     config_settings=None):
    dist_info = f"{NAME}-{_version()}.dist-info"
    os.makedirs(os.path.join(metadata_directory, dist_info))
    for name, text in _dist_info(_tag()).items():
        with open(os.path.join(metadata_directory, dist_info, name), "w",
                  encoding="utf-8") as f:
            f.write(text)
    return dist_info


def build_wheel(wheel_directory, config_settings=None,
                metadata_directory=None):
    sources = _sources()
    tag = _tag()
    dist_info = f"{NAME}-{_version()}.dist-info"
    with tempfile.TemporaryDirectory(prefix=f"{NAME}-build-") as tmp:
        module = _compile(sources, tmp)
        files = [(os.path.basename(module), _read(module), 0o755)]
    files += [(name, _read(os.path.join(HERE, name)), 0o644)
              for name in PACKAGE + [PTH]]
    files += [(name, _read(path), 0o644)
              for name, path in sorted(sources.items())
              if name.startswith(TOOLS + "/")]
    files += [(f"{dist_info}/{name}", text.encode(), 0o644)
              for name, text in _dist_info(tag).items()]
    files.append((f"{dist_info}/LICENSE", _read(sources["LICENSE"]), 0o644))
    wheel = f"{NAME}-{_version()}-{tag}.whl"
    _write_wheel(os.path.join(wheel_directory, wheel), files, dist_info)
    _say(f"wrote {wheel}")
    return wheel


def build_sdist(sdist_directory, config_settings=None):
    """A standalone source tree: the package, and the shared sources and
    perf_trampoline staged into it."""
    root = f"{NAME}-{_version()}"
    files = [(name, os.path.join(HERE, name)) for name in SDIST_FILES]
    files += sorted(_sources().items())
    when = _timestamp()

    def add(tar, name, data):
        info = tarfile.TarInfo(f"{root}/{name}")
        info.size = len(data)
        info.mtime = when
        info.mode = 0o644
        tar.addfile(info, io.BytesIO(data))

    sdist = root + ".tar.gz"
    with tarfile.open(os.path.join(sdist_directory, sdist), "w:gz",
                      format=tarfile.PAX_FORMAT) as tar:
        for name, path in files:
            add(tar, name, _read(path))
        add(tar, "PKG-INFO", _metadata().encode())
    _say(f"wrote {sdist}")
    return sdist
