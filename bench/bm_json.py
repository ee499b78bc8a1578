"""Dicts and json (C-heavy).

Round trips of a nested document through the C json encoder and decoder,
plus dict building, merging and lookups.  Few Python-level calls: this
shows what the perf hook costs on code that mostly runs in C.
"""
import json

import harness

LOOPS = 20  # repetitions of work(): about 0.3 s in all


def make_document(n):
    return {
        "version": 3,
        "items": [
            {"id": i, "name": "item-%d" % i, "price": i * 0.25,
             "tags": ["t%d" % (i % 7), "t%d" % (i % 11)],
             "stock": {"warehouse": i % 5, "count": i * 3, "ok": i % 2 == 0}}
            for i in range(n)
        ],
    }


def work():
    doc = make_document(2000)
    total = 0
    for _ in range(2):
        text = json.dumps(doc, sort_keys=True)
        back = json.loads(text)
        total += len(text) + len(back["items"])
        by_name = {item["name"]: item for item in back["items"]}
        merged = {**by_name, **{k: None for k in list(by_name)[:100]}}
        total += sum(1 for v in merged.values() if v is None)
        total += sum(by_name["item-%d" % i]["stock"]["count"]
                     for i in range(0, 2000, 3))
    return total


def check(result):
    assert result > 0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
