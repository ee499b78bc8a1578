"""Helpers of the stress and fault-injection tests (test_stress,
test_faults): the map read as bytes, name escaping as the writer does
it, and a base class that runs a script with and without -X perf."""

import re

from test.test_perf_profiler.util import PerfTestCase, map_path

PERF = ("-X", "perf")

# The prefix of every warning the trampolines print on stderr.
WARNING = "Python perf trampolines: "

# Name budgets of the map writer (Python/perf_trampoline.c): bytes after
# escaping; a name cut to fit ends in "...".
MAX_QUALNAME = 1024
MAX_FILENAME = 2048

# One map line, as bytes: perf splits the file on "\n" and nothing else.
MAP_LINE = re.compile(rb"([0-9a-f]+) ([0-9a-f]+) (py::.*)")


def read_map_lines(pid):
    """Return the lines of the map of `pid` as bytes, checking that the
    file ends with a newline and that every line is "START SIZE py::NAME"
    with START and SIZE of plausible width (a glued, half-written line has
    too many digits), and that it holds no NUL.  A last line without its
    newline, one a running process is writing, is left out, as readers
    do."""
    with open(map_path(pid), "rb") as f:
        data = f.read()
    if b"\0" in data:
        raise ValueError(f"NUL in the map of {pid} at {data.index(0)}")
    *lines, rest = data.split(b"\n")
    for number, line in enumerate(lines, 1):
        match = MAP_LINE.fullmatch(line)
        if (match is None or len(match.group(1)) > 16
                or len(match.group(2)) > 8):
            raise ValueError(f"malformed line {number} in the map of "
                             f"{pid}: {line[:200]!r}")
    return lines


def parse_lines(lines):
    """[(start, size, name bytes)] of map lines from read_map_lines()."""
    result = []
    for line in lines:
        start, size, name = MAP_LINE.fullmatch(line).groups()
        result.append((int(start, 16), int(size, 16), name))
    return result


def escape_name(text, budget):
    """The map's spelling of one part of an entry name: control characters
    as \\xNN, lone surrogates as \\uXXXX, anything else as UTF-8; cut with
    "..." so that the part never exceeds `budget` bytes."""
    out = bytearray()
    for char in text:
        code = ord(char)
        if code < 0x20 or 0x7f <= code < 0xa0:
            encoded = b"\\x%02x" % code
        elif 0xd800 <= code <= 0xdfff:
            encoded = b"\\u%04x" % code
        else:
            encoded = char.encode("utf-8")
        if len(out) + len(encoded) + 3 > budget:
            return bytes(out) + b"..."
        out += encoded
    return bytes(out)


def only_warning(test, stderr, *fragments):
    """Assert that stderr is exactly one trampoline warning line that
    contains each of `fragments`."""
    lines = stderr.splitlines()
    test.assertEqual(len(lines), 1, f"expected one warning line:\n{stderr}")
    test.assertTrue(lines[0].startswith(WARNING), lines[0])
    for fragment in fragments:
        test.assertIn(fragment, lines[0])


class StressTestCase(PerfTestCase):

    def run_both(self, source, *, script_args=(), env=None):
        """Run `source` without and with -X perf (the script's argv[1] is
        "plain" or "perf"); check that both succeed with the same stdout
        and that the perf run printed nothing on stderr.  Returns the perf
        run's result."""
        plain = self.run_script(source, script_args=("plain", *script_args),
                                env=env)
        perf = self.run_script(source, python_args=PERF,
                               script_args=("perf", *script_args), env=env)
        self.assertEqual(perf.stdout, plain.stdout)
        self.assertEqual(perf.stderr, "")
        self.assertEqual(plain.stderr, "")
        return perf

    def map_lines(self, pid):
        """read_map_lines(pid), failing the test on a malformed map."""
        try:
            return read_map_lines(pid)
        except ValueError as exc:
            self.fail(str(exc))

    def assertUniqueAddresses(self, entries):
        starts = [start for start, _, _ in entries]
        self.assertEqual(len(starts), len(set(starts)),
                         "two map entries share an address")


# ----------------------------------------------------------------------
