#!/usr/bin/env python3
"""Run the bench/ workloads on several interpreters and compare them.

The question `make bench` answers is "what does the patch cost?": with perf
off against an unpatched 3.11.2 built the same way (stock), and with -X perf
against perf off, next to upstream 3.12/3.13 doing the same with their own
perf support; and both against the python3.11 users run today (theirs).  Everything is a ratio between interpreters measured in the
same session, because the machines this runs on are shared and noisy.

How the noise is handled:

* Every run is a fresh process.  A workload script does a fixed amount of
  work as a few equal repetitions ("chunks": calls of its work() function,
  generated modules, child processes) and prints one JSON line with the
  wall time, the CPU time and the CPU time of each chunk.
* Repetitions are interleaved: for each repetition and workload, every
  interpreter configuration runs once, round-robin, with the starting
  configuration rotated from one repetition to the next.  A burst of load
  from a neighbour then hits all configurations alike instead of one.
* The headline metric is CPU time (user + system, of the process or of the
  spawned children), not wall time: on a shared machine with more runnable
  processes than cores, wall time mostly measures how long a run waited for
  a core.  Of the CPU time, the default ("best") counts the fixed work at
  the speed of its fastest chunk: min(chunks) * len(chunks).  Time slices
  shared with neighbours (caches, the sibling hyperthread) only ever make a
  chunk slower, so the fastest chunk is the least disturbed one.  The total
  CPU time ("cpu") and the wall time ("wall") are recorded too, and either
  can be the headline (BENCH_METRIC).
* The headline statistic is the minimum over the repetitions, for the same
  reason.  The median is reported next to it; when the two disagree a lot,
  the machine was busy and the ratios deserve less trust.  Next to each ratio
  of minimums, the median of the ratios taken within each repetition (two
  runs seconds apart) is a second estimate that cancels slow load changes.

Only the standard library is used (no pyperf); any Python 3.8+ can run this.
Environment (or the matching command line options):
    BENCH_RUNS      repetitions (default 7)
    BENCH_METRIC    headline metric: best (default), cpu or wall
    BENCH_FILTER    comma-separated substrings of workload names to run
    BENCH_UPSTREAM  space-separated upstream interpreters; when unset, the
                    newest pyenv 3.12.* and 3.13.* are used if present;
                    set but empty: no upstream interpreters
    BENCH_OURS      patched interpreter (default build/cpython/python)
    BENCH_STOCK     unpatched interpreter (default build/cpython-stock/python)
    BENCH_THEIRS    the interpreter users run today, measured with perf off
                    (default /usr/bin/python3.11, Debian's, when present;
                    set but empty: none)
    BENCH_RELEASE   our release build, PGO + LTO (default
                    build/cpython-release/python when built; empty: none)
    BENCH_RELEASE_NOFP  the same without frame pointers, measured with perf
                    off: what frame pointers cost on their own (default
                    build/cpython-release-nofp/python when built)
    BENCH_STOCK_RELEASE  pristine 3.11.2 built as the release build is,
                    without frame pointers, measured with perf off: what
                    the patch costs in the release build, and how far
                    building from source is from Debian's build (default
                    build/cpython-stock-release/python when built)
    BENCH_EXT       a stock python3.11 with perftramp311 installed, measured
                    with perf off and switched on by python -m perftramp311
                    (default build/ext/venv-debian/bin/python, Debian's
                    python3.11 in make ext's venv, when built; empty: none);
                    also startup through its .pth (PYTHONPERFSUPPORT=1),
                    codeobjects with its perf map backend, and the
                    in-process workloads under an empty PEP 523 hook
                    (bench/pep523_hook.c, built here for it): the floor
                    under its costs
    BENCH_PACKAGED  the /usr/bin/python3.11 of make deb's packages, our
                    patch in Debian's own build (default
                    build/deb/root/usr/bin/python3.11, where tools/bench.sh
                    unpacks them, when there; empty: none)
"""

import argparse
import datetime
import glob
import json
import math
import os
import platform
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import harness

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(BENCH_DIR)
DEFAULT_RUNS = 7
RUN_TIMEOUT = 300          # seconds for one workload run
# Debian 12's own python3.11 (PGO + LTO, no frame pointers): the
# interpreter our users would switch from.
DEBIAN_PYTHON = "/usr/bin/python3.11"
START_TIMEOUT = 180        # seconds to wait for an interpreter being rebuilt

# Workloads dominated by calls of Python functions: where -X perf costs.
CALL_HEAVY = {"fib", "methods", "closures", "callbacks", "kwargs",
              "generators", "comprehensions", "exceptions", "dunder"}
