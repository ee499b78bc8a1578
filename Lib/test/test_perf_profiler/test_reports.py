"""perf_trampoline._reports: the flame graphs, collapsed stacks and
Firefox Profiler file of a recording.

The rule that folds the interpreter's frames away is tested on made-up
stacks; the reports of a real recording are opened in headless Chromium,
offline, and the boxes it draws are checked.
"""

import html.parser
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import unittest
import unittest.mock
from typing import NamedTuple

from perf_trampoline import _output, _reports
from test.test_perf_profiler.util import (
    CHAIN_SOURCE, INLINED_CALLS, TIMEOUT, ProfilerFiles, clean_env,
    needs_host, perf_record_works, record_samples, skip_environment,
    tmp_files_lock, write_script)

EXE = "/opt/python/bin/python3.11"
LIBC = "/usr/lib/x86_64-linux-gnu/libc.so.6"
EXTENSION = "/opt/python/lib/python3.11/lib-dynload/_json.so"
MAP = "/tmp/perf-42.map"
EVAL = "_PyEval_EvalFrameDefault"


def frames(*names, image=EXE):
    """(name, image) pairs: py:: names in the perf map, "name@image" in
    that image, the others in `image`."""
    result = []
    for name in names:
        if name.startswith("py::"):
            result.append((name, MAP))
        else:
            name, _, where = name.partition("@")
            result.append((name, where or image))
    return tuple(result)


def names(stack):
    return [name for name, _ in stack]


# perf --exec-path, and perf script with 1 MB of warnings first.
FAKE_PERF = """\
    #!/bin/sh
    [ "$1" = --buildid-dir ] && shift 2
    case "$1" in
    --exec-path) dirname "$0" ;;
    script)
        head -c 1000000 /dev/zero | tr '\\0' w | timeout 20 cat >&2 || exit 3
        printf 'python  42/42  \\n\\t    1000 py::f:a.py (/tmp/perf-42.map)\\n'
        ;;
    esac
    """


class FoldTests(unittest.TestCase):
    """fold_python() on made-up stacks, root first."""

    def fold(self, *stack, interpreter=(EXE,)):
        return names(_reports.fold_python(frames(*stack), set(interpreter)))

    def test_glue_between_python_frames_is_folded(self):
        self.assertEqual(
            self.fold("Py_BytesMain", "PyEval_EvalCode", "py::main:a.py",
                      EVAL, "py::serve:a.py", EVAL, "_PyEval_Vector",
                      "_PyFunction_Vectorcall", "PyObject_Vectorcall",
                      "method_vectorcall", "slot_tp_call",
                      "py::Handler.__call__:a.py", EVAL, "builtin_round",
                      "_Py_dg_dtoa"),
            ["Py_BytesMain", "PyEval_EvalCode", "py::main:a.py",
             "py::serve:a.py", "py::Handler.__call__:a.py",
             "builtin_round", "_Py_dg_dtoa"])

    def test_other_images_between_python_frames_stay(self):
        # An extension module or a library calling back into Python.
        self.assertEqual(
            self.fold("py::load:a.py", EVAL, f"scanner_call@{EXTENSION}",
                      "PyObject_Call", "py::hook:a.py", EVAL,
                      f"qsort@{LIBC}", "py::key:a.py", EVAL),
            ["py::load:a.py", "scanner_call", "py::hook:a.py", "qsort",
             "py::key:a.py"])

    def test_libpython_of_a_shared_build(self):
        libpython = "/opt/python/lib/libpython3.11.so.1.0"
        stack = frames("main", f"Py_BytesMain@{libpython}", "py::f:a.py",
                       f"{EVAL}@{libpython}", "py::g:a.py",
                       f"{EVAL}@{libpython}")
        interpreter = _reports.interpreter_images([stack])
        self.assertEqual(interpreter, {libpython})
        self.assertEqual(names(_reports.fold_python(stack, interpreter)),
                         ["main", "Py_BytesMain", "py::f:a.py",
                          "py::g:a.py"])

    def test_unknown_frames(self):
        # In the interpreter's image: glue; in no image: kept.
        self.assertEqual(
            self.fold("py::f:a.py", "[unknown]", "[unknown]@[unknown]",
                      "py::g:a.py"),
            ["py::f:a.py", "[unknown]", "py::g:a.py"])

    def test_innermost_evaluator_is_folded(self):
        # A sample in the evaluator is the function's own bytecode; the
        # C functions it calls stay.
        self.assertEqual(
            self.fold("Py_BytesMain", "py::f:a.py", EVAL, "PyObject_Call",
                      EVAL),
            ["Py_BytesMain", "py::f:a.py", "PyObject_Call", EVAL])
        self.assertEqual(self.fold("py::f:a.py", EVAL), ["py::f:a.py"])
        # Only the evaluator right above it, only the interpreter's.
        for stack in [("py::f:a.py", "builtin_round", EVAL),
                      ("py::f:a.py", f"{EVAL}@{LIBC}")]:
            with self.subTest(stack=stack):
                self.assertEqual(self.fold(*stack),
                                 [name.partition("@")[0] for name in stack])

    def test_no_python_frames(self):
        for stack in [(), ("main", "Py_BytesMain"),
                      ("Py_BytesMain", EVAL, "PyObject_Call")]:
            with self.subTest(stack=stack):
                self.assertEqual(self.fold(*stack), list(stack))

    def test_no_interpreter_found(self):
        stack = ("py::f:a.py", EVAL, "py::g:a.py", EVAL)
        self.assertEqual(self.fold(*stack, interpreter=()), list(stack))


