#!/bin/bash
# make bench's perf-off step: what each change of the evaluator patch that
# acts with perf off wins (DESIGN.md, "With perf off").  Builds, in one copy
# of the assembled tree (build/cpython-perfoff, configured as `make`'s, so
# optimized but without PGO or LTO), the interpreter once per change with
# that change undone (bench/perf_off/NAME.patch), once with ceval.c
# compiled without frame records, and once with the whole patch, then
# measures them with bench/perf_off.py (arguments passed on), stock
# 3.11.2 (tools/bench-stock.sh) beside them.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
DIR=$ROOT/build/cpython-perfoff
PATCHES=$ROOT/bench/perf_off
say() { echo "bench-perf-off: $*" >&2; }
[ -x "$TREE/python" ] || { say "$TREE/python is not built (run 'make')"; exit 1; }
command -v valgrind >/dev/null || {
    say "needs valgrind (Debian package valgrind: apt-get install valgrind)"
    exit 1
}
# Stock 3.11.2 as make bench builds it: the C stack's baseline.
"$ROOT/tools/bench-stock.sh" "$ROOT/build/cpython-stock"

# The copy keeps the tree's configuration and objects, so a variant
# recompiles only the files its change is in.  It is made again whenever
# the tree's interpreter was rebuilt.
tree_id=$(stat -c '%Y %s' "$TREE/python")
if [ "$(cat "$DIR/.perf-off-tree" 2>/dev/null)" != "$tree_id" ]; then
    say "copying $TREE to $DIR"
    rm -rf --one-file-system "$DIR"
    cp -a "$TREE" "$DIR"
    echo "$tree_id" >"$DIR/.perf-off-tree"
fi

# Every file a variant changes starts each build as the tree has it, and
# is compiled again.
mapfile -t files < <(sed -n 's|^+++ b/||p' "$PATCHES"/*.patch | sort -u)
restore() {
    local f
    for f in "${files[@]}"; do
        cmp -s "$TREE/$f" "$DIR/$f" || cp "$TREE/$f" "$DIR/$f"
        rm -f "$DIR/${f%.c}.o"
    done
}

# full: the whole patch; records: ceval.c without frame records (no
# reserved register, no per-call record checks).
variants=(full records)
for p in "$PATCHES"/*.patch; do
    variants+=("$(basename "$p" .patch)")
done
for v in "${variants[@]}"; do
    exe=$DIR/variant-$v
    case $v in
    full|records) want="$v $tree_id" ;;
    *) want="$(sha256sum <"$PATCHES/$v.patch" | cut -c1-64) $tree_id" ;;
    esac
    if [ -x "$exe" ] && [ "$(cat "$exe.stamp" 2>/dev/null)" = "$want" ]; then
        continue
    fi
    say "building $v"
    restore
    make_args=()
    case $v in
    full) ;;
    records) make_args=(PERF_EVAL_CFLAGS=) ;;
    *) git -C "$DIR" apply "$PATCHES/$v.patch" || {
           say "bench/perf_off/$v.patch does not apply to the tree: update it"
           exit 1
       } ;;
    esac
    make -C "$DIR" -s python "${make_args[@]}" >"$DIR/build-$v.log" 2>&1 || {
        grep -m 30 -E 'error|Error' "$DIR/build-$v.log" >&2 || true
        say "make failed; full log in $DIR/build-$v.log"
        exit 1
    }
    cp "$DIR/python" "$exe"
    echo "$want" >"$exe.stamp"
done
restore

driver=$(command -v python3 || echo "$TREE/python")
"$driver" "$ROOT/bench/perf_off.py" --dir "$DIR" "${variants[@]/#/--variant=}" "$@"
