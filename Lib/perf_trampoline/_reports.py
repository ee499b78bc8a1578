"""The reports of a perf recording: flame graphs, collapsed stacks and a
Firefox Profiler profile, each a file that works offline.

write_reports(perf, out) writes them into out, beside its perf.data:

flamegraph.html
    Every sample's whole stack, the graph perf's own flamegraph report
    script (scripts/python/flamegraph.py) draws, on the same template:
    d3-flame-graph's, which is installed beside this module
    (tools/fetch-flamegraph.sh fetches it from the package's npm release
    and checks it).
flamegraph-python.html
    The same samples with the evaluator's frames folded away
    (fold_python()), drawn with the same template.
stacks.folded, stacks-python.folded
    Both views as collapsed stacks ("frame;frame;frame count", the root
    first), for flamegraph.pl, inferno or speedscope.
gecko.json
    perf's gecko report script, for the Firefox Profiler (perf 6.7 and
    later have it; with an older perf this one report is left out).

Both graphs are written here (fill_template()), not by perf's script,
which puts the names into the page's <script> as they are: a name the
profiled program chose, such as a file name holding "</script><img
onerror=...>", would run as script in whoever opens the page.  The
template writes names as text only (SVG <title>, labels, details line).

The stacks of both views come from `perf script -F comm,pid,tid,ip,
sym,dso`.  A Python function is a py:: frame: its trampoline, which perf
names from the interpreter's perf map (or, after perf inject --jit, from
the jitdump).  A call run inline in its caller's evaluator puts nothing
between the two Python functions; one that entered the evaluator again
(from C, say) leaves the caller's evaluator and the C glue of the call
there (_PyEval_EvalFrameDefault, _PyEval_Vector, _PyFunction_Vectorcall,
PyObject_Vectorcall, method_vectorcall, slot_tp_call, ...): those frames
are dropped when they belong to the interpreter, which is every image in which perf found
_PyEval_EvalFrameDefault (the executable, or libpython of a shared
build).  Frames of other images between two Python functions stay: an
extension module or a library calling back into Python is part of the
program's call tree.  Above the innermost Python function, its
evaluator's frame is dropped: a sample there is that function running
its own bytecode.  The C functions it calls stay, and so do the frames
below the outermost Python function (the interpreter's start-up, a
thread's bootstrap), so the graph reads as the program's call tree with
its C leaves.  The full view keeps every frame: where the interpreter
itself spends the time, and how each call was made.
"""

import json
import os
import re
import shutil
import stat
import subprocess
import tempfile

from perf_trampoline import _output

__all__ = ["write_reports", "fold_python", "cut_short", "ReportError"]

TEMPLATE = os.path.join(os.path.dirname(__file__), "d3-flamegraph-base.html")
# The template's placeholders, as perf's flamegraph.py fills them.
STACKS_PLACEHOLDER = "/** @flamegraph_json **/"
OPTIONS_PLACEHOLDER = "/** @options_json **/"
# In d3-flame-graph's template: read_template() checks that it read one.
TEMPLATE_MARK = '<meta name="template_version"'

DATA_NAME = "perf.data"
# perf's build-id cache, in the output directory (perf --buildid-dir),
# not in ~/.debug: after perf inject --jit, the only copy of the ELF
# files that describe the Python functions.
BUILDID_NAME = "debug"
EVALUATOR = "_PyEval_EvalFrameDefault"
PYTHON_PREFIX = "py::"
SCRIPT_FIELDS = "comm,pid,tid,ip,sym,dso"
# The image perf gives a function inlined in another (from debug info).
INLINED = "inlined"
# Frames perf script and perf report show of a stack: their default is
# the kernel's bound for frame-pointer walks, kernel.perf_event_max_stack
# (127), which would cut the whole stacks that DWARF unwinds (a
# docutils run under perftramp311 reaches 324).
MAX_STACK = 2048
# The outermost frame of a whole stack: a process's entry point (perf's
# unwinder may stop in the C library's part of it), or the system call
# that started a thread.
START_FRAMES = {"_start", "__libc_start_main", "__libc_start_main_impl",
                "__libc_start_call_main", "clone", "clone3", "__clone",
                "__clone3"}

# "python  1234/1234  " (a sample; with no call chain, its ip, symbol and
# image follow) and "\t    7f12 name (/path/of/image)" (a frame).  The
# name may hold spaces and parentheses: the image is the last group.
HEADER_RE = re.compile(r"^(.*\S)\s+(-?\d+)/(-?\d+)(?:\s+(.*))?$")
FRAME_RE = re.compile(r"^([0-9a-fA-F]+)\s+(.*?)(?: \(([^)]*)\))?$")