# Workloads that time whole child processes.
PER_PROCESS = {"startup", "imports"}

METRICS = ("cpu", "best", "wall")
METRIC_TITLES = {"cpu": "CPU time", "wall": "Wall time",
                 "best": "CPU time at the fastest repetition"}


def log(msg):
    print(msg, file=sys.stderr, flush=True)


def child_env():
    # Nothing from the caller's environment may switch perf on or change
    # what the interpreters import.  A fixed hash seed takes the dict and
    # set layouts out of the run-to-run variation.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["PYTHONHASHSEED"] = "0"
    return env


def run_python(argv, timeout, env=None):
    """Run argv (with `env` added to child_env()); return (returncode,
    stdout, stderr).  Removes the perf map and jitdump of the child
    whatever happened."""
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**child_env(), **(env or {})},
                            cwd=BENCH_DIR,
                            universal_newlines=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        err += "\n(killed after %d s)" % timeout
    finally:
        harness.remove_profiler_files(proc.pid)
    return proc.returncode, out, err


# ---- interpreters ---------------------------------------------------------

class Config:
    """One interpreter with one set of options: a column of the results."""

    def __init__(self, key, group, python, perf, version,
                 perf_args=("-X", "perf"), env=None, name=None, off=None,
                 only=None, skip=()):
        self.key = key              # e.g. "ours-on", "3.12-off"
        self.group = group          # "stock", "ours", "3.12", ...
        self.python = python
        self.perf = perf
        self.version = version
        self.perf_args = list(perf_args)    # what switches perf on
        self.env = env or {}        # added to child_env()
        # With perf on: its ratio is "NAME on/off", against config `off`.
        self.name = name or group
        self.off = off or "%s-off" % group
        self.only = only            # the workloads it runs (None: all),
        self.skip = frozenset(skip)     # less these

    def argv(self, script):
        return ([self.python] + (self.perf_args if self.perf else [])
                + [script])

    def runs(self, workload):
        return ((self.only is None or workload in self.only)
                and workload not in self.skip)


# A tree being rebuilt has a working ./python some time before its shared
# extension modules exist; json would then silently fall back to pure Python.
READY_PROBE = ("import sys, math, resource, select, zlib, _json, _pickle, "
               "_struct, _posixsubprocess; "
               "print('%d.%d.%d' % sys.version_info[:3])")


def wait_until_runs(python, label, patient):
    """Return the interpreter's version once it starts and has the extension
    modules the workloads need, waiting up to START_TIMEOUT seconds when
    `patient` (our own tree may be rebuilt under us)."""
    deadline = time.monotonic() + (START_TIMEOUT if patient else 0)
    probe = READY_PROBE
    while True:
        try:
            rc, out, err = run_python([python, "-c", probe], 60)
        except OSError as exc:
            rc, out, err = -1, "", str(exc)
        if rc == 0:
            return out.strip()
        if time.monotonic() >= deadline:
            raise RuntimeError("%s (%s) is not usable: %s"
                               % (label, python, err.strip()[-500:]))
        log("bench: %s is not ready (%s); retrying in 5 s"
            % (label, (err.strip().splitlines() or ["?"])[-1]))
        time.sleep(5)


def perf_works(python, option="perf"):
    code = "import sys; print(sys.is_stack_trampoline_active())"
    rc, out, _ = run_python([python, "-X", option, "-c", code], 60)
    return rc == 0 and out.strip() == "True"


# The extension's runner switches it on before the script runs (the
# jitdump backend, its default: what a stock build without frame pointers
# is profiled with).
EXT_PERF_ARGS = ("-m", "perftramp311")


# The variable the extension's .pth switches it on by, in every process
# (the children's environment has no PYTHON* variable of its own).
EXT_PTH_ENV = {"PYTHONPERFSUPPORT": "1"}


def ext_works(python, args=EXT_PERF_ARGS, env=None):
    with tempfile.NamedTemporaryFile("w", suffix=".py") as probe:
        probe.write("import perftramp311; print(perftramp311.is_active())\n")
        probe.flush()
        rc, out, _ = run_python([python, *args, probe.name], 60, env)
    return rc == 0 and out.strip() == "True"


# An empty PEP 523 hook (bench/pep523_hook.c: importing it installs it),
# then the workload, run as a script would be.
HOOK_MODULE = "pep523_hook"
HOOK_ARGS = ("-c", "import runpy, sys, %s; del sys.argv[0]; "
             "runpy.run_path(sys.argv[0], run_name='__main__')"
             % HOOK_MODULE)
