"""Importing a large slice of the standard library, in fresh processes.

Each child imports about 100 pure-Python and C modules that exist in 3.11,
3.12 and 3.13 (from cached .pyc files).  Module bodies, class bodies and
everything they call run once: with perf on, this is thousands of new
trampolines and map lines per process.  Children get this script's
interpreter options; their perf maps are removed afterwards.
"""
import harness

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


if __name__ == "__main__":
    harness.run_children(["-c", "import " + ", ".join(MODULES)], RUNS)