class ReportError(Exception):
    """A report cannot be written; the message says why."""


# ----------------------------------------------------------------------
# The Python view

def is_python_frame(name):
    return name.startswith(PYTHON_PREFIX)


def interpreter_images(stacks):
    """The images (DSOs) in which an evaluator frame appears in any of
    `stacks` (frame sequences of (name, image) pairs)."""
    return {image for stack in stacks for name, image in stack
            if name == EVALUATOR}


def fold_python(stack, interpreter):
    """`stack` ((name, image) pairs, root first) without the frames of
    the images in `interpreter` that lie between two Python frames, nor
    the evaluator frame of the innermost Python frame."""
    python = [i for i, (name, _) in enumerate(stack)
              if is_python_frame(name)]
    if not python:
        return tuple(stack)
    first, last = python[0], python[-1]
    leaf = stack[last + 1:last + 2]
    if leaf and leaf[0][0] == EVALUATOR and leaf[0][1] in interpreter:
        stack = stack[:last + 1] + stack[last + 2:]
    return tuple(frame for i, frame in enumerate(stack)
                 if i <= first or i >= last or is_python_frame(frame[0])
                 or frame[1] not in interpreter)


def cut_short(stacks):
    """(samples cut short, samples with user frames) of `stacks` (stack ->
    count) recorded with DWARF: perf copies a bounded part of the stack
    with each sample, and a stack whose outermost user frame is not where
    a process or thread starts was cut short there."""
    cut = total = 0
    for stack, count in stacks.items():
        frames = [frame for frame in stack[1:] if _libtype(frame[1]) == ""]
        if frames:
            total += count
            if frames[0][0] not in START_FRAMES:
                cut += count
    return cut, total


# ----------------------------------------------------------------------
# Reading perf script

def _process_frame(comm, pid):
    # As perf's flamegraph.py names the process, so both views match.
    if pid == 0:
        return (comm, "[kernel.kallsyms]")
    return (f"{comm} ({pid})", "")


def _parse_frame(text):
    """(address, (name, image)) of a frame line, or None."""
    match = FRAME_RE.match(text.strip())
    if match is None:
        return None
    address, name, image = match.groups()
    return address, (name.strip() or "[unknown]", image or "[unknown]")


def _inlined_images(frames):
    """`frames` ((address, (name, image)), innermost first) as (name,
    image) pairs, a function inlined in another given the image of the
    one it is inlined in: perf names it "(inlined)" and puts it before
    that one, at the same address."""
    found = []
    for i, (address, (name, image)) in enumerate(frames):
        if image == INLINED:
            image = next((later for at, (_, later) in frames[i + 1:]
                          if at == address and later != INLINED), image)
        found.append((name, image))
    return found


def parse_script(lines):
    """Count the stacks in the lines of `perf script -F comm,pid,tid,ip,
    sym,dso`: a dict of stack (root first, the process its first frame)
    -> samples."""
    stacks = {}
    process = None
    frames = []

    def finish():
        if process is not None and frames:
            stack = (process, *reversed(_inlined_images(frames)))
            stacks[stack] = stacks.get(stack, 0) + 1

    for line in lines:
        line = line.rstrip("\n")
        if not line.strip():
            continue
        if line[0] in " \t":
            frame = _parse_frame(line)
            if frame is not None and process is not None:
                frames.append(frame)
            continue
        finish()
        process, frames = None, []
        match = HEADER_RE.match(line)
        if match is None:
            continue                    # not a sample (a warning)
        comm, pid, _, rest = match.groups()
        process = _process_frame(comm.strip(), int(pid))
        if rest:                        # recorded without call chains
            frame = _parse_frame(rest)
            if frame is not None:
                frames.append(frame)
    finish()
    return stacks


# ----------------------------------------------------------------------
# Writing

def collapsed(stacks):
    """The text of `stacks` (stack -> count) as collapsed stacks, sorted.
    The format has no escape for ';', so a name's own becomes ':'."""
    lines = sorted(";".join(name.replace(";", ":") for name, _ in stack)
                   + f" {count}\n" for stack, count in stacks.items())
    return "".join(lines)


def _libtype(image):
    if image == "[kernel.kallsyms]" or image.endswith("/vmlinux"):
        return "kernel"
    return ""


