#!/bin/bash
# What make test-deb checks inside the clean root once the packages of
# make deb are installed (tools/test-deb.sh copies this script there and
# runs it as root): Debian's own /usr/bin/python3 and what runs on it.
# Prints a line per check; exits with the number of failed checks.
set -uo pipefail
fails=0
work=$(mktemp -d)

# check WHAT COMMAND...: run it, print ok or FAIL with its output.
check() {
    local what=$1 out
    shift
    if out=$("$@" 2>&1); then
        echo "test-deb: ok    $what"
    else
        echo "test-deb: FAIL  $what"
        tail -15 <<<"$out" | sed 's/^/    /'
        fails=$((fails + 1))
    fi
}

# A program that asserts its own perf map names one of its functions (the
# line is in the file before the function's trampoline first runs).
cat >"$work/own_map.py" <<'EOF'
import os
import sys


def marker_function():
    return 42


if len(sys.argv) > 1 and sys.argv[1] == "api":
    sys.activate_stack_trampoline("perf")
    assert sys.is_stack_trampoline_active()
marker_function()
path = f"/tmp/perf-{os.getpid()}.map"
with open(path) as f:
    text = f.read()
assert "py::marker_function:" in text, f"{path} has no marker_function"
if len(sys.argv) > 1 and sys.argv[1] == "api":
    sys.deactivate_stack_trampoline()
    assert not sys.is_stack_trampoline_active()
EOF

# Two Python functions calling each other for about a second: perf's
# frame-pointer unwinding must show py::inner called from py::outer.
cat >"$work/busy.py" <<'EOF'
def inner(n):
    total = 0
    for i in range(n):
        total += i * i
    return total


def outer():
    for _ in range(150):
        inner(100_000)


outer()
EOF

# In one sample's call chain (perf script -F ip,sym: a block of "ADDRESS
# SYMBOL" lines a sample, callee first), py::inner and, above it,
# py::outer.
cat >"$work/chain.py" <<'EOF'
import sys

blocks = sys.stdin.read().split("\n\n")
for block in blocks:
    frames = [line.split()[1] for line in block.splitlines()
              if len(line.split()) > 1]
    # py::QUALNAME:FILENAME -> py::QUALNAME
    names = ["py::" + f[4:].split(":")[0] for f in frames
             if f.startswith("py::")]
    if "py::inner" in names and "py::outer" in names[names.index("py::inner"):]:
        sys.exit(0)
sys.exit(f"no sample of {len(blocks)} has py::inner called from py::outer")
EOF

perf_record() {
    perf record -q -g -o "$work/perf.data" -- python3 -X perf "$work/busy.py" &&
        perf script -i "$work/perf.data" -F ip,sym 2>/dev/null | python3 "$work/chain.py"
}

# Debian's compiled extensions and pure-Python packages under
# PYTHONPERFSUPPORT=1: they give their usual results.
cat >"$work/packages.py" <<'EOF'
import numpy
import lxml.etree
import yaml

assert numpy.arange(10).sum() == 45
assert round(numpy.linalg.det(numpy.eye(3) * 2)) == 8
root = lxml.etree.fromstring("<a><b>x</b><b>y</b></a>")
assert [b.text for b in root.iter("b")] == ["x", "y"]
assert yaml.safe_load("a: [1, 2]") == {"a": [1, 2]}
EOF

# map_of_program NAME COMMAND...: COMMAND runs with PYTHONPERFSUPPORT=1,
# succeeds, and a map written meanwhile names NAME's code.
map_of_program() {
    local name=$1
    shift
    rm -f /tmp/perf-*.map
    PYTHONPERFSUPPORT=1 "$@" >"$work/out" || return 1
    grep -l -- "$name" /tmp/perf-*.map
}

check "python3 is the packaged perf build" \
    python3 -c 'import sys; assert hasattr(sys, "activate_stack_trampoline")'
check "python3 -X perf writes its map" python3 -X perf "$work/own_map.py"
check "PYTHONPERFSUPPORT=1 python3 writes its map" \
    env PYTHONPERFSUPPORT=1 python3 "$work/own_map.py"
check "sys.activate_stack_trampoline(\"perf\") and back" \
    python3 "$work/own_map.py" api
check "perf record -g: py::inner under py::outer" perf_record
check "python3-numpy, python3-lxml, python3-yaml under PYTHONPERFSUPPORT=1" \
    env PYTHONPERFSUPPORT=1 python3 "$work/packages.py"
# Debian's py3compile and py3clean (python3-minimal) on a module.
mkdir -p "$work/mod"
echo 'VALUE = 1' >"$work/mod/m.py"
pyc=$work/mod/__pycache__/m.cpython-311.pyc
check "py3compile (a packaged program) under PYTHONPERFSUPPORT=1" \
    bash -c "$(declare -f map_of_program); work=$work
             map_of_program /usr/bin/py3compile py3compile $work/mod && test -f $pyc"
check "py3clean (a packaged program) under PYTHONPERFSUPPORT=1" \
    bash -c "$(declare -f map_of_program); work=$work
             map_of_program /usr/bin/py3clean py3clean $work/mod && test ! -e $pyc"
check "python3 -m venv, and -X perf in the venv" \
    bash -c "python3 -m venv $work/venv &&
             $work/venv/bin/python -X perf $work/own_map.py &&
             $work/venv/bin/python -m pip --version"
check "python3 -m perf_trampoline --help (libpython3.11-stdlib has it)" \
    python3 -m perf_trampoline --help
# The flame graph template comes with the package: record writes both
# flame graphs offline.
check "python3 -m perf_trampoline record: flame graphs of py::inner" \
    bash -c "python3 -m perf_trampoline record -o $work/rec -- python3 $work/busy.py &&
             grep -q py::inner $work/rec/flamegraph.html &&
             grep -q py::inner $work/rec/flamegraph-python.html"
rm -rf "$work" /tmp/perf-*.map
exit $fails
