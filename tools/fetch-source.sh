#!/bin/bash
# Print the path of a verified Python-3.11.2.tgz, fetching it if needed.
#
# Sources, in order: $CPYTHON_TARBALL; the user-level cache; Debian's source
# archive through apt (python3.11's orig tarball is byte-identical to the
# python.org release); python.org over https.  The apt lookup uses a private
# sources list and lists directory derived from the machine's own apt
# configuration, so the system's apt state is never changed.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

CACHED=$CACHE_DIR/Python-$CPYTHON_VERSION.tgz
tried=()

say() { echo "fetch-source: $*" >&2; }

verified() {
    [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$CPYTHON_SHA256" ]
}

store() {
    mkdir -p "$CACHE_DIR"
    cp "$1" "$CACHED.tmp.$$" && mv "$CACHED.tmp.$$" "$CACHED"
}

from_apt() {
    command -v apt-get >/dev/null || return 1
    local work uri name hash
    work=$(mktemp -d)
    trap 'rm -rf "$work"; trap - RETURN' RETURN
    debian_source_list "$work/sources.list" || return 1
    say "looking up python3.11 in Debian's source archive ($(apt_mirrors | tr '\n' ' '))"
    private_apt "$work" apt-get -qq update >&2 2>"$work/update.log" || {
        say "apt-get update of the private source list failed:"; cat "$work/update.log" >&2
        return 1
    }
    # Only the orig tarball matters; the .dsc and Debian tarball may be gone.
    # (run in the empty work dir: apt skips files already in the cwd)
    read -r uri name _ hash < <(cd "$work" && private_apt "$work" apt-get source \
        --print-uris python3.11 2>/dev/null |
        awk -v want="_$CPYTHON_VERSION.orig.tar.gz" 'index($0, want) && !found++') || {
        say "no python3.11 $CPYTHON_VERSION orig tarball in the source archive"; return 1
    }
    uri=${uri//\'/}
    say "downloading $name"
    /usr/lib/apt/apt-helper download-file "$uri" "$work/$name" "$hash" >&2 2>"$work/dl.log" ||
        { cat "$work/dl.log" >&2; return 1; }
    verified "$work/$name" || { say "$name from apt has the wrong checksum"; return 1; }
    store "$work/$name"
}

from_python_org() {
    command -v curl >/dev/null || return 1
    local tmp url=https://www.python.org/ftp/python/$CPYTHON_VERSION/Python-$CPYTHON_VERSION.tgz
    tmp=$(mktemp)
    say "downloading $url"
    if curl -fsSL --connect-timeout 15 -o "$tmp" "$url" && verified "$tmp"; then
        store "$tmp"; rm -f "$tmp"
    else
        rm -f "$tmp"; return 1
    fi
}

if [ -n "${CPYTHON_TARBALL:-}" ]; then
    if verified "$CPYTHON_TARBALL"; then
        echo "$CPYTHON_TARBALL"; exit 0
    fi
    say "error: CPYTHON_TARBALL=$CPYTHON_TARBALL is missing or its sha256 is not $CPYTHON_SHA256"
    exit 1
fi
tried+=("\$CPYTHON_TARBALL (unset)")

if verified "$CACHED"; then
    echo "$CACHED"; exit 0
fi
[ -f "$CACHED" ] && say "cached $CACHED has the wrong checksum; fetching again"
tried+=("cache $CACHED")

if from_apt; then echo "$CACHED"; exit 0; fi
tried+=("Debian source archive via apt")
if from_python_org; then echo "$CACHED"; exit 0; fi
tried+=("python.org over https")

say "error: no verified Python-$CPYTHON_VERSION.tgz (sha256 $CPYTHON_SHA256). Tried:"
for t in "${tried[@]}"; do say "  - $t"; done
say "Download it by hand and run again with CPYTHON_TARBALL=/path/to/Python-$CPYTHON_VERSION.tgz"
exit 1
