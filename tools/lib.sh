# Shared definitions for the tree tools (sourced, not run).
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
TREE=$(realpath -m "${TREE:-$ROOT/build/cpython}")
# The pristine source: Python-$CPYTHON_VERSION.tgz (tools/fetch-source.sh).
CPYTHON_VERSION=3.11.2
CPYTHON_SHA256=2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849
# Top-level directories of the CPython tree: files under these in the
# repository are overlay files, copied into the tree at the same path.
OVERLAY_DIRS=(Doc Grammar Include Lib Mac Misc Modules Objects PC PCbuild
              Parser Programs Python Tools)
# Regenerated from the patched configure.ac, never exported.
GENERATED=(configure pyconfig.h.in)
# Downloads of the user's, kept between builds (tools/fetch-*.sh).
CACHE_DIR=${PERF_TRAMPOLINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/perf-trampolines}
# The HTML template of perf's flamegraph report script: d3-flame-graph's
# d3-flamegraph-base.html from its npm package (tools/fetch-flamegraph.sh).
# Third-party code, so never in the repository: each tree gets a copy
# (flamegraph_into), ignored by git (tools/tree-exclude) and installed
# with the standard library.  The MD5 is the one perf 6.12's
# flamegraph.py checks the same file against; the SHA-256 is ours.
FLAMEGRAPH_VERSION=4.1.3
FLAMEGRAPH_MD5=143e0d06ba69b8370b9848dcd6ae3f36
FLAMEGRAPH_SHA256=64aba4b35cfaba17b37d57a4036876f1999f3cfc4c8d4d3a0781d08a1ad97d5a
FLAMEGRAPH_TEMPLATE=Lib/perf_trampoline/d3-flamegraph-base.html
# A newer perf than the release's, unpacked from the backports package by
# tools/install-deps.sh jit; the system's perf is not replaced.
PRIVATE_PERF_DIR=$ROOT/build/perf
PRIVATE_PERF=$PRIVATE_PERF_DIR/usr/bin/perf
# make aarch64: arm64 libraries of the release for the cross build
# (tools/install-deps.sh aarch64), and the qemu-user that runs it.
AARCH64_SYSROOT=$ROOT/build/sysroot-aarch64
AARCH64_LIBS=(libffi-dev libffi8 zlib1g-dev zlib1g libssl-dev libssl3
              systemtap-sdt-dev)
AARCH64_TREE=$ROOT/build/cpython-aarch64

# tooling PYTHON COMMAND [ARG...]: a command of tools/tooling.py, the helpers
# the Python tools share, run by PYTHON (any Python 3.8+).  -E: the caller's
# PYTHON* variables must not reach the helper itself.
tooling() {
    local python=$1
    shift
    "$python" -E "$ROOT/tools/tooling.py" "$@"
}

# Both succeed when a directory is missing: callers run under set -e and
# pipefail, where a failing `[ -d ... ]` would cut the list short.
overlay_files() {
    local d
    (cd "${1:-$ROOT}" && for d in "${OVERLAY_DIRS[@]}"; do
        if [ -d "$d" ]; then
            find "$d" -type f
        fi
    done | LC_ALL=C sort)
}

patch_files() {
    (cd "${1:-$ROOT}" && if [ -d patches ]; then
        find patches -type f -name '*.patch' | LC_ALL=C sort
    fi)
}

# A hash of the overlay and patches under a directory (default: the
# repository): what an assembled tree is made from.
inputs_hash() {
    local dir=${1:-$ROOT}
    { overlay_files "$dir"; patch_files "$dir"; } | while read -r f; do
        printf '%s %s %s\n' "$f" "$(stat -c %a "$dir/$f")" \
            "$(sha256sum <"$dir/$f" | cut -c1-64)"
    done | sha256sum | cut -c1-64
}

# unpack_source TARBALL DIR: DIR becomes a fresh copy of the unpacked
# source (whatever DIR held is removed).
unpack_source() {
    rm -rf "$2"
    mkdir -p "$2"
    tar -xzf "$1" -C "$2" --strip-components=1
}

