#!/usr/bin/env python3
"""The figures the documents quote, kept in one file: bench/results.json.

    figures.py collect RUN_JSON SIDE_JSON [PERF_OFF_JSON]
                                            write bench/results.json from a
                                            make bench run (run_bench.py's,
                                            side_costs.py's and
                                            perf_off.py's --json)
    figures.py collect-perf-off PERF_OFF_JSON
                                            replace only perf_off.py's
                                            figures (make bench-perf-off)
    figures.py update                       rewrite the generated tables in
                                            the documents from it
    figures.py check                        exit 1, naming them, if a
                                            document's tables differ from
                                            what update would write

A generated table sits between `<!-- figures:NAME -->` and
`<!-- /figures:NAME -->`; everything else in a document is left alone, and
no document quotes a figure of make bench's outside such a block.  make bench
runs collect and update; tools/test_tooling.py runs check.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results.json")

# run_bench.py's ratio names kept in the results file, in this order.
RATIOS = ("release on/off", "ours on/off", "3.12 on/off", "3.13 on/off",
          "ext on/off", "pep523 on/off", "ours off/stock",
          "release off/theirs", "release on/theirs", "packaged off/theirs",
          "packaged on/theirs", "release off/stock-release",
          "release on/stock-release", "stock-release/theirs")
SIDE_CONFIGS = {"-X perf": "perf", "-X perf_jit": "perf_jit"}
# What the README's table cannot do without.
NEEDED = ("ours on/off", "3.12 on/off", "3.13 on/off", "ours off/stock",
          "release off/theirs", "release on/theirs")


# ---- collect --------------------------------------------------------------

def collect(run, side, perf_off=None):
    """The results file's content from run_bench.py's JSON (`run`),
    side_costs.py's (`side`) and perf_off.py's, if it ran."""
    ratios = {}
    for name in RATIOS:
        per = {w: round(e["ratios"][name]["min"], 3)
               for w, e in run["workloads"].items()
               if e["ratios"].get(name, {}).get("min")}
        if not per:
            continue
        geo = run["geomeans"][name]
        ratios[name] = {"workloads": per,
                        "geomean": round(geo["all"]["min"], 3),
                        "geomean call-heavy":
                            round(geo["call-heavy"]["min"], 3)}
    missing = [name for name in NEEDED if name not in ratios]
    if missing or run.get("errors"):
        raise SystemExit("figures: %s kept: the run %s" % (
            os.path.relpath(RESULTS, ROOT),
            "has no %s" % ", ".join(missing) if missing else "had failures"))
    code = run["workloads"].get("codeobjects", {})
    per_code = {g: round(v, 2) for g, v in
                code.get("perf_cost_per_unit_us", {}).items()}
    # Start-up through perftramp311's .pth: one workload, no column.
    pth = (run["workloads"].get("startup", {}).get("ratios", {})
           .get("ext .pth on/off", {}).get("min"))
    rows = side["rows"]
    off = rows["perf off"]["memory"]
    m = run["machine"]
    return {
        "date": run["date"][:10],
        "machine": "%s vCPUs (%s)" % (m.get("cpus"), m.get("cpu", "?")),
        "runs": run["runs"],
        "metric": run["metric"],
        "call_heavy": sorted(w for w, e in run["workloads"].items()
                             if e["category"] == "call-heavy"),
        "ratios": ratios,
        "per_code_object_us": per_code,
        **({"ext_pth_startup": round(pth, 3)} if pth else {}),
        "memory_per_code_object_bytes": {
            short: round(rows[name]["memory"] - off)
            for name, short in SIDE_CONFIGS.items()},
        "fork": {name: {"fork_ms": round(r["fork_ms"], 1),
                        "tmp_kib": round(r["tmp"] / 1024)}
                 for name, r in rows.items()},
        "attach_ms": round(side["attach_ms"]),
        **({"perf_off": perf_off} if perf_off else {}),
    }


# ---- tables ---------------------------------------------------------------

def r2(value):
    return "%.2f" % value if value is not None else ""


def per_code(f, group, unit=" µs", missing=""):
    """A group's cost per new code object, as the tables write it."""
    v = f["per_code_object_us"].get(group)
    return "+%.2f%s" % (v, unit) if v is not None else missing