def flame_tree(stacks):
    """`stacks` as the tree perf's flamegraph.py gives the template:
    nodes {"n": name, "l": "root"|"kernel"|"", "v": self samples,
    "c": children}."""
    root = {"n": "all", "l": "root", "v": 0, "c": []}
    index = {}                  # (id of parent node, name) -> node
    for stack, count in stacks.items():
        node = root
        for name, image in stack:
            key = (id(node), name)
            child = index.get(key)
            if child is None:
                child = {"n": name, "l": _libtype(image), "v": 0, "c": []}
                node["c"].append(child)
                index[key] = child
            node = child
        node["v"] += count
    return root


def _script_json(value):
    # Inside <script>: no "</script>" (or "<!--") can end it early.
    return json.dumps(value).replace("<", "\\u003c")


def fill_template(template, tree, context):
    """The template's text with the flame graph of `tree` and `context`
    (the text its Context button shows) in place of its placeholders."""
    values = {
        STACKS_PLACEHOLDER: _script_json(tree),
        OPTIONS_PLACEHOLDER: _script_json({"colorscheme": "blue-green",
                                           "context": context}),
    }
    pattern = "|".join(re.escape(key) for key in values)
    return re.sub(pattern, lambda match: values[match.group()], template)


def read_template():
    """The text of the d3-flame-graph template; ReportError if it is
    missing or not the template."""
    try:
        with open(TEMPLATE, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise ReportError(
            f"the flame graph template is missing ({exc.strerror}: "
            f"{TEMPLATE}); it is installed with the interpreter "
            f"(tools/fetch-flamegraph.sh fetches it)") from None
    if STACKS_PLACEHOLDER not in text or TEMPLATE_MARK not in text:
        raise ReportError(f"{TEMPLATE} is not d3-flame-graph's template")
    return text


# ----------------------------------------------------------------------
# Running perf

def perf_command(perf, out):
    """The start of a perf command line run in the output directory `out`
    (out.as_cwd()): its build-id cache is the directory's.  A relative
    path would do for reading, but perf adds nothing to a cache so named."""
    return [perf, "--buildid-dir", f"/proc/self/fd/{out.fd}/{BUILDID_NAME}"]


class _Perf:
    """The perf executable, its report scripts, and the recording
    perf.data in an output directory, in which it runs (it writes there
    by name)."""

    def __init__(self, perf, out):
        path = shutil.which(perf)
        if path is None:
            raise ReportError(f"{perf}: no such executable")
        self.path = os.path.abspath(path)
        self.command = perf_command(self.path, out)
        try:
            is_file = stat.S_ISREG(out.lstat(DATA_NAME).st_mode)
        except FileNotFoundError:
            is_file = False
        if not is_file:
            raise ReportError(f"{out.join(DATA_NAME)}: no such file")
        self.out = out
        env = {name: value for name, value in os.environ.items()
               # perf's scripts run on perf's own Python: settings meant
               # for ours could break it.
               if not name.startswith("PYTHON")}
        env["PATH"] = os.pathsep.join([os.path.dirname(self.path),
                                       env.get("PATH", os.defpath)])
        self.env = env
        self.exec_path = self._exec_path()
        env["PERF_EXEC_PATH"] = self.exec_path

    def _exec_path(self):
        # A perf unpacked elsewhere than its build's prefix (tools/
        # install-deps.sh jit puts one under build/perf/) has its scripts
        # beside it; --exec-path names those of the prefix.
        beside = os.path.join(os.path.dirname(os.path.dirname(
            os.path.realpath(self.path))), "lib", "perf-core")
        if os.path.isdir(os.path.join(beside, "scripts", "python")):
            return beside
        return self.run(["--exec-path"], "perf --exec-path").strip()

    def script_path(self, name):
        """The path of perf's report script `name`, or None."""
        path = os.path.join(self.exec_path, "scripts", "python", name)
        return path if os.path.isfile(path) else None

    def version(self):
        return self.run(["version"], "perf version").strip()

    def run(self, args, what):
        """perf's standard output for `args`; ReportError with the end
        of what it said if it fails.  No input: a script that asks a
        question gets end of file, not a wait."""
        try:
            proc = subprocess.run(
                [*self.command, *args], env=self.env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                errors="replace", **self.out.as_cwd())
        except OSError as exc:
            raise ReportError(f"{what}: {exc}") from None
        if proc.returncode != 0:
            said = " | ".join((proc.stderr + proc.stdout).split("\n")[-6:])
            raise ReportError(f"{what} failed (exit {proc.returncode}): "
                              f"{said.strip(' |') or 'no output'}")
        return proc.stdout

    def run_script(self, name, args, output):
        """Run perf's report script `name` with `args`, which make it
        write the file `output` in the directory.  A script may fail and
        still exit 0 (perf only prints the exception): the file it wrote
        is the proof."""
        path = self.script_path(name)
        self.out.unlink(output)
        self.run(["script", "-i", DATA_NAME, "--max-stack", str(MAX_STACK),
                  "-s", path, "--", *args],
                 f"perf script -s {name}")
        if not self.out.exists(output):
            raise ReportError(f"perf script -s {name} wrote no "
                              f"{self.out.join(output)}")

    def header(self):
        """What perf report --header-only says of the recording (or why
        it cannot): the Context the flame graphs show."""
        try:
            return self.run(["report", "-i", DATA_NAME, "--header-only"],
                            "perf report --header-only")
        except ReportError as exc:
            return str(exc)             # only shown behind a button

    def stacks(self):
        """The recording's stacks, counted (parse_script())."""
        # perf's warnings go to a file: a pipe nobody reads while the
        # stacks are read would stop perf once full.
        with tempfile.TemporaryFile("w+", errors="replace") as err:
            try:
                proc = subprocess.Popen(
                    [*self.command, "script", "-i", DATA_NAME,
                     "--max-stack", str(MAX_STACK), "-F", SCRIPT_FIELDS],
                    env=self.env,
                    stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=err, text=True, errors="replace",
                    **self.out.as_cwd())
            except OSError as exc:
                raise ReportError(f"perf script: {exc}") from None
            with proc:
                stacks = parse_script(proc.stdout)
            if proc.returncode != 0:
                err.seek(0)
                error = err.read().strip()[-300:]
                raise ReportError(f"perf script failed (exit "
                                  f"{proc.returncode}): "
                                  f"{error or 'no output'}")
        return stacks


def write_reports(perf, out, summary=None):
    """Write the reports of the recording perf.data in `out` (already
    through perf inject --jit for a jitdump) into `out`, with the perf
    executable `perf`.  `out` is an _output.OutputDir, or the path of
    one to open here (and make if missing).  Returns [(description,
    path)], one per report; path is None for a report this perf cannot
    write, and the description says why.  A dict `summary` gets the
    recording's "stacks" (stack -> samples).  Raises
    ReportError(message)."""
    summary = {} if summary is None else summary
    try:
        if isinstance(out, str):
            with _output.OutputDir.open(out) as opened:
                return _write_reports(perf, opened, summary)
        return _write_reports(perf, out, summary)
    except _output.UnsafeError as exc:
        raise ReportError(str(exc)) from None
    except OSError as exc:
        # A file or directory of the reports cannot be written (a full
        # disk, a directory where a report goes, ...).
        where = f"{exc.filename}: " if exc.filename else ""
        raise ReportError(f"{where}{exc.strerror or exc}") from None


def _write_flame_graph(out, name, template, stacks, context):
    out.write_text(name, fill_template(template, flame_tree(stacks),
                                       context))


def _write_reports(perf, out, summary):
    template = read_template()
    perf = _Perf(perf, out)
    stacks = summary["stacks"] = perf.stacks()
    interpreter = interpreter_images(stacks)
    python = {}
    for stack, count in stacks.items():
        folded = fold_python(stack, interpreter)
        python[folded] = python.get(folded, 0) + count
    has_python = any(is_python_frame(name) for stack in stacks
                     for name, _ in stack)
    header = perf.header()

    reports = []
    _write_flame_graph(out, "flamegraph.html", template, stacks, header)
    reports.append(("Flame graph (every frame)",
                    out.join("flamegraph.html")))
    _write_flame_graph(out, "flamegraph-python.html", template, python,
                       "Python view: the interpreter's frames between "
                       "two Python functions (py::), and the evaluator "
                       "above the innermost one, are folded away.\n\n"
                       + header)
    description = "Flame graph, Python view (evaluator frames folded)"
    if not has_python:
        description += (": no py:: frames in the samples (was the "
                        "program run with -X perf?)")
    reports.append((description, out.join("flamegraph-python.html")))
    for name, description, view in (
            ("stacks.folded", "Collapsed stacks", stacks),
            ("stacks-python.folded", "Collapsed stacks, Python view",
             python)):
        out.write_text(name, collapsed(view))
        reports.append((description, out.join(name)))

    if perf.script_path("gecko.py") is None:
        reports.append((f"Firefox Profiler: not written: "
                        f"{perf.version()} has no gecko report script "
                        f"(perf 6.7 and later have it)", None))
    else:
        # --save-only: write the file; without it the script serves it
        # on a local port and opens a browser.
        perf.run_script("gecko.py", ["--save-only", "gecko.json"],
                        "gecko.json")
        reports.append(("Firefox Profiler (open it at "
                        "profiler.firefox.com)", out.join("gecko.json")))
    return reports
