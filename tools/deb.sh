#!/bin/bash
# make deb: Debian 12's python3.11 binary packages with the perf
# trampolines, built by Debian's own debian/rules:
#   tools/deb.sh [--source] PATCH
# PATCH is the dist patch (tools/dist.sh).  The source package is Debian's
# newest revision (tools/fetch-debian.sh) on the orig tarball (our verified
# Python-3.11.2.tgz, byte-identical to Debian's), with:
#   - debian/patches/perf-trampolines.diff, last in the quilt series: PATCH
#     less configure, which debian/rules regenerates with autoconf (its
#     stamp-patch); pyconfig.h.in stays in it, as Debian runs no autoheader;
#     plus the flame graph template (tools/fetch-flamegraph.sh), which
#     `python3 -m perf_trampoline record` draws with;
#   - debian/rules: every build configured --with-frame-pointers=python (a
#     frame record on each function of the Python call chain, so that
#     `perf record -g` unwinds through the interpreter), and our own tests,
#     which run perf, left out of the PGO training run;
#   - a changelog entry of version <Debian's>+perf<N>: apt prefers it to
#     the revision it is built on, and Debian's next revision to it.
# It is written to build/deb/src (dpkg-source -b: the .dsc, its
# .debian.tar.xz and the orig tarball).  --source stops there and prints
# the .dsc's path (the tooling tests check it).  Otherwise the .dsc is
# unpacked with dpkg-source -x (which applies the series with fuzz 0)
# into build/deb/build, its Build-Depends are installed
# (tools/install-deps.sh deb), and `dpkg-buildpackage -B` builds the
# architecture-dependent packages into build/deb/ (DEB_BUILD_OPTIONS from
# the environment, "nocheck parallel=<cores>" if unset).
set -euo pipefail
. "$(dirname "$0")/lib.sh"
say() { echo "deb: $*" >&2; }

# Raised when the packages change without a new Debian revision under them.
PERF_REVISION=1
PACKAGE=python3.11
SERIES_PATCH=perf-trampolines.diff

source_only=
if [ "${1:-}" = --source ]; then
    source_only=1
    shift
fi
patch=$(realpath "${1:?usage: tools/deb.sh [--source] PATCH}")
WORK=$(realpath -m "${DEB_WORK:-$ROOT/build/deb}")
SRC=$WORK/src
TREE=$SRC/$PACKAGE-$CPYTHON_VERSION

# series_patch: PATCH without its configure, with a DEP-3 header.
series_patch() {
    printf '%s\n' \
        "Description: perf trampolines: Linux perf names Python functions" \
        " -X perf, -X perf_jit, PYTHONPERFSUPPORT=1 and" \
        " sys.activate_stack_trampoline(\"perf\"), as a patch on Debian's series." \
        " configure is left out: debian/rules regenerates it from configure.ac." \
        "Forwarded: not-needed" ""
    awk '/^diff --git / { started = 1; skip = ($3 == "a/configure") }
         started && !skip' "$patch"
    new_file_diff "$FLAMEGRAPH_TEMPLATE" "$("$ROOT/tools/fetch-flamegraph.sh")"
}

# new_file_diff PATH FILE: a git diff creating PATH with FILE's lines (the
# flame graph template, which the dist patch leaves out: the source
# package carries what the packages install).
new_file_diff() {
    local lines
    lines=$(wc -l <"$2")
    printf 'diff --git a/%s b/%s\nnew file mode 100644\n--- /dev/null\n+++ b/%s\n@@ -0,0 +1,%d @@\n' \
        "$1" "$1" "$1" "$lines"
    sed 's/^/+/' "$2"
}