def readme_costs(f):
    ratios = f["ratios"]
    ours = "release on/off" if "release on/off" in ratios else "ours on/off"

    def on_off(key):
        return [r2(ratios.get(name, {}).get(key) if key.startswith("geo")
                   else ratios.get(name, {}).get("workloads", {}).get(key))
                for name in (ours, "3.12 on/off", "3.13 on/off")]

    def geomeans(off, on):
        return "%s / %s" % (r2(ratios[off]["geomean"]),
                            r2(ratios[on]["geomean"]))

    n_all = len(ratios[ours]["workloads"])
    n_calls = len(f["call_heavy"])
    n_theirs = len(ratios.get("release off/theirs", {}).get("workloads", {}))
    mem = f["memory_per_code_object_bytes"]
    rows = [
        ["`-X perf` on/off, geomean of %d workloads" % n_all]
        + on_off("geomean"),
        ["`-X perf` on/off, the %d call-heavy ones" % n_calls]
        + on_off("geomean call-heavy"),
        ["`-X perf` on/off, recursive calls (`fib`)"] + on_off("fib"),
        ["`-X perf` on/off, generators"] + on_off("generators"),
        ["`-X perf`, per new code object",
         per_code(f, "release" if ours.startswith("release") else "ours"),
         per_code(f, "3.12"), per_code(f, "3.13")],
        ["perf off / `-X perf`, against Debian's `python3.11` "
         "(%d in-process workloads)" % n_theirs,
         geomeans("release off/theirs", "release on/theirs"), "", ""],
    ]
    if "packaged off/theirs" in ratios:
        rows.append(["`make deb`'s `python3.11`, perf off / `-X perf`, "
                     "against Debian's",
                     geomeans("packaged off/theirs", "packaged on/theirs"),
                     "", ""])
    if "stock-release/theirs" in ratios:
        rows += [
            ["perf off / `-X perf`, against stock 3.11.2 built alike "
             "(`make stock-release`)",
             geomeans("release off/stock-release",
                      "release on/stock-release"), "", ""],
            ["that stock 3.11.2, against Debian's `python3.11`",
             r2(ratios["stock-release/theirs"]["geomean"]), "", ""]]
    rows += [
        ["perf off, against stock 3.11.2 built alike (`make`'s build)",
         r2(ratios["ours off/stock"]["geomean"]), "", ""],
        ["memory per code object, `-X perf` / `-X perf_jit`",
         "+%d B / +%d B" % (mem["perf"], mem["perf_jit"]), "", ""],
        ["`perf_trampoline attach`, median", "%d ms" % f["attach_ms"], "", ""],
    ]
    out = ["%s, %s, %d runs:" % (f["date"], f["machine"], f["runs"]), "",
           "| | ours | upstream 3.12 | upstream 3.13 |",
           "| --- | --- | --- | --- |"]
    out += ["| " + " | ".join(row) + " |" for row in rows]
    return out


