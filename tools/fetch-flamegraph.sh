#!/bin/bash
# Print the path of a verified d3-flamegraph-base.html, the template of
# perf's flamegraph report script, fetching it if needed.
#
# It comes from d3-flame-graph's npm package ($FLAMEGRAPH_VERSION, lib.sh),
# got with `npm pack` from npm's own configured registry (npm checks the
# package's integrity), and is checked against the MD5 that perf's
# flamegraph.py carries for it and our SHA-256.  Kept in the user's cache
# directory, like the CPython tarball (tools/fetch-source.sh).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

CACHED=$CACHE_DIR/d3-flamegraph-base-$FLAMEGRAPH_VERSION.html
PACKAGE=d3-flame-graph@$FLAMEGRAPH_VERSION
say() { echo "fetch-flamegraph: $*" >&2; }

verified() {
    [ -f "$1" ] &&
        [ "$(md5sum <"$1" | cut -c1-32)" = "$FLAMEGRAPH_MD5" ] &&
        [ "$(sha256sum <"$1" | cut -c1-64)" = "$FLAMEGRAPH_SHA256" ]
}

if verified "$CACHED"; then
    echo "$CACHED"
    exit 0
fi
[ -f "$CACHED" ] && say "cached $CACHED has the wrong checksum; fetching again"
command -v npm >/dev/null ||
    { say "error: npm is not installed (run: tools/install-deps.sh)"; exit 1; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
say "npm pack $PACKAGE"
# Its own cache too: npm's default one may belong to another user.
(cd "$work" && npm pack --silent --cache "$work/npm-cache" "$PACKAGE") \
    >"$work/pack.log" 2>&1 || {
    cat "$work/pack.log" >&2
    say "error: npm pack $PACKAGE failed (output above)"
    exit 1
}
tar -xzf "$work/d3-flame-graph-$FLAMEGRAPH_VERSION.tgz" -C "$work" \
    package/dist/templates/d3-flamegraph-base.html ||
    { say "error: $PACKAGE has no dist/templates/d3-flamegraph-base.html"; exit 1; }
template=$work/package/dist/templates/d3-flamegraph-base.html
verified "$template" || {
    say "error: d3-flamegraph-base.html of $PACKAGE does not have the expected"
    say "checksums (MD5 $FLAMEGRAPH_MD5, SHA-256 $FLAMEGRAPH_SHA256)"
    exit 1
}
mkdir -p "$CACHE_DIR"
cp "$template" "$CACHED.tmp.$$" && mv "$CACHED.tmp.$$" "$CACHED"
echo "$CACHED"
