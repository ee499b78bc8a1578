#!/bin/bash
# make picture: the README's flame graph, examples/flamegraph.png.  A real
# `python -m perf_trampoline record` run of examples/demo.py with the
# development build, then headless Chromium draws its
# flamegraph-python.html offline and saves what it shows.  Python 3.11
# makes every file name absolute (the script's and each import's), so the
# names hold the path of the tree the picture is made in: the page drawn
# leaves that prefix out, and the README's caption says so.  Needs perf
# allowed to record and chromium (make deps-test installs it).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
PYTHON=$TREE/python
OUT=$ROOT/build/picture
PNG=${PICTURE:-$ROOT/examples/flamegraph.png}
# Wide enough for the demo's names, low enough to keep the file small.
SIZE=${PICTURE_SIZE:-1000,620}

say() { echo "picture: $*" >&2; }
[ -x "$PYTHON" ] || { say "$PYTHON is not built (run: make)"; exit 1; }
chromium=$(command -v chromium) ||
    { say "chromium is not installed (run: make deps-test)"; exit 1; }

rm -rf "$OUT"
mkdir -p "$OUT"
chmod 700 "$OUT"
# The interpreter finds its library by its real path: so is the demo run.
root=$(realpath "$ROOT")
say "recording examples/demo.py"
"$PYTHON" -I -m perf_trampoline record -o "$OUT/record" -- \
    "$PYTHON" "$root/examples/demo.py" >"$OUT/record.txt" 2>&1
recorded=$OUT/record/flamegraph-python.html
[ -s "$recorded" ] ||
    { say "record wrote no $recorded (log: $OUT/record.txt)"; exit 1; }

say "drawing $recorded, file names relative to $root"
page=$OUT/flamegraph-python.html
# The page holds the names as JSON strings.
"$PYTHON" -I - "$recorded" "$root/" "$page" <<'EOF'
import json
import sys

recorded, prefix, page = sys.argv[1:]
with open(recorded, encoding="utf-8") as f:
    text = f.read()
with open(page, "w", encoding="utf-8") as f:
    f.write(text.replace(json.dumps(prefix)[1:-1], ""))
EOF
# Offline: every host name resolves to nothing.
"$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --user-data-dir="$OUT/chromium" --host-resolver-rules="MAP * ~NOTFOUND" \
    --hide-scrollbars --window-size="$SIZE" --virtual-time-budget=5000 \
    --screenshot="$OUT/flamegraph.png" "file://$page" \
    >"$OUT/chromium.log" 2>&1 ||
    { say "chromium failed (log: $OUT/chromium.log)"; exit 1; }
cp "$OUT/flamegraph.png" "$PNG"
say "wrote $PNG ($(stat -c %s "$PNG") bytes)"
