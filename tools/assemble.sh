#!/bin/bash
# Assemble build/cpython: the pristine 3.11.2 source as one commit (tag
# "pristine"), then our overlay files, patches and the regenerated configure
# as a second commit (tag "overlay").  The new commit is built in a private
# index and checked out with one "git reset", so files whose content did not
# change keep their timestamps and an incremental build stays incremental.
# Edits in the tree that were not exported are never thrown away.  The
# flame graph template, third-party code, is copied in beside them
# (lib.sh: flamegraph_into), never committed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

say() { echo "assemble: $*" >&2; }
git_t() { git -C "$TREE" "$@"; }

new_tree() {
    local tarball
    tarball=$("$ROOT/tools/fetch-source.sh")
    say "unpacking $(basename "$tarball") into $TREE"
    unpack_source "$tarball" "$TREE"
    git_t init -q
    git_t config user.name "perf-trampolines"
    git_t config user.email "perf-trampolines@localhost"
    git_t config core.autocrlf false
    cp "$ROOT/tools/tree-exclude" "$TREE/.git/info/exclude"
    git_t add -A
    git_t commit -q -m "Pristine CPython 3.11.2"
    git_t tag pristine
}

# True if the tree holds nothing beyond what it was last assembled from or
# exported to (the stamp), or beyond what the repository holds now (the
# tree's edits were committed by hand, not through export).
tree_is_exported() {
    local have
    if [ "$(git_t rev-parse HEAD)" = "$(git_t rev-parse -q --verify 'overlay^{commit}' || true)" ] &&
       [ -z "$(git_t status --porcelain)" ]; then
        return 0
    fi
    have=$("$ROOT/tools/export.sh" --hash 2>/dev/null) || return 1
    [ "$have" = "$(cat "$stamp" 2>/dev/null)" ] || [ "$have" = "$want" ]
}

make_overlay_commit() {
    local index=$TREE/.git/overlay-index work f mode
    rm -f "$index"
    work=$(mktemp -d)
    trap 'rm -rf "$work"; rm -f "$index"' RETURN
    export GIT_INDEX_FILE=$index
    git_t read-tree pristine
    while read -r f; do
        mode=100644; [ -x "$ROOT/$f" ] && mode=100755
        git_t update-index --add --cacheinfo "$mode,$(git_t hash-object -w "$ROOT/$f"),$f"
    done < <(overlay_files)
    while read -r f; do
        git_t apply --cached --whitespace=nowarn "$ROOT/$f" ||
            { say "error: $f does not apply to the pristine source"; exit 1; }
    done < <(patch_files)
    git_t checkout-index --prefix="$work/" configure.ac aclocal.m4
    say "regenerating configure with autoconf 2.69"
    (cd "$work" && autoconf2.69 && autoheader2.69) ||
        { say "error: autoconf2.69 failed (tools/install-deps.sh installs it)"; exit 1; }
    git_t update-index --add --cacheinfo "100755,$(git_t hash-object -w "$work/configure"),configure"
    git_t update-index --add --cacheinfo "100644,$(git_t hash-object -w "$work/pyconfig.h.in"),pyconfig.h.in"
    git_t commit-tree "$(git_t write-tree)" -p pristine -m "Overlay and patches"
    unset GIT_INDEX_FILE
}

# configure is generated from configure.ac; when a developer edits
# configure.ac inside the tree, regenerate it there.
configure_ac_hash() { sha256sum <"$TREE/configure.ac" | cut -c1-64; }
regen_configure_in_tree() {
    [ "$(configure_ac_hash)" = "$(cat "$TREE/.git/configure-ac" 2>/dev/null)" ] && return 0
    say "configure.ac changed: regenerating configure with autoconf 2.69"
    (cd "$TREE" && autoconf2.69 && autoheader2.69 && rm -rf autom4te.cache pyconfig.h.in~) ||
        { say "error: autoconf2.69 failed"; exit 1; }
    configure_ac_hash >"$TREE/.git/configure-ac"
}

stamp=$TREE/.git/overlay-inputs
want=$(inputs_hash)
if [ -d "$TREE/.git" ] && git_t rev-parse -q --verify pristine >/dev/null; then
    cp "$ROOT/tools/tree-exclude" "$TREE/.git/info/exclude"
    if [ "$(cat "$stamp" 2>/dev/null)" = "$want" ] && [ "${1:-}" != --force ]; then
        regen_configure_in_tree
        flamegraph_into "$TREE"
        exit 0
    fi
    if ! tree_is_exported; then
        say "error: $TREE has edits that are not exported to the repository."
        say "Run 'make export' to keep them (or discard them with"
        say "'git -C $TREE reset --hard overlay'), then run this again."
        exit 1
    fi
else
    new_tree
fi

commit=$(make_overlay_commit)
git_t reset -q --hard "$commit"
git_t tag -f overlay "$commit" >/dev/null
echo "$want" >"$stamp"
configure_ac_hash >"$TREE/.git/configure-ac"
flamegraph_into "$TREE"
say "$TREE is pristine 3.11.2 + $(overlay_files | wc -l) overlay files + $(patch_files | wc -l) patches"
