"""Tests for perf trampolines (-X perf, PYTHONPERFSUPPORT and
sys.activate_stack_trampoline).

Every test drives the interpreter in a subprocess and checks what it
leaves behind: the perf map in /tmp, its output, perf and gdb views of
its stack.  Shared helpers live in util.py.
"""

import os
import sysconfig
import unittest

from test.support import load_package_tests

if not sysconfig.get_config_var("PY_HAVE_PERF_TRAMPOLINE"):
    raise unittest.SkipTest(
        "this Python was built without perf trampoline support "
        "(PY_HAVE_PERF_TRAMPOLINE is not set)")


def load_tests(*args):
    return load_package_tests(os.path.dirname(__file__), *args)