# tree_diff [GIT DIFF ARGS...]: git diff in $TREE as a patch for `patch
# -p1` or `git apply`, the same on every machine: without the user's and
# the system's git configuration (diff.algorithm, diff.orderFile, ...), a/
# and b/ prefixes, no renames, no index lines (their abbreviated hashes
# may vary with what else the tree's repository holds).
tree_diff() {
    GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1 \
        git -C "$TREE" diff --no-color --no-ext-diff --no-renames \
        --src-prefix=a/ --dst-prefix=b/ "$@" |
        sed '/^index [0-9a-f]*\.\.[0-9a-f]*/d'
}

# The Debian release whose python3.11 is 3.11.2: the source archive
# holds the orig tarball (tools/fetch-source.sh) and Debian's patch series
# (tools/fetch-debian.sh) for it.
DEBIAN_RELEASE=bookworm

# Debian mirrors named by the machine's apt configuration (deb822 and
# one-line formats, binary and source entries).
apt_mirrors() {
    {
        sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
        grep -hE '^[[:space:]]*deb(-src)?[[:space:]]' /etc/apt/sources.list \
            /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed -E 's/\[[^]]*\]//' | awk '{print $2}'
    } | grep -E '^(https?|file):' | grep -iE 'debian' | sort -u || true
}

# debian_source_list FILE: deb-src entries for $DEBIAN_RELEASE, its
# updates and its security suite on the machine's Debian mirrors; fails
# when the apt configuration names none.
debian_source_list() {
    local mirrors m
    mirrors=$(apt_mirrors)
    [ -n "$mirrors" ] || return 1
    for m in $mirrors; do
        case $m in
        *security*) echo "deb-src $m $DEBIAN_RELEASE-security main" ;;
        *) echo "deb-src $m $DEBIAN_RELEASE main"
           echo "deb-src $m $DEBIAN_RELEASE-updates main" ;;
        esac
    done >"$1"
}

# private_apt DIR apt-get|apt-cache [ARG...]: the apt command on the
# sources list DIR/sources.list, with its lists and cache under DIR: the
# machine's own sources, lists and cache are neither read nor changed.
# Downloads run as the calling user, who owns DIR.
private_apt() {
    local dir=$1
    shift
    mkdir -p "$dir/lists/partial" "$dir/parts" "$dir/cache/archives/partial"
    "$@" -o "Dir::Etc::SourceList=$dir/sources.list" \
        -o "Dir::Etc::SourceParts=$dir/parts" \
        -o "Dir::State::Lists=$dir/lists" -o "Dir::Cache=$dir/cache" \
        -o "Debug::NoLocking=1" -o "APT::Sandbox::User=$(id -un)"
}

# absolute_prefix PREFIX: fails, saying why, unless PREFIX is an absolute
# path (it is compiled into the interpreter).
absolute_prefix() {
    case $1 in
    /*) ;;
    *) echo "$(basename "$0" .sh): error: PREFIX must be an absolute path, not '$1'" >&2
       return 1 ;;
    esac
}

# altinstall DIR PREFIX DESTDIR: `make altinstall` of the built tree DIR
# (configured for PREFIX) into DESTDIR/PREFIX; DESTDIR may be empty.
# PREFIX/bin gets python3.11 and the other versioned names, never python3
# or python, so no installed Python is replaced.
altinstall() {
    local me
    me=$(basename "$0" .sh)
    echo "$me: make altinstall into $3$2 (log: $1/install.log)" >&2
    make -C "$1" altinstall DESTDIR="$3" >"$1/install.log" 2>&1 || {
        tail -30 "$1/install.log" >&2
        echo "$me: error: make altinstall failed; full log in $1/install.log" >&2
        return 1
    }
    echo "$me: installed $3$2/bin/python3.11 (try: python3.11 -X perf)" >&2
}

# flamegraph_into DIR: DIR/$FLAMEGRAPH_TEMPLATE becomes the verified
# template (fetched if not cached); an unchanged copy keeps its time.
flamegraph_into() {
    local template
    template=$("$ROOT/tools/fetch-flamegraph.sh")
    cmp -s "$template" "$1/$FLAMEGRAPH_TEMPLATE" ||
        cp "$template" "$1/$FLAMEGRAPH_TEMPLATE"
}