def readme_ext(f):
    """perftramp311 on Debian's python3.11 beside an empty PEP 523 hook
    there and upstream's -X perf (-X perf_jit for the jitdump)."""
    ratios = f["ratios"]
    if "ext on/off" not in ratios:
        return ["(No make bench run has measured it yet.)"]
    names = [n for n in ("ext on/off", "pep523 on/off", "3.12 on/off")
             if n in ratios]

    def cells(key):
        return [r2(ratios[n][key] if key.startswith("geo")
                   else ratios[n]["workloads"].get(key)) for n in names]

    def row(label, ext, upstream):
        return [label, ext] + [""] * (len(names) - 2) + [upstream]

    def us(first, second):
        return "%s / %s µs" % (per_code(f, first, "", "–"),
                               per_code(f, second, "", "–"))

    rows = [["geomean of the %d call-heavy workloads" % len(f["call_heavy"])]
            + cells("geomean call-heavy"),
            ["recursive calls (`fib`)"] + cells("fib"),
            ["generators"] + cells("generators")]
    if "ext_pth_startup" in f:
        rows.append(row("start-up through the `.pth`",
                        r2(f["ext_pth_startup"]),
                        r2(ratios["3.12 on/off"]["workloads"].get(
                            "startup"))))
    rows.append(row("new code object, jitdump / map (3.13's `-X perf_jit` "
                    "/ 3.12's `-X perf`)", us("ext", "ext map"),
                    us("3.13 perf_jit", "3.12")))
    heads = {"ext on/off": "perftramp311", "pep523 on/off":
             "empty PEP 523 hook", "3.12 on/off": "upstream 3.12"}
    out = ["| on/off | %s |" % " | ".join(heads[n] for n in names),
           "|---" * (1 + len(names)) + "|"]
    return out + ["| " + " | ".join(row) + " |" for row in rows]


def bench_ratios(f):
    ratios = f["ratios"]
    names = [n for n in RATIOS if n in ratios]
    workloads = list(ratios[names[0]]["workloads"])
    for n in names:
        workloads += [w for w in ratios[n]["workloads"] if w not in workloads]
    out = ["%s: %d runs, metric `%s`, %s; ratios of the minimums, "
           "\\* call-heavy." % (f["date"], f["runs"], f["metric"],
                                f["machine"]), "",
           "| workload | " + " | ".join(names) + " |",
           "|---" * (1 + len(names)) + "|"]
    for w in sorted(workloads):
        star = "\\*" if w in f["call_heavy"] else ""
        cells = ["%.3f" % ratios[n]["workloads"][w]
                 if w in ratios[n]["workloads"] else "" for n in names]
        out.append("| `%s`%s | %s |" % (w, star, " | ".join(cells)))
    for key, title in (("geomean", "**geomean**"),
                       ("geomean call-heavy", "**geomean, call-heavy**")):
        out.append("| %s | %s |" % (title, " | ".join(
            "%.3f" % ratios[n][key] for n in names)))
    per = f["per_code_object_us"]
    out += ["", "Per new code object, on − off: %s." % ", ".join(
        "%s %+.2f µs" % (g, per[g]) for g in sorted(per))]
    return out


def bench_side(f):
    out = ["| configuration | fork, ms | `/tmp` per child |",
           "| --- | --- | --- |"]
    for name, r in f["fork"].items():
        out.append("| %s | %.1f | %d KiB |" % (name, r["fork_ms"],
                                               r["tmp_kib"]))
    mem = f["memory_per_code_object_bytes"]
    out += ["", "Memory per code object: `-X perf` +%d B, `-X perf_jit` "
            "+%d B.  Attach, median: %d ms." % (mem["perf"], mem["perf_jit"],
                                               f["attach_ms"])]
    return out


# The variants of bench/perf_off.py: one per change of the evaluator patch
# that acts with perf off (bench/perf_off/NAME.patch undoes it), and the
# frame records; and what each leaves out.
PERF_OFF_ROWS = (
    ("float_inline", "float free list inline (`float_from_double()`)"),
    ("frame_reload", "`frame` read back after the eval breaker"),
    ("error_paths", "`error:`, `miss:` read the instruction from the "
     "frame"),
    ("gen_resume", "`FOR_ITER`, `SEND` resume generators"),
    ("co_extra", "`co_extra` free functions skip slots never set"),
    ("records", "frame records (per inlined call and return a test and a "
     "count; a register)"),
)