class ParseTests(unittest.TestCase):
    """Reading `perf script -F comm,pid,tid,ip,sym,dso`, writing the
    collapsed stacks and the page."""

    SCRIPT = (
        "python  1234/1234  \n"
        "\t    7f00aa _Py_dg_dtoa (/opt/python/bin/python3.11)\n"
        "\t    7f1000 py::f:/src/my app (2)/a.py (/tmp/perf-1234.map)\n"
        "\t         0 [unknown] ([unknown])\n"
        "\n"
        "my worker 7  1235/1236  \n"
        "\t    7f00aa _Py_dg_dtoa (/opt/python/bin/python3.11)\n"
        "\t    7f1000 py::f:/src/my app (2)/a.py (/tmp/perf-1234.map)\n"
        "\t         0 [unknown] ([unknown])\n"
        "\n"
        "swapper     0/0     ffffffff81 default_idle ([kernel.kallsyms])\n"
        "a warning perf printed\n"
        "python  1234/1234  \n"
        "\t    7f00aa _Py_dg_dtoa (/opt/python/bin/python3.11)\n"
        "\t    7f1000 py::f:/src/my app (2)/a.py (/tmp/perf-1234.map)\n"
        "\t         0 [unknown] ([unknown])\n")

    def test_parse_script(self):
        stacks = _reports.parse_script(self.SCRIPT.splitlines(True))
        chain = (("[unknown]", "[unknown]"),
                 ("py::f:/src/my app (2)/a.py", "/tmp/perf-1234.map"),
                 ("_Py_dg_dtoa", "/opt/python/bin/python3.11"))
        self.assertEqual(stacks, {
            (("python (1234)", ""), *chain): 2,
            (("my worker 7 (1235)", ""), *chain): 1,
            (("swapper", "[kernel.kallsyms]"),
             ("default_idle", "[kernel.kallsyms]")): 1,
        })

    def test_inlined_functions_are_of_their_image(self):
        # perf names a function inlined in another "(inlined)", before
        # that one at the same address: it belongs to the same image, so
        # the Python view folds it with the evaluator's glue.
        lib = "/opt/python/lib/libpython3.11.so.1.0"
        script = (
            "python  1/1  \n"
            f"\t    ffbe7 {EVAL} ({lib})\n"
            "\t       94 py::g:a.py (/tmp/jitted-1-2.so)\n"
            "\t   250a02 _PyEval_EvalFrame (inlined)\n"
            f"\t   250a02 _PyEval_Vector ({lib})\n"
            f"\t    fd9c2 {EVAL} ({lib})\n"
            "\t       94 py::f:a.py (/tmp/jitted-1-1.so)\n"
            "\t   3000aa lost (inlined)\n")
        [stack] = _reports.parse_script(script.splitlines(True))
        self.assertEqual(stack[1:4], (("lost", "inlined"),
                                      ("py::f:a.py", "/tmp/jitted-1-1.so"),
                                      (EVAL, lib)))
        self.assertEqual(stack[5], ("_PyEval_EvalFrame", lib))
        self.assertEqual(names(_reports.fold_python(stack, {lib})),
                         ["python (1)", "lost", "py::f:a.py", "py::g:a.py"])

    def test_collapsed(self):
        stacks = {frames("python (1)", "py::f:a;b.py", "g"): 3,
                  frames("python (1)", "h"): 1}
        self.assertEqual(_reports.collapsed(stacks),
                         "python (1);h 1\npython (1);py::f:a:b.py;g 3\n")

    def test_flame_tree(self):
        stacks = {frames("python (1)", "f", "g"): 3,
                  frames("python (1)", "f"): 2,
                  frames("swapper", "idle", image="[kernel.kallsyms]"): 1}
        self.assertEqual(_reports.flame_tree(stacks), {
            "n": "all", "l": "root", "v": 0, "c": [
                {"n": "python (1)", "l": "", "v": 0, "c": [
                    {"n": "f", "l": "", "v": 2, "c": [
                        {"n": "g", "l": "", "v": 3, "c": []}]}]},
                {"n": "swapper", "l": "kernel", "v": 0, "c": [
                    {"n": "idle", "l": "kernel", "v": 1, "c": []}]}]})

    def test_fill_template(self):
        template = ("<script>const stacks = [/** @flamegraph_json **/];\n"
                    "const options = [/** @options_json **/];</script>")
        tree = {"n": "py::f:</script>/** @options_json **/", "v": 1}
        page = _reports.fill_template(template, tree, "ctx")
        self.assertNotIn("</script>/", page)
        stacks, options = re.findall(r"\[(.*)\];", page)
        self.assertEqual(json.loads(stacks), tree)
        self.assertEqual(json.loads(options),
                         {"colorscheme": "blue-green", "context": "ctx"})

    def test_template_missing(self):
        with tempfile.TemporaryDirectory() as tmp:
            missing = os.path.join(tmp, "d3-flamegraph-base.html")
            with unittest.mock.patch.object(_reports, "TEMPLATE", missing):
                with self.assertRaisesRegex(_reports.ReportError,
                                            "template is missing"):
                    _reports.write_reports("perf", tmp)
            self.assertEqual(os.listdir(tmp), [])

    def test_perf_script_warnings_do_not_stop_it(self):
        # A perf script that says more on stderr than a pipe holds
        # before its stacks: a reader waiting for the stacks only would
        # leave it blocked (here: until `timeout` ends it, exit 3).
        with tempfile.TemporaryDirectory() as tmp:
            perf = write_script(tmp, FAKE_PERF, "perf")
            os.chmod(perf, 0o755)
            open(os.path.join(tmp, "perf.data"), "w").close()
            with _output.OutputDir.open(tmp) as out:
                stacks = _reports._Perf(perf, out).stacks()
        self.assertEqual(stacks, {(("python (42)", ""),
                                   ("py::f:a.py", "/tmp/perf-42.map")): 1})

    def test_unwritable_output_is_a_report_error(self):
        with tempfile.NamedTemporaryFile() as f:
            with self.assertRaisesRegex(_reports.ReportError,
                                        f"^{f.name}: Not a directory"):
                _reports.write_reports("perf", os.path.join(f.name, "out"))

    def test_template_installed(self):
        # tools/fetch-flamegraph.sh put it there, checked.
        self.assertIn(_reports.STACKS_PLACEHOLDER, _reports.read_template())