# changelog_entry VERSION: ours, dated as the repository's HEAD commit, so
# the same commit makes the same source package.
changelog_entry() {
    local when
    when=$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || date +%s)
    printf '%s\n' \
        "$PACKAGE ($1) $DEBIAN_RELEASE; urgency=medium" "" \
        "  * Perf trampolines: Linux perf names Python functions (-X perf," \
        "    PYTHONPERFSUPPORT=1, sys.activate_stack_trampoline(\"perf\"), -X perf_jit)." \
        "    debian/patches/$SERIES_PATCH, last in the series." \
        "  * debian/rules: configure every build --with-frame-pointers=python, so" \
        "    perf record -g unwinds the Python call chain; leave test_perf_profiler" \
        "    (it runs perf) out of the PGO training run." \
        "" \
        " -- ${DEBFULLNAME:-perf-trampolines} <${DEBEMAIL:-root@localhost}>  $(LC_ALL=C date -R -u -d "@$when")" \
        ""
}

# The debian/rules changes the changelog entry names; each must match.
edit_rules() {
    local rules=$TREE/debian/rules
    sed -i -e 's/^\t\t--with-computed-gotos \\$/&\n\t\t--with-frame-pointers=python \\/' \
        -e 's/^PROFILE_EXCLUDES += test_cppext$/&\nPROFILE_EXCLUDES += test_perf_profiler/' \
        "$rules"
    grep -q -- '--with-frame-pointers=python' "$rules" &&
        grep -q '^PROFILE_EXCLUDES += test_perf_profiler$' "$rules" || {
        say "error: debian/rules of this revision does not look as expected; not edited"
        exit 1
    }
}

tarball=$("$ROOT/tools/fetch-source.sh")
debian=$("$ROOT/tools/fetch-debian.sh")
base=$(basename "$debian" .debian.tar.xz)
base=${base#"${PACKAGE}_"}
version=$base+perf$PERF_REVISION

say "source package $PACKAGE $version in $SRC"
rm -rf "$SRC"
mkdir -p "$SRC"
cp "$tarball" "$SRC/${PACKAGE}_$CPYTHON_VERSION.orig.tar.gz"
unpack_source "$tarball" "$TREE"
tar -xJf "$debian" -C "$TREE"
series_patch >"$TREE/debian/patches/$SERIES_PATCH"
echo "$SERIES_PATCH" >>"$TREE/debian/patches/series"
edit_rules
{ changelog_entry "$version"; cat "$TREE/debian/changelog"; } >"$TREE/debian/changelog.new"
mv "$TREE/debian/changelog.new" "$TREE/debian/changelog"
# -b applies the series (fuzz 0) before it packs the tree.
(cd "$SRC" && dpkg-source -b "$PACKAGE-$CPYTHON_VERSION") >"$SRC/dpkg-source.log" 2>&1 || {
    tail -20 "$SRC/dpkg-source.log" >&2
    say "error: dpkg-source -b failed (log: $SRC/dpkg-source.log)"
    exit 1
}
rm -rf "$TREE"
dsc=$SRC/${PACKAGE}_$version.dsc
say "wrote $dsc"
if [ -n "$source_only" ]; then
    echo "$dsc"
    exit 0
fi

build=$WORK/build
rm -rf "$build"
mkdir -p "$build"
dpkg-source -x "$dsc" "$build/$PACKAGE-$CPYTHON_VERSION" >"$build/dpkg-source.log" 2>&1 || {
    tail -20 "$build/dpkg-source.log" >&2
    say "error: dpkg-source -x failed (log: $build/dpkg-source.log)"
    exit 1
}
"$ROOT/tools/install-deps.sh" deb "$build/$PACKAGE-$CPYTHON_VERSION"

export DEB_BUILD_OPTIONS=${DEB_BUILD_OPTIONS:-nocheck parallel=$(nproc)}
log=$WORK/build.log
say "dpkg-buildpackage -B, DEB_BUILD_OPTIONS=\"$DEB_BUILD_OPTIONS\" (log: $log;" \
    "PGO and LTO: an hour or more)"
started=$SECONDS
(cd "$build/$PACKAGE-$CPYTHON_VERSION" && dpkg-buildpackage -B -us -uc) >"$log" 2>&1 || {
    tail -30 "$log" >&2
    say "error: dpkg-buildpackage failed (log: $log)"
    exit 1
}
rm -f "$WORK"/*.deb
mv "$build"/*.deb "$WORK/"
say "built in $(( (SECONDS - started) / 60 )) min:"
(cd "$WORK" && ls -1 ./*.deb) >&2