def design_perf_off(f):
    p = f.get("perf_off")
    if not p:
        return ["(No make bench run has measured it yet.)"]
    counts = p["instructions"]
    full = counts["full"]
    workloads = list(full)

    def stack(name, key):
        return "/".join("%d" % p["stack"][name]["%s %s" % (shape, key)]
                        ["bytes_per_level"] for shape in ("delegate", "loop"))

    also = {
        "gen_resume": "C stack per `delegate`/`loop` level %s B, "
        "`-X perf` %s (with it %s, %s; stock %s)" % (
            stack("gen_resume", "off"), stack("gen_resume", "-X perf"),
            stack("full", "off"), stack("full", "-X perf"),
            stack("stock", "off")),
        "frame_reload": "for PGO + LTO, where GCC keeps `frame` twice",
        "co_extra": "`-X perf`: another user's free function runs %d "
        "times for %d untagged functions, not %d (`test_stress`)" % (
            p["free_calls"]["co_extra"], p["untagged"],
            p["free_calls"]["full"])}
    out = ["%s, `make`'s build (no PGO, LTO): perf-off instructions "
           "without each change, %% over the whole patch; all but frame "
           "records act even `--disable-perf-trampoline`:" % p["date"], "",
           "| change | %s | also |" % " | ".join(
               "`%s`" % w for w in workloads),
           "|---" * (len(workloads) + 2) + "|"]
    for name, change in PERF_OFF_ROWS:
        cells = ["%+.2f" % (counts[name][w] / full[w] * 100 - 100)
                 if w in counts[name] else "" for w in workloads]
        out.append("| %s | %s | %s |" % (change, " | ".join(cells),
                                         also.get(name, "")))
    return out


# Which table goes into which document.
BLOCKS = {
    "DESIGN.md": {"perf-off": design_perf_off},
    "README.md": {"costs": readme_costs, "ext-costs": readme_ext},
    "bench/README.md": {"ratios": bench_ratios, "side-costs": bench_side},
}


# ---- update / check -------------------------------------------------------

def render(text, tables, figures, path):
    """`text` with each block's content replaced by its table."""
    for name, make in tables.items():
        start, end = "<!-- figures:%s -->\n" % name, "<!-- /figures:%s -->" % name
        head, sep, rest = text.partition(start)
        if not sep or end not in rest:
            raise SystemExit("figures: %s has no %s...%s block"
                             % (path, start.strip(), end))
        _, _, tail = rest.partition(end)
        text = head + start + "\n".join(make(figures)) + "\n" + end + tail
    return text


def stale(figures, root=ROOT):
    """(path, text it should have) of every document whose tables differ."""
    out = []
    for rel, tables in BLOCKS.items():
        path = os.path.join(root, rel)
        with open(path, encoding="utf-8") as fp:
            text = fp.read()
        want = render(text, tables, figures, rel)
        if want != text:
            out.append((path, want))
    return out


def load(path=RESULTS):
    with open(path, encoding="utf-8") as fp:
        return json.load(fp)


def write(doc):
    with open(RESULTS + ".tmp", "w", encoding="utf-8") as fp:
        json.dump(doc, fp, indent=1, ensure_ascii=False)
        fp.write("\n")
    os.replace(RESULTS + ".tmp", RESULTS)
    print("figures: wrote %s" % os.path.relpath(RESULTS, ROOT))


def main(argv):
    if argv[:1] == ["collect"] and len(argv) in (3, 4):
        docs = []
        for path in argv[1:]:
            with open(path) as fp:
                docs.append(json.load(fp))
        write(collect(*docs))
    elif argv[:1] == ["collect-perf-off"] and len(argv) == 2:
        doc = load()
        with open(argv[1]) as fp:
            doc["perf_off"] = json.load(fp)
        write(doc)
    elif argv == ["update"]:
        for path, text in stale(load()):
            with open(path, "w", encoding="utf-8") as fp:
                fp.write(text)
            print("figures: updated %s" % os.path.relpath(path, ROOT))
    elif argv == ["check"]:
        paths = [os.path.relpath(p, ROOT) for p, _ in stale(load())]
        if paths:
            print("figures: %s differ from bench/results.json; run "
                  "`python3 bench/figures.py update`" % ", ".join(paths),
                  file=sys.stderr)
            return 1
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
