"""Importing a large slice of the standard library, in fresh processes.

Each child imports about 100 pure-Python and C modules that exist in 3.11,
3.12 and 3.13 (from cached .pyc files).  Module bodies, class bodies and
everything they call run once: with perf on, this is thousands of new
trampolines and map lines per process.  Children get this script's
interpreter options; their perf maps are removed afterwards.
"""
import json
import os
import sys
import time

RUNS = 3            # about 0.15 s each
MODULES = """
abc argparse ast asyncio base64 bisect bz2 calendar cmd code codecs
collections concurrent.futures configparser contextlib copy csv
dataclasses datetime decimal difflib dis doctest email.message
email.parser email.policy enum fnmatch fractions ftplib functools getopt
gettext glob gzip hashlib heapq hmac html.parser http.client
http.cookies http.server imaplib importlib.metadata inspect ipaddress
json logging logging.handlers lzma mailbox mimetypes multiprocessing
numbers operator optparse pathlib pdb pickle platform plistlib poplib
pprint profile pstats queue random re sched secrets selectors shlex
shutil smtplib socket socketserver statistics string struct subprocess
sysconfig tarfile tempfile textwrap threading timeit tokenize tomllib
trace traceback typing unittest unittest.mock urllib.parse
urllib.request uuid warnings weakref xml.dom.minidom xml.etree.ElementTree
xml.sax zipfile zoneinfo
""".split()


def interpreter_command():
    # sys.orig_argv = [python, <interpreter options>..., script, args...]
    options = sys.orig_argv[1:len(sys.orig_argv) - len(sys.argv)]
    return [sys.executable, *options]


def spawn_and_wait(argv):
    """Run argv to completion; return its CPU time (user + system)."""
    pid = os.posix_spawn(argv[0], argv, os.environ)
    _, status, usage = os.wait4(pid, 0)
    try:
        os.unlink(f"/tmp/perf-{pid}.map")     # left by -X perf
    except FileNotFoundError:
        pass
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv} failed")
    return usage.ru_utime + usage.ru_stime


def main():
    code = "import " + ", ".join(MODULES)
    argv = interpreter_command() + ["-c", code]
    t0 = time.perf_counter()
    chunks = [spawn_and_wait(argv) for _ in range(RUNS)]
    elapsed = time.perf_counter() - t0
    return elapsed, chunks


if __name__ == "__main__":
    elapsed, chunks = main()
    print(json.dumps({"seconds": elapsed, "cpu": sum(chunks),
                      "chunks": chunks, "units": RUNS,
                      "unit": "process"}))
