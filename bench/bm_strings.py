"""Strings and regular expressions.

Mostly C work: str methods (split, join, replace, format, upper), f-strings,
and the re module (compiled patterns, finditer, sub with a string template
and with a Python callback).
"""
import re

import harness

LOOPS = 18  # repetitions of work(): about 0.3 s in all

LINE = ("2024-03-01 12:00:%02d INFO  worker-%d handled GET /api/v1/items/%d "
        "in %d ms (user=alice@example.org)")
STAMP = re.compile(r"(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2})")
REQUEST = re.compile(r"(GET|POST) (\S+) in (\d+) ms")
EMAIL = re.compile(r"[\w.]+@[\w.]+")


def make_log(n):
    return "\n".join(LINE % (i % 60, i % 8, i, i % 250) for i in range(n))


def summarize(log):
    slow = 0
    paths = {}
    for line in log.split("\n"):
        m = REQUEST.search(line)
        if m and int(m.group(3)) > 200:
            slow += 1
        head, _, rest = line.partition(" INFO  ")
        worker = rest.split(" ", 1)[0].upper()
        paths[worker] = paths.get(worker, 0) + 1
    return slow, paths


def anonymize(log):
    log = EMAIL.sub("<email>", log)
    return STAMP.sub(lambda m: "%s/%s" % (m.group(3), m.group(2)), log)


def work():
    total = 0
    for _ in range(1):
        log = make_log(2500)
        slow, paths = summarize(log)
        total += slow + len(paths)
        total += len(anonymize(log))
        total += sum(1 for _ in STAMP.finditer(log))
        total += len(f"{total:>12}|{slow:08x}".replace(" ", "."))
    return total


def check(result):
    assert result > 0, result


if __name__ == "__main__":
    harness.run_in_chunks(work, LOOPS, check)
