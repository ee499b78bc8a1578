"""The conventions of python -m perf_trampoline's command line.

As argparse tools do: a usage error exits 2 with the usage of the command
that was given (without one, the whole help), and every argument has a
help text.  As env(1) and timeout(1) do: record exits 127 when its
COMMAND is not found and 126 when it cannot be run.  --version names
the patch set and the interpreter, and so does python -VV, while
sys.version keeps the format the platform module parses.
"""

import argparse
import os
import platform
import re
import subprocess
import sys
import sysconfig
import tempfile
import unittest
from unittest import mock

from perf_trampoline import __main__ as command_line
from test.test_perf_profiler.util import TIMEOUT, assert_refused, clean_env

PROG = "python3.11 -I -m perf_trampoline"
COMMANDS = ["attach", "detach", "status", "save-maps", "record"]


def run(*args):
    return subprocess.run(args, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=clean_env(),
                          timeout=TIMEOUT)


def tool(*args):
    return run(sys.executable, "-I", "-m", "perf_trampoline", *args)


class UsageTests(unittest.TestCase):

    def assertUsageError(self, result, usage, error):
        """Exit status 2, the usage line of `usage` (the program and its
        command), then "PROG: error: `error`"."""
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertTrue(result.stderr.startswith(f"usage: {usage} "),
                        result.stderr)
        self.assertTrue(result.stderr.endswith(f"{usage}: error: {error}\n"),
                        result.stderr)

    def test_no_command_prints_the_help(self):
        result = tool()
        self.assertEqual(result.returncode, 2, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertEqual(result.stderr, tool("--help").stdout)
        for command in COMMANDS:
            self.assertRegex(result.stderr, rf"(?m)^ +{command}\b")

    def test_errors_show_the_usage_of_their_command(self):
        for command in COMMANDS:
            # (record's arguments after its first positional one are the
            # COMMAND's.)
            pid = [] if command == "record" else ["1"]
            with self.subTest(command=command):
                self.assertUsageError(tool(command, *pid, "--bogus"),
                                      f"{PROG} {command}",
                                      "unrecognized arguments: --bogus")
        self.assertUsageError(tool("attach", "x"), f"{PROG} attach",
                              "argument pid: invalid int value: 'x'")
        self.assertUsageError(tool("record", "-F"), f"{PROG} record",
                              "argument -F/--freq: expected one argument")

    def test_errors_without_a_command_show_the_usage(self):
        self.assertUsageError(tool("--bogus"), PROG,
                              "unrecognized arguments: --bogus")
        result = tool("frobnicate")
        self.assertEqual(result.returncode, 2)
        self.assertIn(f"{PROG}: error: argument COMMAND: invalid choice: "
                      f"'frobnicate'", result.stderr)

    def test_every_argument_has_help(self):
        parser, commands = command_line._parser()
        self.assertEqual(list(commands.choices), COMMANDS)
        described = [choice.dest for choice in commands._choices_actions
                     if choice.help]
        self.assertEqual(described, COMMANDS)
        for name, command in [(None, parser), *commands.choices.items()]:
            for action in command._actions:
                if action is commands:
                    continue
                with self.subTest(command=name, argument=action.dest):
                    self.assertIsNotNone(action.help)
                    self.assertNotEqual(action.help, argparse.SUPPRESS)

    def test_record_is_imported_only_when_needed(self):
        # Its reports' modules would slow down every attach.
        code = ("import sys\n"
                "from perf_trampoline.__main__ import main\n"
                "try:\n"
                "    main(sys.argv[1:])\n"
                "except SystemExit:\n"
                "    pass\n"
                "print('perf_trampoline._record' in sys.modules)")
        for args, imported in ((["status", "0"], False),
                               (["attach", "--timeout", "0", "0"], False),
                               (["save-maps", "--bogus"], False),
                               (["record", "--help"], True),
                               (["-h", "attach"], True),
                               ([], True)):
            with self.subTest(args=args):
                result = run(sys.executable, "-I", "-c", code, *args)
                self.assertEqual(result.stdout.splitlines()[-1],
                                 str(imported), result.stderr)

    def test_version(self):
        result = tool("--version")
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertEqual(result.stdout,
                         f"perf trampolines {sys._perf_trampoline_version} "
                         f"on Python {platform.python_version()}\n")
        self.assertRegex(sys._perf_trampoline_version, r"^\d+\.\d+$")


class InterpreterVersionTests(unittest.TestCase):

    def test_vv_names_the_patch_set(self):
        result = run(sys.executable, "-VV")
        self.assertEqual((result.returncode, result.stderr), (0, ""))
        self.assertEqual(result.stdout,
                         f"Python {sys.version} with perf trampolines "
                         f"{sys._perf_trampoline_version}\n")

    def test_v_and_sys_version_are_upstreams(self):
        result = run(sys.executable, "-V")
        self.assertEqual(result.stdout,
                         f"Python {platform.python_version()}\n")
        self.assertNotIn("perf", sys.version)
        # What the platform module reads from sys.version.
        self.assertEqual(platform.python_implementation(), "CPython")
        self.assertEqual(platform.python_version_tuple(),
                         tuple(map(str, sys.version_info[:3])))
        self.assertRegex(platform.python_build()[1], r"^\w{3} [ \d]\d \d{4}")
        self.assertEqual(platform.python_compiler(),
                         re.search(r"\[(.*)\]$", sys.version).group(1))


class RecordCommandTests(unittest.TestCase):
    """record's COMMAND and perf options, checked before perf runs: a
    fake perf logs the options it is given."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmpdir = tmp.name
        self.out = os.path.join(self.tmpdir, "out")
        self.perf_args = os.path.join(self.tmpdir, "perf-args")
        self.perf = os.path.join(self.tmpdir, "perf")
        with open(self.perf, "w") as f:
            f.write(f"#!/bin/sh\n"
                    f"[ \"$1\" = version ] && echo 'perf version 6.12.0'\n"
                    f"[ \"$1\" = record ] && printf '%s\\n' \"$@\" "
                    f"> {self.perf_args}\n"
                    f"exit 0\n")
        os.chmod(self.perf, 0o755)

    def record(self, *args):
        return tool("record", "--perf", self.perf, "-o", self.out, *args)

    def assertNotRun(self, result, status, message):
        """One line on stderr, exit `status`, nothing written."""
        self.assertEqual(result.returncode, status, result.stderr)
        self.assertEqual(result.stdout, "")
        self.assertEqual(result.stderr, f"perf_trampoline: {message}\n")
        self.assertFalse(os.path.exists(self.out))
        self.assertFalse(os.path.exists(self.perf_args))

    def test_command_not_found(self):
        for name in ("no-such-command-here",
                     os.path.join(self.tmpdir, "missing")):
            with self.subTest(name=name):
                self.assertNotRun(self.record("--", name, "arg"), 127,
                                  f"command not found: {name}: check its "
                                  f"name, or give its path")

    def test_command_not_executable(self):
        plain = os.path.join(self.tmpdir, "plain")
        with open(plain, "w") as f:
            f.write("#!/bin/sh\n")
        os.chmod(plain, 0o644)
        for name in (plain, self.tmpdir):
            with self.subTest(name=name):
                self.assertNotRun(self.record("--", name), 126,
                                  f"cannot run {name}: not an executable "
                                  f"file: give an executable, or run it "
                                  f"with its interpreter")

    def test_command_on_path_not_executable(self):
        # Found on PATH, as env(1) finds it, but not executable: 126.
        os.mkdir(os.path.join(self.tmpdir, "bin"))
        with open(os.path.join(self.tmpdir, "bin", "plain"), "w") as f:
            f.write("#!/bin/sh\n")
        result = subprocess.run(
            [sys.executable, "-I", "-m", "perf_trampoline", "record",
             "--perf", self.perf, "-o", self.out, "--", "plain"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=clean_env(PATH=os.path.join(self.tmpdir, "bin")),
            timeout=TIMEOUT)
        self.assertNotRun(result, 126, "cannot run plain: not an executable "
                                       "file: give an executable, or run "
                                       "it with its interpreter")

    def perf_options(self, *args):
        """The arguments record gave perf record, up to the command."""
        self.record(*args, "--", "true")
        with open(self.perf_args) as f:
            given = f.read().splitlines()
        self.assertEqual(given[0], "record")
        return given[1:given.index("-o")]

    def test_perf_options(self):
        from perf_trampoline._record import DWARF_STACK
        self.assertEqual(self.perf_options(),
                         ["--no-buildid-cache", "--call-graph", "fp", "-e",
                          "cpu-clock", "-F", "999"])
        self.assertEqual(self.perf_options("--jit"),
                         ["-k", "1", "--no-buildid-cache", "--call-graph",
                          f"dwarf,{DWARF_STACK}", "-e", "cpu-clock", "-F",
                          "999"])
        self.assertEqual(self.perf_options("-e", "cycles:u", "--call-graph",
                                           "dwarf,16384", "-a", "-F", "99"),
                         ["--no-buildid-cache", "--call-graph", "dwarf,16384",
                          "-e", "cycles:u", "-F", "99", "-a"])
        self.assertEqual(self.perf_options("--event",
                                           "cpu/event=0x3c,umask=0/",
                                           "--call-graph", "lbr",
                                           "--all-cpus"),
                         ["--no-buildid-cache", "--call-graph", "lbr", "-e",
                          "cpu/event=0x3c,umask=0/", "-F", "999", "-a"])

    def test_perf_options_refused(self):
        for args, message in (
                (["-e", "cycles -a"],
                 "-e 'cycles -a' is not an event name: 'perf list' lists "
                 "them"),
                (["-e", ""], "is not an event name"),
                (["--call-graph", "dwarf,x"],
                 "--call-graph 'dwarf,x': give fp, dwarf, dwarf,BYTES or "
                 "lbr"),
                (["--jit", "--call-graph", "fp"],
                 "--jit unwinds with DWARF: give --call-graph "
                 "dwarf[,BYTES], or record without --jit"),
                (["-a", "-p", "1"],
                 "-a records every process: give it with a COMMAND, or -p "
                 "PID without it")):
            with self.subTest(args=args):
                command = [] if "-p" in args else ["--", "true"]
                assert_refused(self, self.record(*args, *command), message)
                self.assertFalse(os.path.exists(self.out))
                self.assertFalse(os.path.exists(self.perf_args))


class RouteTests(unittest.TestCase):
    """record takes the route of the interpreter it runs on: frame
    pointers where perf trampolines are built in with frame records,
    DWARF and the jitdump where it keeps none."""

    def route(self, python, *argv):
        from perf_trampoline import __main__ as tools, _record
        parser, _ = tools._parser()
        args = parser.parse_args(["record", *argv, "--", "true"])
        with mock.patch.object(_record, "this_python", lambda: python):
            _record.route(args)
        return args.jit, args.call_graph

    def test_routes(self):
        from perf_trampoline._record import (EXTENSION, FRAME_RECORDS,
                                             NO_FRAME_POINTERS)
        for python, argv, route in (
                (FRAME_RECORDS, [], (False, None)),
                (FRAME_RECORDS, ["--jit"], (True, None)),
                (FRAME_RECORDS, ["--call-graph", "dwarf"], (False, "dwarf")),
                (NO_FRAME_POINTERS, [], (True, None)),
                (NO_FRAME_POINTERS, ["--call-graph", "lbr"], (False, "lbr")),
                (EXTENSION, [], (True, None)),
                (EXTENSION, ["--call-graph", "dwarf,4096"],
                 (True, "dwarf,4096"))):
            with self.subTest(python=python, argv=argv):
                self.assertEqual(self.route(python, *argv), route)

    def test_extension_needs_dwarf(self):
        from perf_trampoline._record import EXTENSION, RecordError
        with self.assertRaisesRegex(RecordError, "^--call-graph fp: a stock "
                                    "3.11 keeps no frame pointers"):
            self.route(EXTENSION, "--call-graph", "fp")

    def test_this_python(self):
        from perf_trampoline import _record
        self.assertEqual(_record.this_python(),
                         _record.NO_FRAME_POINTERS if sysconfig.get_config_var(
                             "PY_WITHOUT_FRAME_POINTERS")
                         else _record.FRAME_RECORDS)


class FindPerfTests(unittest.TestCase):
    """Which perf record runs: --perf, else $PERF, else the repository's
    (make deps-jit), else perf on PATH; and which it refuses."""

    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmpdir = tmp.name

    def make_perf(self, name, version):
        path = os.path.join(self.tmpdir, name)
        with open(path, "w") as f:
            f.write(f"#!/bin/sh\necho 'perf version {version}'\n")
        os.chmod(path, 0o755)
        return path

    def find(self, given=None, jit=False, env=None, repository=None):
        from perf_trampoline import _record
        with mock.patch.dict(os.environ, env or {}, clear=True), \
                mock.patch.object(_record, "_repository_perf",
                                  lambda: repository):
            return _record.find_perf(given, jit)

    def test_order(self):
        given = self.make_perf("given", "6.12.1")
        env = self.make_perf("env", "6.12.2")
        repository = self.make_perf("repository", "6.12.3")
        on_path = self.make_perf("perf", "6.12.4")
        path = {"PATH": self.tmpdir}
        self.assertEqual(self.find(given, env={"PERF": env, **path},
                                   repository=repository), given)
        self.assertEqual(self.find(env={"PERF": env, **path},
                                   repository=repository), env)
        self.assertEqual(self.find(env=path, repository=repository),
                         repository)
        self.assertEqual(self.find(env=path), on_path)

    def test_too_old_for_jit(self):
        from perf_trampoline._record import PERF_JIT_MIN, RecordError
        old = self.make_perf("old", "%d.%d" % (PERF_JIT_MIN[0],
                                                PERF_JIT_MIN[1] - 1))
        self.assertEqual(self.find(old), old)
        with self.assertRaises(RecordError) as caught:
            self.find(old, jit=True)
        message = str(caught.exception)
        self.assertNotIn("\n", message)
        for advice in ("--perf PATH", "PERF=PATH", "make deps-jit",
                       "bookworm-backports"):
            self.assertIn(advice, message)
        self.assertEqual(self.find(self.make_perf(
            "oldest", "%d.%d" % PERF_JIT_MIN), jit=True),
            os.path.join(self.tmpdir, "oldest"))


if __name__ == "__main__":
    unittest.main()
