#!/bin/bash
# make picture: the README's flame graph, examples/flamegraph.png.  A real
# `python -m perf_trampoline record` run of examples/demo.py with the
# development build, then headless Chromium draws its
# flamegraph-python.html offline and saves what it shows.  Needs perf
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
say "recording examples/demo.py"
cd "$ROOT"    # so that the names read examples/demo.py
"$PYTHON" -I -m perf_trampoline record -o "$OUT/record" -- \
    "$PYTHON" examples/demo.py >"$OUT/record.txt" 2>&1
page=$OUT/record/flamegraph-python.html
[ -s "$page" ] || { say "record wrote no $page (log: $OUT/record.txt)"; exit 1; }

say "drawing $page"
# Offline: every host name resolves to nothing.
"$chromium" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
    --user-data-dir="$OUT/chromium" --host-resolver-rules="MAP * ~NOTFOUND" \
    --hide-scrollbars --window-size="$SIZE" --virtual-time-budget=5000 \
    --screenshot="$OUT/flamegraph.png" "file://$page" \
    >"$OUT/chromium.log" 2>&1 ||
    { say "chromium failed (log: $OUT/chromium.log)"; exit 1; }
cp "$OUT/flamegraph.png" "$PNG"
say "wrote $PNG ($(stat -c %s "$PNG") bytes)"
