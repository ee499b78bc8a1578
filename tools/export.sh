#!/bin/bash
# Write the changes in build/cpython against its pristine tag back to the
# repository: new files to the overlay at their CPython paths, each changed
# upstream file to patches/<path>.patch.  Output is deterministic (sorted;
# lib.sh's tree_diff: no index lines, no timestamps) and files are only
# rewritten when their content changes, so exporting an unchanged tree
# changes nothing.
#   --check   write nothing; exit 1 if the repository differs from the tree.
#   --hash    write nothing; print the hash of what export would write.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

check=0
case "${1:-}" in
--check) check=1 ;;
--hash) check=2 ;;
esac
git_t() { git -C "$TREE" "$@"; }
say() { echo "export: $*" >&2; }

git_t rev-parse -q --verify pristine >/dev/null ||
    { say "error: $TREE is not an assembled tree (run 'make tree')"; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT

is_generated() {
    local g
    for g in "${GENERATED[@]}"; do [ "$1" = "$g" ] && return 0; done
    return 1
}

# The list is read on descriptor 3: commands in the loop must not be able
# to swallow lines of it from their standard input.
changes=$( {
    git_t diff --name-status --no-renames pristine
    git_t ls-files --others --exclude-standard | sed 's/^/A\t/'
} | LC_ALL=C sort -t$'\t' -k2 -u )
while IFS=$'\t' read -r status path <&3; do
    [ -n "$path" ] || continue
    is_generated "$path" && continue
    if [ "$status" = A ] && ! git_t cat-file -e "pristine:$path" 2>/dev/null; then
        mkdir -p "$stage/$(dirname "$path")"
        cp -p "$TREE/$path" "$stage/$path"
    else
        mkdir -p "$stage/patches/$(dirname "$path")"
        tree_diff pristine -- "$path" >"$stage/patches/$path.patch"
    fi
done 3<<<"$changes"

if [ $check = 2 ]; then
    inputs_hash "$stage"
    exit 0
fi

# What the repository holds now, and what it should hold.
current=$( { overlay_files; patch_files; } )
wanted=$(cd "$stage" && find . -type f | sed 's|^\./||' | LC_ALL=C sort)

changed=0
for f in $wanted; do
    if ! cmp -s "$stage/$f" "$ROOT/$f" ||
       [ "$(stat -c %a "$stage/$f")" != "$(stat -c %a "$ROOT/$f" 2>/dev/null)" ]; then
        changed=1
        [ $check = 1 ] && { say "differs: $f"; continue; }
        mkdir -p "$ROOT/$(dirname "$f")"
        cp -p "$stage/$f" "$ROOT/$f"
        say "wrote $f"
    fi
done
for f in $current; do
    # A here-string, not a pipe: under pipefail, grep -q stopping at its
    # match could kill the writer and make a wanted file look unwanted.
    if ! grep -qxF "$f" <<<"$wanted"; then
        changed=1
        [ $check = 1 ] && { say "not in tree: $f"; continue; }
        rm -f "$ROOT/$f"
        say "removed $f"
    fi
done
if [ $check = 1 ]; then
    exit $changed
fi
[ $changed = 0 ] && say "nothing to export: the repository matches $TREE"
# Keep the assemble stamp in step: the tree already is what the repo says.
echo "$(inputs_hash)" >"$TREE/.git/overlay-inputs"