# ----------------------------------------------------------------------
# A real recording, drawn by a browser

WORKLOAD = """\
    import json

    def parse(raw):
        return json.loads(raw)

    def handle_request(raw):
        order = parse(raw)
        total = 0.0
        for _ in range(40):
            total = round(total + order["qty"] * order["price"] * 1.07, 2)
        return json.dumps({"id": order["id"], "total": total})

    def serve(requests):
        responses = []
        for raw in requests:
            responses.append(handle_request(raw))
        return responses

    def main():
        requests = [json.dumps({"id": i, "qty": 1 + i % 5, "price": 2.5})
                    for i in range(2000)]
        for _ in range(12):
            serve(requests)

    main()
    """


# WORKLOAD as a service: "ready", then main() again and again until its
# stdin is closed.
SERVER = WORKLOAD.replace("    main()\n", """\
    import sys, threading
    done = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()),
                     daemon=True).start()
    print("ready", flush=True)
    while not done.is_set():
        main()
""")


class Box(NamedTuple):
    """One frame d3-flame-graph drew: <g class="frame" name=...
    transform="translate(x,y)" width=...> (the root is at the bottom)."""
    name: str
    x: float
    y: float
    width: float
    height: float


class FrameParser(html.parser.HTMLParser):
    """The boxes of a page's DOM, and every element: (tag, attributes)."""

    def __init__(self):
        super().__init__()
        self.boxes = []
        self.elements = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self.elements.append((tag, attrs))
        if tag != "g" or "frame" not in (attrs.get("class") or "").split():
            return
        x, y = re.fullmatch(r"translate\(([^,]+),([^)]+)\)",
                            attrs["transform"]).groups()
        self.boxes.append(Box(attrs["name"], float(x), float(y),
                              float(attrs["width"]), float(attrs["height"])))


