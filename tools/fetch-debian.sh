#!/bin/bash
# Print the path of a verified Debian tarball of python3.11 for Debian 12:
# python3.11_3.11.2-<revision>.debian.tar.xz, the debian/ directory with
# Debian's patch series, of the newest revision that can be downloaded.
#
# The versions and their checksums come from the source index of
# $DEBIAN_RELEASE, its updates and its security suite (apt checks the
# index's signatures), read through a private sources list on the
# machine's mirrors (lib.sh: private_apt).  Its lists stay in
# $DEBIAN_WORK/apt, so a later run fetches only what changed, and the
# tarballs in $DEBIAN_WORK/source.  A revision is used only when its orig
# tarball is byte-identical to Python-3.11.2.tgz (the checksum in the
# index is ours) and its Debian tarball matches the index; a cached
# tarball that does not is downloaded again.  The security archive can
# list a revision its pool does not serve (yet): the next older one is
# used then, and said.  Offline, the index and tarballs already here
# serve.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PACKAGE=python3.11
ORIG=${PACKAGE}_$CPYTHON_VERSION.orig.tar.gz
WORK=$(realpath -m "${DEBIAN_WORK:-$ROOT/build/debian}")
APT_DIR=$WORK/apt
STORE=$WORK/source
say() { echo "fetch-debian: $*" >&2; }

# The checksum of FILE in the form apt prints (SHA256:<hex>).
sha256_of() { echo "SHA256:$(sha256sum <"$1" | cut -c1-64)"; }

# The 3.11.2 revisions of the package in the index, newest first (GNU
# sort -V orders "3.11.2-6+deb12u10" after "...u9", as dpkg does).
revisions() {
    private_apt "$APT_DIR" apt-cache showsrc "$PACKAGE" 2>/dev/null |
        awk -v p="$PACKAGE" -v want="$CPYTHON_VERSION-" '
            /^Package: / { name = $2 }
            /^Version: / && name == p && index($2, want) == 1 { print $2 }' |
        sort -u -V -r
}

# uris VERSION: "URI NAME SIZE HASH" for each file of the source package.
# apt leaves out files that are in its working directory: it runs in an
# empty one.
uris() {
    (cd "$WORK/empty" && private_apt "$APT_DIR" apt-get source --print-uris \
        "$PACKAGE=$1" 2>/dev/null) | sed -n "s/^'\([^']*\)' /\1 /p"
}

mkdir -p "$APT_DIR" "$STORE" "$WORK/empty"
debian_source_list "$APT_DIR/sources.list" || {
    say "error: no Debian mirror in /etc/apt/sources.list{,.d/} to read $PACKAGE's source from"
    exit 1
}
say "reading $PACKAGE's source index ($DEBIAN_RELEASE, -updates, -security)"
if ! private_apt "$APT_DIR" apt-get -qq update >"$APT_DIR/update.log" 2>&1; then
    say "warning: apt-get update failed (log: $APT_DIR/update.log);" \
        "using the index from an earlier run, if any"
fi
mapfile -t versions < <(revisions)
[ ${#versions[@]} -gt 0 ] || {
    say "error: no $PACKAGE $CPYTHON_VERSION in the source index (log: $APT_DIR/update.log)"
    exit 1
}

for v in "${versions[@]}"; do
    files=$(uris "$v") || true
    orig_hash=$(awk -v n="$ORIG" '$2 == n { print $4 }' <<<"$files")
    if [ "$orig_hash" != "SHA256:$CPYTHON_SHA256" ]; then
        say "$v: its $ORIG is not Python-$CPYTHON_VERSION.tgz (${orig_hash:-not listed}); skipped"
        continue
    fi
    read -r uri name _ hash < <(awk '$2 ~ /\.debian\.tar\.xz$/' <<<"$files") || {
        say "$v: no .debian.tar.xz listed; skipped"
        continue
    }
    case $hash in
    SHA256:*) ;;
    *) say "$v: $name has no SHA256 in the index ($hash); skipped"; continue ;;
    esac
    path=$STORE/$name
    if [ -f "$path" ] && [ "$(sha256_of "$path")" = "$hash" ]; then
        say "$PACKAGE $v: $path"
        echo "$path"
        exit 0
    fi
    [ -f "$path" ] && say "$path does not match the index; downloading it again"
    say "downloading $name"
    rm -f "$path.part"
    if private_apt "$APT_DIR" /usr/lib/apt/apt-helper download-file \
            "$uri" "$path.part" "$hash" >"$STORE/download.log" 2>&1 &&
            [ "$(sha256_of "$path.part")" = "$hash" ]; then
        mv "$path.part" "$path"
        say "$PACKAGE $v: $path"
        echo "$path"
        exit 0
    fi
    rm -f "$path.part"
    say "$v: $name is listed, but could not be downloaded:" \
        "$(grep -m1 '^E:' "$STORE/download.log" || echo "see $STORE/download.log")"
    say "trying the revision before it"
done
say "error: none of the $PACKAGE revisions listed could be had: ${versions[*]}"
exit 1