SYSCONFIG_PROBE = (
    "import json, sysconfig as s; print(json.dumps([s.get_config_var(n) or "
    "'' for n in ('LDSHARED', 'CFLAGS', 'CCSHARED', 'EXT_SUFFIX')] + "
    "[s.get_path('include'), s.get_path('platinclude')]))")


def build_hook(python, directory):
    """Build the hook module for `python` in `directory`, compiled and
    linked as its own extension modules are (sysconfig); return whether
    it imports."""
    rc, out, err = run_python([python, "-c", SYSCONFIG_PROBE], 60)
    if rc != 0:
        log("bench: no PEP 523 hook: %s" % err.strip()[-300:])
        return False
    ldshared, cflags, ccshared, suffix, include, platinclude = \
        json.loads(out)
    argv = (shlex.split(ldshared) + shlex.split(cflags)
            + shlex.split(ccshared)
            + ["-I" + include, "-I" + platinclude,
               os.path.join(BENCH_DIR, HOOK_MODULE + ".c"),
               "-o", os.path.join(directory, HOOK_MODULE + suffix)])
    proc = subprocess.run(argv, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, universal_newlines=True)
    if proc.returncode != 0:
        log("bench: no PEP 523 hook: %s" % proc.stdout.strip()[-500:])
        return False
    rc, out, err = run_python([python, "-c", "import " + HOOK_MODULE], 60,
                              {"PYTHONPATH": directory})
    return rc == 0


