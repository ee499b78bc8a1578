"""A small request-handling service to profile with perf.

Each request is parsed from JSON, validated with a regular expression,
priced with float arithmetic and rendered back to JSON, so a profile shows
Python functions calling into C code (the json scanner, the re engine,
float operations).  Run it under perf with -X perf:

    perf record -F 999 -g -- python -X perf examples/demo.py
    perf report
"""

import json
import re

SKU = re.compile(r"^[A-Z]{3}-\d{4}-[a-z]{2}$")


def make_requests(count):
    return [json.dumps({"id": i, "sku": f"ABC-{i % 10000:04d}-xy",
                        "qty": 1 + i % 7, "price": 9.99 + i % 13,
                        "tags": ["demo", "perf", str(i)]})
            for i in range(count)]


def parse(raw):
    return json.loads(raw)


def validate(order):
    if not SKU.match(order["sku"]):
        raise ValueError(f"bad sku {order['sku']!r}")
    return order


def price(order):
    total = 0.0
    for _ in range(40):
        total += order["qty"] * order["price"] * 1.0825
        total = round(total, 2) / 1.0001
    return total


def render(order, total):
    return json.dumps({"id": order["id"], "total": total}, sort_keys=True)


def handle_request(raw):
    order = validate(parse(raw))
    return render(order, price(order))


def serve(requests):
    return [handle_request(raw) for raw in requests]


def main():
    requests = make_requests(2000)
    for _ in range(15):
        responses = serve(requests)
    print(f"served {len(responses)} requests x 15; last: {responses[-1]}")


if __name__ == "__main__":
    main()