def parent(box, boxes):
    """The box drawn right below `box` whose x range holds its own."""
    for other in boxes:
        if (abs(other.y - (box.y + box.height)) < 0.01
                and other.x <= box.x + 0.01
                and box.x + box.width <= other.x + other.width + 0.01):
            return other
    return None


def record_tool(out, *args):
    """python -m perf_trampoline record -o OUT ARGS, CompletedProcess."""
    return subprocess.run(
        [sys.executable, "-I", "-m", "perf_trampoline", "record", "-o",
         out, *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_env(), timeout=TIMEOUT)


def perf_version(perf):
    proc = subprocess.run([perf, "version"], stdout=subprocess.PIPE,
                          text=True, timeout=TIMEOUT)
    match = re.match(r"perf version (\d+)\.(\d+)", proc.stdout)
    return (int(match.group(1)), int(match.group(2))) if match else None


class DrawingTestCase(unittest.TestCase):
    """Recordings of WORKLOAD in a directory of the class, perf and
    Chromium checked for, and the frames Chromium draws."""

    @classmethod
    def setUpClass(cls):
        reason = perf_record_works()
        if reason:
            skip_environment(reason)
        cls.chromium = shutil.which("chromium")
        if cls.chromium is None:
            skip_environment("chromium is not installed "
                             "(tools/install-deps.sh installs it)")
        cls.enterClassContext(tmp_files_lock())
        cls.tmpdir = os.path.realpath(tempfile.mkdtemp(prefix="perftest-"))
        cls.addClassCleanup(shutil.rmtree, cls.tmpdir, ignore_errors=True)
        cls.files = ProfilerFiles(markers=[cls.tmpdir])
        cls.addClassCleanup(cls.files.cleanup)
        cls.script = write_script(cls.tmpdir, WORKLOAD, "workload.py")

    def frame(self, function, script=None):
        return f"py::{function}:{script or self.script}"

    def dump_dom(self, path, *options):
        """The DOM of the page at `path` once headless Chromium has run
        its scripts, offline (every host name resolves to nothing)."""
        profile = tempfile.mkdtemp(dir=self.tmpdir, prefix="chromium-")
        proc = subprocess.run(
            [self.chromium, "--headless", "--no-sandbox", "--disable-gpu",
             "--disable-dev-shm-usage", f"--user-data-dir={profile}",
             "--host-resolver-rules=MAP * ~NOTFOUND",
             "--window-size=2000,3000", "--virtual-time-budget=5000",
             *options, "--dump-dom", f"file://{path}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            errors="replace", timeout=TIMEOUT)
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        return proc.stdout

    def render(self, path):
        """The page at `path` as Chromium leaves it (a FrameParser)."""
        parser = FrameParser()
        parser.feed(self.dump_dom(path))
        return parser

    def draw(self, path):
        """The frames headless Chromium draws for the page at `path`."""
        boxes = self.render(path).boxes
        self.assertTrue(boxes, f"no frame drawn in {path}")
        return boxes

    def widest(self, boxes, name):
        matching = [box for box in boxes if box.name == name]
        self.assertTrue(matching, f"{name} is not drawn; drawn: "
                        f"{sorted({box.name for box in boxes})}")
        return max(matching, key=lambda box: box.width)


@needs_host("perf")
class RecordingReportTests(DrawingTestCase):
    """The reports of one recording of WORKLOAD under -X perf, written
    with perf (the one util records with) and with $PERF (make test's
    newer perf, when it is another)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        record, samples = record_samples(
            [sys.executable, "-X", "perf", cls.script], cls.tmpdir)
        if record.returncode != 0:
            raise AssertionError(f"perf record failed: {record.stderr}")
        if not any("handle_request" in sample.python_frames(cls.script)
                   for sample in samples):
            raise AssertionError("perf saw no py::handle_request frame")
        cls.perfs = ["perf"]
        other = os.environ.get("PERF")
        if other and shutil.which(other) != shutil.which("perf"):
            cls.perfs.append(other)
        cls.reports = {}
        for number, perf in enumerate(cls.perfs):
            # The reports go beside the recording.
            out = os.path.join(cls.tmpdir, f"reports-{number}")
            os.mkdir(out)
            os.link(os.path.join(cls.tmpdir, "perf.data"),
                    os.path.join(out, "perf.data"))
            cls.reports[perf] = dict(
                (os.path.basename(path) if path else "gecko.json",
                 (description, path))
                for description, path in _reports.write_reports(perf, out))

    def test_python_view_nests_callee_in_caller(self):
        for perf in self.perfs:
            with self.subTest(perf=perf):
                description, path = self.reports[perf][
                    "flamegraph-python.html"]
                self.assertIn("Python view", description)
                boxes = self.draw(path)
                callee = self.widest(boxes, self.frame("handle_request"))
                # Directly on its caller: nothing folded is drawn between.
                self.assertEqual(parent(callee, boxes).name,
                                 self.frame("serve"))
                self.assertEqual(
                    parent(self.widest(boxes, self.frame("parse")),
                           boxes).name,
                    self.frame("handle_request"))

    def test_full_view_draws_python_frames(self):
        for perf in self.perfs:
            with self.subTest(perf=perf):
                _, path = self.reports[perf]["flamegraph.html"]
                boxes = self.draw(path)
                box = self.widest(boxes, self.frame("handle_request"))
                below = parent(box, boxes)
                if not INLINED_CALLS:
                    # The caller's evaluator lies between, then the caller.
                    self.assertFalse(below.name.startswith("py::"), below)
                    while below is not None and below.name.startswith("_Py"):
                        below = parent(below, boxes)
                # Else the caller ran the call inline: its frame record
                # names the callee, right above the caller.
                self.assertEqual(below and below.name, self.frame("serve"))

    def test_collapsed_stacks(self):
        adjacent = f"{self.frame('serve')};{self.frame('handle_request')};"
        for perf in self.perfs:
            with self.subTest(perf=perf):
                reports = self.reports[perf]
                with open(reports["stacks-python.folded"][1]) as f:
                    python = f.read()
                with open(reports["stacks.folded"][1]) as f:
                    full = f.read()
                for text in python, full:
                    self.assertRegex(text, r"^[^\n]*;[^\n]* [1-9]\d*\n")
                self.assertIn(adjacent, python)
                if INLINED_CALLS:
                    self.assertIn(adjacent, full)
                else:
                    self.assertNotIn(adjacent, full)
                self.assertIn(self.frame("handle_request"), full)
                # The evaluator running a Python function: kept in the
                # full view, that function's own time in the Python view.
                evaluator = re.compile(r"py::[^;]*;" + _reports.EVALUATOR
                                       + r"[; ]")
                self.assertIsNotNone(evaluator.search(full))
                kept = evaluator.search(python)
                self.assertIsNone(kept, kept and kept.group())

    def test_firefox_profiler(self):
        for perf in self.perfs:
            with self.subTest(perf=perf):
                description, path = self.reports[perf]["gecko.json"]
                if perf_version(perf) < (6, 7):
                    self.assertIsNone(path)
                    self.assertIn("no gecko report script", description)
                    continue
                with open(path, encoding="utf-8") as f:
                    profile = json.load(f)
                # Function names as "name (in image)".
                function = f"{self.frame('handle_request')} (in "
                self.assertTrue(
                    any(string.startswith(function)
                        for thread in profile["threads"]
                        for string in thread["stringTable"]),
                    f"no {function}...) in {path}")


@needs_host("perf")
class RecordToolReportTests(DrawingTestCase):
    """python -m perf_trampoline record, of a command and of a running
    process: the Python view it writes, drawn by Chromium, shows
    handle_request called by serve."""

    def record(self, out, *args):
        proc = record_tool(out, *args)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        return proc.stderr.splitlines()

    def check_python_view(self, printed, out, script):
        path = os.path.join(out, "flamegraph-python.html")
        self.assertIn(path, printed)
        boxes = self.draw(path)
        callee = self.widest(boxes, self.frame("handle_request", script))
        self.assertEqual(parent(callee, boxes).name,
                         self.frame("serve", script))

    def test_command(self):
        out = os.path.join(self.tmpdir, "command")
        printed = self.record(out, "--", sys.executable, self.script)
        self.check_python_view(printed, out, self.script)

    def test_process(self):
        server = write_script(self.tmpdir, SERVER, "server.py")
        proc = subprocess.Popen([sys.executable, server],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True, env=clean_env())
        self.addCleanup(proc.kill)
        self.files.add_pid(proc.pid)
        self.assertEqual(proc.stdout.readline(), "ready\n")
        out = os.path.join(self.tmpdir, "process")
        printed = self.record(out, "-p", str(proc.pid), "--seconds", "3")
        proc.stdin.close()
        self.assertEqual(proc.wait(timeout=TIMEOUT), 0)
        self.check_python_view(printed, out, server)


# A file name the profiled program chose: markup that runs script if a
# page puts it in as markup, and marks the page's <body>.
HOSTILE_FILE = ("</script><img src=x onerror=document.body.setAttribute("
                "/data-pwned/.source,1)>")
# Runs the chain, inner()'s code given the file name argv[1].
HOSTILE_WORKLOAD = CHAIN_SOURCE + """
import sys

inner.__code__ = inner.__code__.replace(co_filename=sys.argv[1])
for _ in range(4000):
    outer()
"""

# Opens a report in a frame, waits until it is drawn, then does what a
# reader does: points at the box whose name holds "data-pwned" (its
# tooltip, the details line) and searches for it (the boxes it
# highlights); writes what it read as JSON into <pre id="result">.
PROBE = """\
<!DOCTYPE html>
<html><body>
<pre id="result">not run</pre>
<iframe id="report" src="{url}" width="1900" height="1500"></iframe>
<script>
const HIGHLIGHT = "#E600E6";
const report = document.getElementById("report");
report.addEventListener("load", () => setTimeout(probe, 2000));

function probe() {{
  const page = report.contentDocument;
  const boxes = () => Array.from(page.querySelectorAll("g.frame"));
  const result = {{}};
  const box = boxes().find(
    g => (g.getAttribute("name") || "").includes("data-pwned"));
  if (box) {{
    result.name = box.getAttribute("name");
    result.tooltip = box.querySelector("title").textContent;
    box.dispatchEvent(new MouseEvent("mouseover", {{bubbles: true}}));
    result.details = page.getElementById("details").textContent;
    box.dispatchEvent(new MouseEvent("mouseout", {{bubbles: true}}));
    page.getElementById("search-input").value = "data-pwned";
    page.getElementById("search-form").requestSubmit();
    result.search = page.getElementById("details").textContent;
    result.found = boxes()
      .filter(g => g.querySelector("rect").getAttribute("fill") == HIGHLIGHT)
      .map(g => g.getAttribute("name"));
  }}
  result.pwned = page.body.hasAttribute("data-pwned");
  result.images = page.getElementsByTagName("img").length;
  document.getElementById("result").textContent = JSON.stringify(result);
}}
</script>
</body></html>
"""


class ResultParser(html.parser.HTMLParser):
    """The text of <pre id="result">."""

    def __init__(self):
        super().__init__()
        self.inside = False
        self.text = ""

    def handle_starttag(self, tag, attrs):
        self.inside = tag == "pre" and ("id", "result") in attrs

    def handle_endtag(self, tag):
        self.inside = False

    def handle_data(self, data):
        if self.inside:
            self.text += data


@needs_host("perf")
class HostileNameTests(DrawingTestCase):
    """Both flame graphs of a recording whose names carry markup: opened
    in Chromium, no script of theirs runs, and every name reads as the
    program wrote it, in the boxes, their tooltips, the details line and
    the search results."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        script = write_script(cls.tmpdir, HOSTILE_WORKLOAD, "hostile.py")
        out = os.path.join(cls.tmpdir, "out")
        proc = record_tool(out, "--", sys.executable, script, HOSTILE_FILE)
        if proc.returncode != 0:
            raise AssertionError(f"record failed: {proc.stderr}")
        cls.name = f"py::inner:{HOSTILE_FILE}"
        cls.pages = [os.path.join(out, name) for name in
                     ("flamegraph.html", "flamegraph-python.html")]

    def test_no_script_of_theirs_runs(self):
        for path in self.pages:
            with self.subTest(page=os.path.basename(path)):
                page = self.render(path)
                body = [attrs for tag, attrs in page.elements
                        if tag == "body"]
                self.assertEqual(len(body), 1)
                self.assertNotIn("data-pwned", body[0])
                self.assertNotIn("img", [tag for tag, _ in page.elements])
                # Drawn, named exactly as the program wrote it.
                self.widest(page.boxes, self.name)

    def test_tooltip_details_and_search_read_the_name(self):
        for path in self.pages:
            with self.subTest(page=os.path.basename(path)):
                probe = os.path.join(self.tmpdir, "probe.html")
                with open(probe, "w", encoding="utf-8") as f:
                    f.write(PROBE.format(url=html.escape(
                        pathlib.Path(path).as_uri())))
                # The probe reads the report's page: both are files.
                dom = self.dump_dom(probe, "--allow-file-access-from-files")
                parser = ResultParser()
                parser.feed(dom)
                result = json.loads(parser.text)
                self.assertFalse(result["pwned"])
                self.assertEqual(result["images"], 0)
                self.assertEqual(result.get("name"), self.name, result)
                self.assertTrue(result["tooltip"].startswith(
                    f"{self.name} ("), result["tooltip"])
                self.assertEqual(result["details"], result["tooltip"])
                self.assertTrue(result["search"].startswith("search: "),
                                result["search"])
                self.assertEqual(set(result["found"]), {self.name})


if __name__ == "__main__":
    unittest.main()