def pyenv_upstream():
    """Newest pyenv-installed 3.12.x and 3.13.x (release builds only)."""
    root = None
    if shutil.which("pyenv"):
        rc = subprocess.run(["pyenv", "root"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL,
                            universal_newlines=True)
        if rc.returncode == 0 and rc.stdout.strip():
            root = rc.stdout.strip()
    root = (root or os.environ.get("PYENV_ROOT")
            or os.path.expanduser("~/.pyenv"))
    found = []
    for minor in ("3.12", "3.13"):
        best = None
        for path in glob.glob(os.path.join(root, "versions", minor + ".*",
                                           "bin", "python" + minor)):
            m = re.search(r"/versions/%s\.(\d+)/bin/" % re.escape(minor), path)
            if m and os.access(path, os.X_OK):
                if best is None or int(m.group(1)) > best[0]:
                    best = (int(m.group(1)), path)
        if best:
            found.append(best[1])
    return found


def make_configs(args):
    configs = []
    stock_version = wait_until_runs(args.stock, "stock", patient=False)
    configs.append(Config("stock", "stock", args.stock, False, stock_version))
    ours_version = wait_until_runs(args.ours, "ours", patient=True)
    if not perf_works(args.ours):
        raise RuntimeError("%s -X perf does not activate the trampoline"
                           % args.ours)
    configs.append(Config("ours-off", "ours", args.ours, False, ours_version))
    configs.append(Config("ours-on", "ours", args.ours, True, ours_version))
    if args.theirs:
        # What users run today: measured off only (Debian's python3.11
        # has no perf support).
        version = wait_until_runs(args.theirs, "theirs", patient=False)
        configs.append(Config("theirs", "theirs", args.theirs, False,
                              version))
    if args.release:
        version = wait_until_runs(args.release, "release", patient=True)
        if not perf_works(args.release):
            raise RuntimeError("%s -X perf does not activate the trampoline"
                               % args.release)
        configs.append(Config("release-off", "release", args.release, False,
                              version))
        configs.append(Config("release-on", "release", args.release, True,
                              version))
    if args.packaged:
        version = wait_until_runs(args.packaged, "packaged", patient=False)
        if not perf_works(args.packaged):
            raise RuntimeError("%s -X perf does not activate the trampoline"
                               % args.packaged)
        configs.append(Config("packaged-off", "packaged", args.packaged,
                              False, version))
        configs.append(Config("packaged-on", "packaged", args.packaged,
                              True, version))
    if args.ext:
        version = wait_until_runs(args.ext, "ext", patient=False)
        if not ext_works(args.ext):
            raise RuntimeError("%s -m perftramp311 does not activate the "
                               "trampolines" % args.ext)
        configs.append(Config("ext-off", "ext", args.ext, False, version))
        configs.append(Config("ext-on", "ext", args.ext, True, version,
                              EXT_PERF_ARGS))
        # Start-up through the .pth, and new code objects in the perf map
        # (beside upstream's -X perf): these workloads only.
        if not ext_works(args.ext, (), EXT_PTH_ENV):
            raise RuntimeError("%s with %s does not activate the "
                               "trampolines" % (args.ext, EXT_PTH_ENV))
        configs.append(Config("ext-pth", "ext", args.ext, True, version, (),
                              env=EXT_PTH_ENV, name="ext .pth",
                              only={"startup"}))
        map_args = EXT_PERF_ARGS + ("--backend", "perf")
        if not ext_works(args.ext, map_args):
            raise RuntimeError("%s %s does not activate the trampolines"
                               % (args.ext, " ".join(map_args)))
        configs.append(Config("ext-map", "ext", args.ext, True, version,
                              map_args, name="ext map",
                              only={"codeobjects"}))
        if build_hook(args.ext, args.scratch):
            configs.append(Config("pep523-on", "pep523", args.ext, True,
                                  version, HOOK_ARGS,
                                  env={"PYTHONPATH": args.scratch},
                                  off="ext-off", skip=PER_PROCESS))
    if args.release_nofp:
        version = wait_until_runs(args.release_nofp, "release-nofp",
                                  patient=True)
        configs.append(Config("release-nofp-off", "release-nofp",
                              args.release_nofp, False, version))
    if args.stock_release:
        version = wait_until_runs(args.stock_release, "stock-release",
                                  patient=False)
        configs.append(Config("stock-release", "stock-release",
                              args.stock_release, False, version))
    for python in args.upstream:
        try:
            version = wait_until_runs(python, python, patient=False)
        except RuntimeError as exc:
            log("bench: skipping upstream interpreter: %s" % exc)
            continue
        group = ".".join(version.split(".")[:2])
        if any(c.group == group for c in configs):
            group = version
        configs.append(Config(group + "-off", group, python, False, version))
        if perf_works(python):
            configs.append(Config(group + "-on", group, python, True, version))
        else:
            log("bench: %s has no working -X perf; measuring it off only"
                % python)
        # The jitdump (3.13 and later), beside the extension's.
        if perf_works(python, "perf_jit"):
            configs.append(Config(group + "-jit", group, python, True,
                                  version, ("-X", "perf_jit"),
                                  name=group + " perf_jit",
                                  only={"codeobjects"}))
    return configs


def binary_identity(python):
    try:
        st = os.stat(python)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def check_unchanged(python, identities, warnings):
    """Warn (once per change) when an interpreter is rebuilt while we
    measure it: its samples then mix two binaries."""
    now = binary_identity(python)
    if now is not None and now != identities[python]:
        identities[python] = now
        msg = ("%s was rebuilt during the benchmark at %s; its samples mix "
               "two builds" % (python, time.strftime("%H:%M:%S")))
        warnings.append(msg)
        log("bench: warning: " + msg)


# ---- workloads ------------------------------------------------------------

def find_workloads(filters):
    names = sorted(os.path.basename(p)[3:-3]
                   for p in glob.glob(os.path.join(BENCH_DIR, "bm_*.py")))
    if filters:
        names = [n for n in names if any(f in n for f in filters)]
    return names


def warm_up(configs):
    """Compile the .pyc files of every module the workloads import, once per
    interpreter, so that no timed run pays for it."""
    with open(os.path.join(BENCH_DIR, "bm_imports.py")) as f:
        text = f.read()
    modules = re.search(r'MODULES = """(.*?)"""', text, re.S).group(1).split()
    code = "import " + ", ".join(modules)
    for python in dict.fromkeys(c.python for c in configs):
        rc, _, err = run_python([python, "-c", code], RUN_TIMEOUT)
        if rc != 0:
            log("bench: warning: %s cannot import the bm_imports module "
                "list:\n%s" % (python, err.strip()[-800:]))


def run_once(config, workload):
    """One fresh process; returns the parsed JSON line or raises."""
    script = "bm_%s.py" % workload
    retries = 2 if config.group == "ours" else 0
    while True:
        try:
            rc, out, err = run_python(config.argv(script), RUN_TIMEOUT,
                                      config.env)
        except OSError as exc:          # e.g. the binary is being relinked
            rc, out, err = -1, "", str(exc)
        if rc == 0:
            break
        if retries == 0:
            raise RuntimeError(err.strip()[-800:] or "exit status %s" % rc)
        # Our tree may be rebuilt under us: wait until it starts again (up
        # to START_TIMEOUT), then run the workload again.
        retries -= 1
        log("bench: %s on %s failed (%s); retrying"
            % (workload, config.key, (err.strip().splitlines() or ["?"])[-1]))
        wait_until_runs(config.python, config.key, patient=True)
    lines = [l for l in out.splitlines() if l.startswith("{")]
    if not lines:
        raise RuntimeError("no JSON result line in output: %r" % out[-300:])
    result = json.loads(lines[-1])
    if not isinstance(result.get("seconds"), (int, float)):
        raise RuntimeError("no 'seconds' in %r" % lines[-1])
    return result


# ---- statistics -----------------------------------------------------------

def metric_value(result, metric):
    """One number per run.  wall: elapsed time of the fixed work; cpu: its
    CPU time; best: the fastest of its equal repetitions ("chunks") times
    their number, i.e. the fixed work at the speed of its best moment."""
    if metric == "wall":
        return result["seconds"]
    if metric == "best" and result.get("chunks"):
        chunks = result["chunks"]
        return min(chunks) * len(chunks)
    return result.get("cpu", result["seconds"])


def unit_value(result, metric):
    """The time of a run spent on its units: what the cost per unit is
    computed from.  When the chunks do more than the units (compile the
    code objects they run), their "unit_chunks" leave that out; wall time
    is not recorded for it, so "wall" takes their CPU time."""
    chunks = result.get("unit_chunks")
    if not chunks:
        return metric_value(result, metric)
    if metric == "best":
        return min(chunks) * len(chunks)
    return sum(chunks)


def geomean(values):
    values = [v for v in values if v]
    if not values:
        return None
    return math.exp(sum(math.log(v) for v in values) / len(values))


def ratio(a, b):
    return a / b if a and b else None


def ratio_order(name):
    return (not name.endswith("on/off"),
            not name.startswith(("ours", "release")), name)


def summarize(configs, workloads, samples, units, unit_samples):
    results = {}
    for w in workloads:
        entry = {"category": ("call-heavy" if w in CALL_HEAVY else
                              "per-process" if w in PER_PROCESS else "other"),
                 "configs": {}, "ratios": {}}
        if units.get(w):
            entry["units"], entry["unit"] = units[w]
        for c in configs:
            by_rep = samples[w][c.key]
            runs = [by_rep[r] for r in sorted(by_rep)]
            if runs:
                entry["configs"][c.key] = {
                    "runs": runs, "min": min(runs),
                    "median": statistics.median(runs)}
        cfg = entry["configs"]

        def add(name, num, den):
            # "min": ratio of the minimums (the headline).  "paired": median
            # over the repetitions of num/den measured side by side in the
            # same repetition, which cancels slow changes in the load.
            if num in cfg and den in cfg:
                a, b = samples[w][num], samples[w][den]
                paired = [a[r] / b[r] for r in a if r in b and b[r]]
                entry["ratios"][name] = {
                    "min": ratio(cfg[num]["min"], cfg[den]["min"]),
                    "paired": statistics.median(paired) if paired else None}

        add("ours on/off", "ours-on", "ours-off")
        add("ours off/stock", "ours-off", "stock")
        add("ours on/stock", "ours-on", "stock")
        # A whole process also runs site, which on Debian's python3.11
        # runs the .pth files of whatever is installed in dist-packages:
        # that measures the machine, not the interpreter.
        if w not in PER_PROCESS:
            add("ours off/theirs", "ours-off", "theirs")
            add("ours on/theirs", "ours-on", "theirs")
            add("release off/theirs", "release-off", "theirs")
            add("release on/theirs", "release-on", "theirs")
            add("packaged off/theirs", "packaged-off", "theirs")
            add("packaged on/theirs", "packaged-on", "theirs")
            add("stock-release/theirs", "stock-release", "theirs")
        add("release fp/nofp", "release-off", "release-nofp-off")
        add("release off/stock-release", "release-off", "stock-release")
        add("release on/stock-release", "release-on", "stock-release")
        for c in configs:
            if c.group not in ("stock", "ours") and c.perf:
                add("%s on/off" % c.name, c.key, c.off)
        if units.get(w):
            n, unit = units[w]
            per_unit = {k: min(v.values()) / n * 1e6
                        for k, v in unit_samples[w].items() if v}
            entry["per_unit_us"] = per_unit
            deltas = {}
            for c in configs:
                if c.perf and c.key in per_unit and c.off in per_unit:
                    deltas[c.name] = per_unit[c.key] - per_unit[c.off]
            entry["perf_cost_per_unit_us"] = deltas
        results[w] = entry

    # The on/off ratios side by side (ours first), then ours against stock.
    names = sorted({r for e in results.values() for r in e["ratios"]},
                   key=ratio_order)
    geo = {}
    for name in names:
        for subset, ws in (("all", workloads),
                           ("call-heavy", [w for w in workloads
                                           if w in CALL_HEAVY])):
            for stat in ("min", "paired"):
                vals = [results[w]["ratios"][name][stat] for w in ws
                        if name in results[w]["ratios"]]
                g = geomean(vals)
                if g:
                    geo.setdefault(name, {}).setdefault(subset, {})[stat] = g
    return results, geo


# ---- output ---------------------------------------------------------------

def fmt_time(seconds):
    ms = seconds * 1e3
    return "%.0f" % ms if ms >= 100 else "%.1f" % ms


def print_tables(configs, workloads, results, geo, runs, metric):
    out = []
    wname = max([len(w) for w in workloads] + [14])
    out.append("")
    out.append("%s in ms, min / median of %d runs (each a fresh process)"
               % (METRIC_TITLES[metric], runs))
    head = "%-*s" % (wname, "workload")
    for c in configs:
        head += " %16s" % c.key
    out.append(head)
    for w in workloads:
        line = "%-*s" % (wname, w)
        for c in configs:
            e = results[w]["configs"].get(c.key)
            cell = ("%s / %s" % (fmt_time(e["min"]), fmt_time(e["median"]))
                    if e else "failed" if c.runs(w) else "-")
            line += " %16s" % cell
        out.append(line)

    names = [n for n in geo] or []
    out.append("")
    out.append("Ratios of the minimums (in parentheses: median of the "
               "ratios within each repetition)")
    head = "%-*s" % (wname, "workload")
    for n in names:
        head += " %16s" % n
    out.append(head)

    def cell(r):
        if not r or not r.get("min"):
            return "-"
        return "%.3f (%.3f)" % (r["min"], r["paired"]) if r.get("paired") \
            else "%.3f" % r["min"]

    for w in workloads:
        line = "%-*s" % (wname, w + ("*" if w in CALL_HEAVY else ""))
        for n in names:
            line += " %16s" % cell(results[w]["ratios"].get(n))
        out.append(line)
    for subset, label in (("all", "geomean"),
                          ("call-heavy", "geomean calls*")):
        line = "%-*s" % (wname, label)
        for n in names:
            line += " %16s" % cell(geo.get(n, {}).get(subset))
        out.append(line)

    unit_lines = []
    for w in workloads:
        e = results[w]
        if "per_unit_us" not in e:
            continue
        unit = e["unit"]
        # Processes take milliseconds, code objects microseconds.
        scale, label = (1e-3, "ms") if unit == "process" else (1, "us")
        parts = ["%s %.2f" % (c.key, e["per_unit_us"][c.key] * scale)
                 for c in configs if c.key in e["per_unit_us"]]
        costs = ", ".join("%s %+.2f" % (g, v * scale) for g, v in
                          e["perf_cost_per_unit_us"].items())
        unit_lines.append("%s: %s per %s (min): %s"
                          % (w, label, unit, ", ".join(parts)))
        if costs:
            unit_lines.append("%s  perf on - off, %s per %s: %s"
                              % (" " * len(w), label, unit, costs))
    if unit_lines:
        out.append("")
        out.extend(unit_lines)
    out.append("")
    out.append("* call-heavy workloads")
    print("\n".join(out), flush=True)


def markdown_report(doc):
    """The results of a finished run as Markdown (for bench/README.md)."""
    configs = doc["configs"]
    results = doc["workloads"]
    geo = doc["geomeans"]
    keys = [c["key"] for c in configs]
    failed = {(e["workload"], e["config"]) for e in doc["errors"]}
    names = sorted(geo, key=ratio_order)
    m = doc["machine"]
    out = ["%s: %d runs, metric `%s`, %s CPUs (%s), load average %s at the "
           "start and %s at the end; %d s." % (
               doc["date"][:10], doc["runs"], doc["metric"], m.get("cpus"),
               m.get("cpu", "?"),
               "%.1f" % m["loadavg_start"][0] if "loadavg_start" in m else "?",
               "%.1f" % m["loadavg_end"][0] if "loadavg_end" in m else "?",
               doc["seconds_total"]), ""]

    def rcell(r):
        if not r or not r.get("min"):
            return "–"
        if r.get("paired"):
            return "%.3f (%.3f)" % (r["min"], r["paired"])
        return "%.3f" % r["min"]

    def label(w, e):
        return "`%s`%s" % (w, "\\*" if e["category"] == "call-heavy" else "")

    out.append("Ratios of the minimums (in parentheses: median of the "
               "per-repetition ratios); \\* call-heavy:")
    out.append("")
    out.append("| workload | " + " | ".join(names) + " |")
    out.append("|---" * (1 + len(names)) + "|")
    for w, e in results.items():
        out.append("| " + " | ".join([label(w, e)] + [
            rcell(e["ratios"].get(n)) for n in names]) + " |")
    for subset, title in (("all", "**geomean**"),
                          ("call-heavy", "**geomean, call-heavy**")):
        out.append("| " + " | ".join([title] + [
            rcell(geo[n].get(subset)) for n in names]) + " |")
    out.append("")
    out.append("Minimum over the runs, ms (in parentheses: median):")
    out.append("")
    out.append("| workload | " + " | ".join(keys) + " |")
    out.append("|---" * (1 + len(keys)) + "|")
    for w, e in results.items():
        out.append("| " + " | ".join([label(w, e)] + [
            "%s (%s)" % (fmt_time(e["configs"][k]["min"]),
                         fmt_time(e["configs"][k]["median"]))
            if k in e["configs"] else "failed" if (w, k) in failed else "–"
            for k in keys]) + " |")
    out.append("")
    for w, e in results.items():
        if "per_unit_us" not in e:
            continue
        scale, label = (1e-3, "ms") if e["unit"] == "process" else (1, "µs")
        out.append("- `%s`, %s per %s: %s; perf on − off: %s." % (
            w, label, e["unit"],
            ", ".join("%s %.2f" % (k, e["per_unit_us"][k] * scale)
                      for k in keys if k in e["per_unit_us"]),
            ", ".join("%s %+.2f" % (g, v * scale) for g, v in sorted(
                e["perf_cost_per_unit_us"].items(),
                key=lambda item: (item[0] != "ours", item[0])))))
    return "\n".join(out)


def machine_info():
    info = {"platform": platform.platform(), "cpus": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^model name\s*:\s*(.*)$", f.read(), re.M)
            if m:
                info["cpu"] = m.group(1).strip()
    except OSError:
        pass
    try:
        info["loadavg_start"] = os.getloadavg()
    except OSError:
        pass
    return info


# ---- main -----------------------------------------------------------------

def parse_args():
    env = os.environ
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int,
                   default=int(env.get("BENCH_RUNS") or DEFAULT_RUNS))
    p.add_argument("--metric", choices=METRICS,
                   default=env.get("BENCH_METRIC") or "best")
    p.add_argument("--filter", default=env.get("BENCH_FILTER", ""),
                   help="comma-separated substrings of workload names")
    p.add_argument("--ours", default=env.get("BENCH_OURS") or
                   os.path.join(ROOT, "build", "cpython", "python"))
    p.add_argument("--stock", default=env.get("BENCH_STOCK") or
                   os.path.join(ROOT, "build", "cpython-stock", "python"))
    p.add_argument("--theirs", default=env.get("BENCH_THEIRS"),
                   help="the interpreter users run today, without perf "
                   "(default: /usr/bin/python3.11 when present; empty: "
                   "none)")
    p.add_argument("--release", default=env.get("BENCH_RELEASE"),
                   help="our PGO + LTO build (default: "
                   "build/cpython-release/python when built; empty: none)")
    p.add_argument("--release-nofp", default=env.get("BENCH_RELEASE_NOFP"),
                   help="the same without frame pointers (default: "
                   "build/cpython-release-nofp/python when built)")
    p.add_argument("--stock-release", default=env.get("BENCH_STOCK_RELEASE"),
                   help="pristine 3.11.2 built alike (default: "
                   "build/cpython-stock-release/python when built)")
    p.add_argument("--packaged", default=env.get("BENCH_PACKAGED"),
                   help="make deb's python3.11, unpacked (default: "
                   "build/deb/root/usr/bin/python3.11 when there; empty: "
                   "none)")
    p.add_argument("--ext", default=env.get("BENCH_EXT"),
                   help="a stock python3.11 with perftramp311 (default: "
                   "build/ext/venv-debian/bin/python when built; empty: "
                   "none)")
    p.add_argument("--upstream", default=env.get("BENCH_UPSTREAM"),
                   help="space-separated interpreters "
                   "(default: pyenv 3.12/3.13)")
    p.add_argument("--json", default=os.path.join(ROOT, "build", "bench",
                                                  "results.json"))
    p.add_argument("--markdown", metavar="RESULTS_JSON",
                   help="print the results of an earlier run as Markdown "
                   "and exit")
    args = p.parse_args()
    if args.markdown:
        return args
    if args.runs < 1:
        p.error("--runs must be at least 1")
    args.upstream = (pyenv_upstream() if args.upstream is None
                     else args.upstream.split())
    if args.theirs is None and os.path.exists(DEBIAN_PYTHON):
        args.theirs = DEBIAN_PYTHON
    for name, built in (
            ("release", "cpython-release/python"),
            ("release_nofp", "cpython-release-nofp/python"),
            ("stock_release", "cpython-stock-release/python"),
            ("packaged", "deb/root/usr/bin/python3.11"),
            ("ext", "ext/venv-debian/bin/python")):
        built = os.path.join(ROOT, "build", built)
        if getattr(args, name) is None and os.path.exists(built):
            setattr(args, name, built)
    args.filters = [f.strip() for f in args.filter.split(",") if f.strip()]
    return args


def main():
    args = parse_args()
    if args.markdown:
        with open(args.markdown) as f:
            print(markdown_report(json.load(f)))
        return 0
    # What is built for the run (the PEP 523 hook) goes when it ends.
    with tempfile.TemporaryDirectory(prefix="bench-") as args.scratch:
        return run(args)


def run(args):
    workloads = find_workloads(args.filters)
    if not workloads:
        sys.exit("bench: no workload matches BENCH_FILTER=%r" % args.filter)
    try:
        configs = make_configs(args)
    except RuntimeError as exc:
        sys.exit("bench: %s" % exc)
    log("bench: %d workloads x %d configurations x %d runs: %s"
        % (len(workloads), len(configs), args.runs,
           ", ".join("%s (%s)" % (c.key, c.python) for c in configs)))
    log("bench: warming up (.pyc files)")
    warm_up(configs)

    # samples[metric][workload][config][repetition] = value
    samples = {m: {w: {c.key: {} for c in configs} for w in workloads}
               for m in METRICS}
    # The same for the time spent on the units of a workload made of them.
    unit_samples = {m: {w: {c.key: {} for c in configs} for w in workloads}
                    for m in METRICS}
    units = {}
    errors = []
    warnings = []
    identities = {c.python: binary_identity(c.python) for c in configs}
    info = machine_info()
    started = time.monotonic()
    total_steps = args.runs * len(workloads)
    step = 0
    for rep in range(args.runs):
        for w in workloads:
            # Rotate the starting configuration each repetition and workload.
            shift = (rep + workloads.index(w)) % len(configs)
            order = configs[shift:] + configs[:shift]
            cells = {}
            for c in order:
                if not c.runs(w):
                    continue
                check_unchanged(c.python, identities, warnings)
                try:
                    result = run_once(c, w)
                except RuntimeError as exc:
                    errors.append({"workload": w, "config": c.key,
                                   "repetition": rep, "error": str(exc)})
                    log("bench: %s on %s failed: %s" % (w, c.key, exc))
                    cells[c.key] = "FAIL"
                    continue
                for m in METRICS:
                    samples[m][w][c.key][rep] = metric_value(result, m)
                if "units" in result:
                    units[w] = (result["units"], result.get("unit", "unit"))
                    for m in METRICS:
                        unit_samples[m][w][c.key][rep] = unit_value(result, m)
                cells[c.key] = fmt_time(metric_value(result, args.metric))
            step += 1
            spent = time.monotonic() - started
            eta = spent / step * (total_steps - step)
            log("[run %d/%d %3d%% eta %2d:%02d] %-15s %s"
                % (rep + 1, args.runs, 100 * step // total_steps,
                   eta // 60, eta % 60, w,
                   "  ".join("%s %s" % (c.key, cells[c.key])
                             for c in configs if c.key in cells)))

    summaries = {m: summarize(configs, workloads, samples[m], units,
                              unit_samples[m])
                 for m in METRICS}
    results, geo = summaries[args.metric]
    print_tables(configs, workloads, results, geo, args.runs, args.metric)
    for other in METRICS:
        if other != args.metric:
            print("geomeans with metric %s: %s" % (other, ", ".join(
                "%s %.3f" % (name, g["all"]["min"])
                for name, g in summaries[other][1].items() if "all" in g)))
    try:
        info["loadavg_end"] = os.getloadavg()
    except OSError:
        pass
    doc = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "runs": args.runs,
        "seconds_total": round(time.monotonic() - started, 1),
        "machine": info,
        "configs": [{"key": c.key, "group": c.group, "python": c.python,
                     "perf": c.perf, "version": c.version} for c in configs],
        "metric": args.metric,
        "workloads": results,
        "geomeans": geo,
        "other_metrics": {m: {"workloads": summaries[m][0],
                              "geomeans": summaries[m][1]}
                          for m in METRICS if m != args.metric},
        "errors": errors,
        "warnings": warnings,
    }
    os.makedirs(os.path.dirname(os.path.abspath(args.json)), exist_ok=True)
    with open(args.json + ".tmp", "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(args.json + ".tmp", args.json)
    for msg in warnings:
        log("bench: warning: " + msg)
    log("bench: %d runs in %.0f s; results in %s%s"
        % (sum(len(v) for s in samples["cpu"].values() for v in s.values()),
           time.monotonic() - started, args.json,
           "; %d runs FAILED" % len(errors) if errors else ""))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
