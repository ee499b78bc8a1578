#!/bin/bash
# make install: build the interpreter for PREFIX from the dist patch and
# install it the way CPython's `make altinstall` does:
#   tools/install.sh PATCH PREFIX DESTDIR [CONFIGURE ARGS...]
# PREFIX/bin gets python3.11, pip3.11 and the other versioned names, never
# python3 or python, so no installed Python is replaced; ensurepip installs
# pip from the wheels the source bundles (no network).  With DESTDIR the
# files go to DESTDIR/PREFIX, to be moved to PREFIX later (packaging).
#
# The tree ($TREE, default build/cpython-install) is the pristine source
# with PATCH (tools/dist.sh) applied, configured --prefix=PREFIX: PREFIX is
# compiled into the interpreter and its sysconfig, so it needs a tree of its
# own, and build/cpython stays configured for development.  The tree is
# unpacked again when the tarball or PATCH changed, and rebuilt by
# tools/build.sh when PREFIX or the arguments did.
set -euo pipefail
export TREE=${TREE:-$(dirname "$0")/../build/cpython-install}
. "$(dirname "$0")/lib.sh"
say() { echo "install: $*" >&2; }

[ $# -ge 3 ] || { say "usage: $0 PATCH PREFIX DESTDIR [CONFIGURE ARGS...]" \
                      "(DESTDIR may be empty)"; exit 2; }
patch=$(realpath "$1")
prefix=$2
destdir=${3:+$(realpath -m "$3")}
shift 3
absolute_prefix "$prefix"

# It is unpacked afresh: never over an assembled tree (a TREE exported
# for the other tools).
if [ -d "$TREE/.git" ]; then
    say "error: $TREE is an assembled tree; install builds in a tree of its own"
    exit 1
fi

tarball=$("$ROOT/tools/fetch-source.sh")
stamp=$TREE/.install-inputs
want="$(sha256sum <"$tarball" | cut -c1-64) $(sha256sum <"$patch" | cut -c1-64)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
    say "unpacking $(basename "$tarball") into $TREE, applying $(basename "$patch")"
    unpack_source "$tarball" "$TREE"
    (cd "$TREE" && patch -p1 -s --no-backup-if-mismatch <"$patch") >&2 ||
        { say "error: $patch does not apply to the pristine source"; exit 1; }
    echo "$want" >"$stamp"
fi
# The dist patch leaves out the flame graph template (third-party code).
flamegraph_into "$TREE"

"$ROOT/tools/build.sh" "$TREE" --prefix="$prefix" "$@"
altinstall "$TREE" "$prefix" "$destdir"
