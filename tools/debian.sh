#!/bin/bash
# make debian: Debian 12's own python3.11 with the perf trampolines, in
# build/cpython-debian, configured for PREFIX:
#   tools/debian.sh [--install DESTDIR | --tree] PATCH PREFIX [CONFIGURE ARGS...]
# --install (make install-debian): then install it into DESTDIR/PREFIX as
# `make altinstall` does (DESTDIR may be empty).  --tree (the tooling
# tests): only assemble the tree, and print the configure arguments, one
# a line.
#
# The tree is the orig tarball (our verified Python-3.11.2.tgz, which is
# byte-identical to Debian's), the debian/ directory of Debian's newest
# revision (tools/fetch-debian.sh) with its patch series applied in order
# as dpkg-source applies it (patch -p1, no fuzz), then PATCH
# (tools/dist.sh), and configure regenerated with autoconf 2.69 from the
# configure.ac that Debian's patches and ours make.  It is made again when
# one of the three inputs, or this script, changed.
#
# It is configured as debian/rules configures Debian's shared build: the
# same options (DEBIAN_ARGS), the same compiler and linker flags
# (dpkg-buildflags as debian/rules asks for them), and the extension
# modules of python3.11-minimal linked into libpython as Debian links
# them.  What differs (the prefix, frame pointers, LTO and PGO) is said in
# BUILDING.md.  The interpreter finds its own libpython through its rpath,
# in this tree and installed under PREFIX alike: never Debian's
# libpython3.11.so.1.0 in /usr/lib.
set -euo pipefail
export TREE=${TREE:-$(dirname "$0")/../build/cpython-debian}
. "$(dirname "$0")/lib.sh"
say() { echo "debian: $*" >&2; }

mode=build
case ${1:-} in
--install) mode=install; destdir=${2:+$(realpath -m "$2")}; shift 2 ;;
--tree) mode=tree; shift ;;
esac
[ $# -ge 2 ] || {
    say "usage: $0 [--install DESTDIR | --tree] PATCH PREFIX [CONFIGURE ARGS...]"
    exit 2
}
patch=$(realpath "$1")
prefix=$2
shift 2
absolute_prefix "$prefix"

# debian/rules: common_configure_args and the shared build's
# --enable-shared, less --prefix and --libdir (ours is PREFIX and its
# lib/), on an architecture with libffi.
DEBIAN_ARGS=(--enable-shared --enable-ipv6 --enable-loadable-sqlite-extensions
             --with-dbmliborder=bdb:gdbm --with-computed-gotos
             --without-ensurepip --with-system-expat --with-system-ffi
             --with-dtrace --with-ssl-default-suites=openssl
             --with-wheel-pkg-dir=/usr/share/python-wheels/
             "MKDIR_P=/bin/mkdir -p")

# apply_series: Debian's patches, in the order of debian/patches/series
# (a line may add patch options, as quilt allows).
apply_series() {
    local name opts n=0
    while read -r name opts; do
        case $name in "" | "#"*) continue ;; esac
        patch -d "$TREE" -s -p1 -E --fuzz=0 --batch --no-backup-if-mismatch \
            ${opts:-} <"$TREE/debian/patches/$name" >&2 || {
            say "error: Debian's $name does not apply"; exit 1
        }
        n=$((n + 1))
    done <"$TREE/debian/patches/series"
    say "applied Debian's $n patches"
}

# debian/rules' __post_configure: the extension modules that
# python3.11-minimal lists go into Modules/Setup.local, so they are
# linked into libpython, not built as shared modules.
minimal_setup_local() {
    local names
    names=$(awk -v ORS='|' '$2 ~ /^extension$/ { print $1 }' \
        "$TREE/debian/PVER-minimal.README.Debian.in")
    grep -E "^#(${names}XX)" "$TREE/Modules/Setup" |
        sed -e 's/^#//' -e 's/-Wl,-Bdynamic//; s/-Wl,-Bstatic//' \
        >"$TREE/Modules/Setup.local"
}

assemble() {
    say "unpacking $(basename "$tarball") and $(basename "$debian") into $TREE"
    unpack_source "$tarball" "$TREE"
    tar -xJf "$debian" -C "$TREE"
    apply_series
    say "applying $(basename "$patch")"
    patch -d "$TREE" -s -p1 --fuzz=0 --batch --no-backup-if-mismatch \
        <"$patch" >&2 || {
        say "error: $patch does not apply on top of Debian's patches"; exit 1
    }
    say "regenerating configure with autoconf 2.69"
    # --force: configure was just patched, within the same second as
    # configure.ac, and autoconf compares whole seconds.
    (cd "$TREE" && autoconf2.69 --force && autoheader2.69 --force &&
        rm -rf autom4te.cache pyconfig.h.in~) ||
        { say "error: autoconf2.69 failed (tools/install-deps.sh installs it)"; exit 1; }
    minimal_setup_local
}

# buildflag NAME: Debian's value, as debian/rules gets it: no PIE, and
# in CFLAGS -fstack-protector for -strong and no -O (CPython's -O3 rules).
buildflag() {
    (cd "$TREE" && DEB_BUILD_MAINT_OPTIONS=hardening=-pie dpkg-buildflags --get "$1") |
        if [ "$1" = CFLAGS ]; then
            sed -E 's/-fstack-protector-strong/-fstack-protector/; s/(^| )-O[^ ]*//g'
        else
            cat
        fi
}

tarball=$("$ROOT/tools/fetch-source.sh")
debian=$("$ROOT/tools/fetch-debian.sh")
stamp=$TREE/.debian-inputs
want="$(sha256sum <"$tarball" | cut -c1-64) $(basename "$debian")"
want="$want $(sha256sum <"$debian" | cut -c1-64) $(sha256sum <"$patch" | cut -c1-64)"
want="$want $(sha256sum <"$0" | cut -c1-64)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    assemble
    echo "$want" >"$stamp"
fi
# The dist patch leaves out the flame graph template (third-party code).
flamegraph_into "$TREE"

# libpython is looked for first beside an installed python3.11
# (PREFIX/bin/../lib; $ORIGIN is the directory of the binary that loads
# it), then in this tree: the tree's python, Programs/_testembed and the
# copies test_embed makes of it elsewhere all find it there.  $ORIGIN is
# escaped for the Makefile (make reads $$) and for the shell that runs its
# link commands (\$).  In LDFLAGS_NODIST, so that extension modules and
# python3.11-config do not inherit it.
rpath='-Wl,-rpath,\$$ORIGIN/../lib:'$TREE
args=(--prefix="$prefix" "${DEBIAN_ARGS[@]}"
      "CFLAGS=$(buildflag CFLAGS)" "CPPFLAGS=$(buildflag CPPFLAGS)"
      "LDFLAGS=$(buildflag LDFLAGS)" "LDFLAGS_NODIST=$rpath" "$@")
if [ $mode = tree ]; then
    printf '%s\n' "${args[@]}"
    exit 0
fi
"$ROOT/tools/build.sh" "$TREE" "${args[@]}"
say "$("$TREE/python" -c 'import sys; print(sys.version.split()[0])') at $TREE/python," \
    "from Debian's $(basename "$debian" .debian.tar.xz)"
if [ $mode = install ]; then
    altinstall "$TREE" "$prefix" "$destdir"
fi
