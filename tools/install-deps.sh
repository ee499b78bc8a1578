#!/bin/bash
# Install the Debian packages a make target needs.  As root, missing
# packages are installed; otherwise the exact command is printed and the
# script fails.  Each target asks for its own mode, so that building and
# using the interpreter does not install the test toolchain:
#
#   tools/install-deps.sh          build the interpreter, use it with perf
#                                  and gdb (make, make demo, make install)
#   tools/install-deps.sh test     ... plus what the tests run: the arm64
#                                  cross compiler and qemu (the template
#                                  tests), bpftrace, Debian's compiled
#                                  extensions and gunicorn
#   tools/install-deps.sh bench    ... plus hyperfine (kept for manual use)
#   tools/install-deps.sh ext      ... plus what building perftramp311 (ext/)
#                                  for Debian's python3.11 takes (make ext)
#   tools/install-deps.sh jit      ... plus a private perf 6.12 (below)
#   tools/install-deps.sh debian   ... plus what make debian's configuration
#                                  (Debian's own) uses beyond ours
#   tools/install-deps.sh aarch64  ... plus the cross toolchain, qemu,
#                                  gdb-multiarch and arm64 libraries in a
#                                  private sysroot (below)
#   tools/install-deps.sh fresh    only debootstrap and git (make test-fresh)
#   tools/install-deps.sh deb DIR  what `dpkg-buildpackage -B` needs for the
#                                  unpacked source package DIR (make deb):
#                                  its Build-Depends, as apt resolves them
#
# Packages are installed without their recommends, so every package the
# build, the demo or the tests run is named here (a clean Debian 12 root,
# make test-fresh, proves the lists complete).
#
# "jit": a perf newer than Debian 12's 6.1, for its gecko report script
# (6.7) and the perf the tests pin.  The system's perf is left alone: the
# linux-perf package of the release's backports suite is downloaded
# (through a private sources list and lists directory, mirrors taken from
# the machine's apt configuration) and unpacked under build/perf/, and the
# shared libraries it needs that are missing are installed from the
# release.  Nothing installed is removed, and nothing is
# upgraded unless a package being installed needs its newer version.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# Every build (configured --with-dtrace, hence systemtap-sdt-dev), and
# what using the interpreter takes: perf and gdb.  What make demo's flame
# graph needs beyond these is added below (npm).
PACKAGES=(build-essential pkg-config autoconf2.69 git patch libffi-dev zlib1g-dev
          libssl-dev libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev
          libncurses-dev uuid-dev libgdbm-dev libgdbm-compat-dev
          systemtap-sdt-dev linux-perf binutils gdb)
# The arm64 cross compiler and the emulator that runs its output.
CROSS_PACKAGES=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user-static)
# perftramp311 built and installed as a Debian user would: the headers,
# the venv module with its pip (tools/ext.sh); the compiler is
# build-essential.
EXT_PACKAGES=(python3.11-dev python3.11-venv)
MODE=${1:-}
case $MODE in
"" | jit) ;;
test) PACKAGES+=("${CROSS_PACKAGES[@]}" "${EXT_PACKAGES[@]}"
                 # test_probes: a bpftrace one-liner on the probes under -X perf
                 bpftrace
                 # Debian's compiled extensions, run by test_extensions
                 # under -X perf
                 python3-numpy python3-lxml python3-yaml python3-greenlet
                 python3-gevent
                 # test_oracle: a real pre-fork server; the names of
                 # libc's internal functions, where a frame-pointer walk
                 # stops (libc keeps no frame pointers)
                 python3-gunicorn libc6-dbg
                 # test_reports opens the flame graphs in a headless browser
                 chromium) ;;
bench) PACKAGES+=(hyperfine) ;;
ext) PACKAGES+=("${EXT_PACKAGES[@]}") ;;
# dpkg-buildflags, the system expat, Berkeley DB for dbm (Debian's
# --with-dbmliborder=bdb:gdbm), xz for Debian's tarball.
debian) PACKAGES+=(dpkg-dev libexpat1-dev libdb-dev xz-utils) ;;
fresh) PACKAGES=(debootstrap git) ;;
deb) PACKAGES=(dpkg-dev fakeroot) ;;
# gdb for a remote aarch64 target (qemu's gdbstub), test_unwind.
aarch64) PACKAGES+=("${CROSS_PACKAGES[@]}" gdb-multiarch) ;;
*) echo "install-deps: unknown mode '$MODE' (expected: test, bench, ext, jit, debian, aarch64, fresh, deb)" >&2
   exit 2 ;;
esac
# npm fetches the flame graph template for every tree
# (tools/fetch-flamegraph.sh); any npm already installed serves.
if [ "$MODE" != fresh ] && ! command -v npm >/dev/null; then
    PACKAGES+=(npm)
fi
PERF_JIT_MIN=6.8

say() { echo "install-deps: $*" >&2; }

# "perf version 6.12.95" -> success if at least $PERF_JIT_MIN.  Distribution
# suffixes ("6.7-3") are not patch levels, so only major.minor counts.
perf_is_new_enough() {
    local v
    v=$("$1" version 2>/dev/null | sed -n 's/^perf version \([0-9]*\.[0-9]*\).*/\1/p')
    [ -n "$v" ] &&
        [ "$(printf '%s\n%s\n' "$PERF_JIT_MIN" "$v" | sort -V | sed -n 1p)" = "$PERF_JIT_MIN" ]
}

missing_packages() {
    local p
    for p in "$@"; do
        [ "$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" = "install ok installed" ] ||
            echo "$p"
    done
}

# Install the named packages that are missing, at the release's versions;
# packages already installed are never upgraded.
install_missing() {
    local missing
    mapfile -t missing < <(missing_packages "$@")
    [ ${#missing[@]} -eq 0 ] && return 0
    if [ "$(id -u)" -ne 0 ]; then
        say "missing Debian packages; run:"
        say "    sudo apt-get install ${missing[*]}"
        return 1
    fi
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    local log changes
    log=$(mktemp)
    # Another apt (a second make in another tree) waits its turn.
    local wait=(-o DPkg::Lock::Timeout=600)
    local install=(apt-get "${wait[@]}" install -y -qq --no-install-recommends
                   --no-upgrade --no-remove "${missing[@]}")
    # Nothing is removed (--no-remove makes apt fail instead).  An installed
    # package is upgraded only where a new one needs its newer version (a
    # -dev package and its library, after a security update): apt's rule,
    # said out loud.
    apt-get "${wait[@]}" update -qq >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
    changes=$("${install[@]}" -s 2>&1 |
              awk '/^Inst [^ ]+ \[/ { print "    " $2 " " $3 " -> " $4 }') || true
    if [ -n "$changes" ]; then
        say "the new packages need newer versions of these installed ones:"
        echo "$changes" >&2
    fi
    if ! "${install[@]}" >"$log" 2>&1; then
        cat "$log" >&2
        rm -f "$log"
        say "error: apt-get could not install ${missing[*]} (output above)"
        return 1
    fi
    rm -f "$log"
}

# private_download DIR ARCH SUITE... -- PACKAGE...: download the packages
# (.deb files, into DIR) for ARCH from the named suites of the machine's
# Debian mirrors (a "-security" suite from its security archive), through
# a private sources list (lib.sh's private_apt).
private_download() {
    local dest=$1 arch=$2 mirrors work m main security suite keyring= suites=()
    shift 2
    while [ "$1" != -- ]; do suites+=("$1"); shift; done
    shift
    mirrors=$(apt_mirrors)
    [ -n "$mirrors" ] || {
        say "error: no Debian mirror in /etc/apt/sources.list{,.d/} to download $* from"
        return 1
    }
    [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] &&
        keyring="signed-by=/usr/share/keyrings/debian-archive-keyring.gpg "
    work=$(mktemp -d)
    trap 'rm -rf "$work"; trap - RETURN' RETURN
    # The first mirror of each kind: another repository with "debian" in
    # its URL may lack the suites.
    main=$(echo "$mirrors" | awk '!/security/ && !found++')
    security=$(echo "$mirrors" | awk '/security/ && !found++')
    for suite in "${suites[@]}"; do
        case $suite in
        *-security) m=$security ;;
        *) m=$main ;;
        esac
        [ -z "$m" ] || echo "deb [${keyring}arch=$arch] $m $suite main"
    done >"$work/sources.list"
    local opts=(-o "APT::Architecture=$arch" -o "APT::Architectures=$arch")
    say "downloading $* ($arch; ${suites[*]})"
    private_apt "$work" apt-get "${opts[@]}" -qq update 2>"$work/update.log" >&2 || {
        say "error: apt-get update of the private sources list failed:"
        cat "$work/update.log" >&2
        return 1
    }
    mkdir -p "$dest"
    (cd "$dest" && private_apt "$work" apt-get "${opts[@]}" -qq download "$@") >&2 || {
        say "error: could not download $* for $arch from ${suites[*]}"
        return 1
    }
}

# A private perf >= $PERF_JIT_MIN at $PRIVATE_PERF (lib.sh).
install_private_perf() {
    local dir deb deps codename
    perf_is_new_enough "$PRIVATE_PERF" && return 0
    dir=$PRIVATE_PERF_DIR
    rm -rf "$dir.new"
    mkdir -p "$dir.new"
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || { say "error: no VERSION_CODENAME in /etc/os-release"; return 1; }
    private_download "$dir.new" "$(dpkg --print-architecture)" \
        "$codename-backports" -- "linux-perf/$codename-backports"
    deb=$(echo "$dir.new"/linux-perf_*.deb)
    # The shared libraries perf is linked with; perl and python3 are only
    # for perf's scripting, which the tests and the demo do not use.
    mapfile -t deps < <(dpkg-deb -f "$deb" Depends | tr ',' '\n' |
        sed -E 's/\(.*\)//; s/\|.*//; s/[[:space:]]//g' | grep -v ':any$' | grep .)
    install_missing "${deps[@]}"
    dpkg-deb -x "$deb" "$dir.new"
    rm -f "$deb"
    rm -rf "$dir"
    mv "$dir.new" "$dir"
    perf_is_new_enough "$PRIVATE_PERF" || {
        say "error: $PRIVATE_PERF does not run or is older than $PERF_JIT_MIN:"
        "$PRIVATE_PERF" version >&2 || true
        return 1
    }
    say "$("$PRIVATE_PERF" version) at $PRIVATE_PERF (system perf unchanged)"
}

# The arm64 libraries make aarch64's extension modules link against
# (_ctypes, zlib, _ssl), unpacked into $AARCH64_SYSROOT (lib.sh): Debian's
# arm64 packages of the release and its updates, never installed on the
# machine (no foreign architecture is added to dpkg).
install_aarch64_sysroot() {
    local dir=$AARCH64_SYSROOT codename deb
    [ "$(cat "$dir/.packages" 2>/dev/null)" = "${AARCH64_LIBS[*]}" ] && return 0
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || { say "error: no VERSION_CODENAME in /etc/os-release"; return 1; }
    rm -rf "$dir.new"
    private_download "$dir.new/debs" arm64 "$codename" "$codename-updates" \
        "$codename-security" -- "${AARCH64_LIBS[@]}"
    for deb in "$dir.new"/debs/*.deb; do
        dpkg-deb -x "$deb" "$dir.new"
    done
    # Absolute links (libz.so -> /lib/...) would leave the sysroot.
    find "$dir.new" -type l -lname '/*' | while read -r link; do
        ln -sfnr "$dir.new$(readlink "$link")" "$link"
    done
    # libffi.pc names /usr/include, where a native compiler also searches
    # the multiarch directory that holds ffi.h; CPython's setup.py looks
    # for ffi.h in the directory named, and the sysroot has no default.
    sed -i 's|^includedir=.*|&/aarch64-linux-gnu|' \
        "$dir.new/usr/lib/aarch64-linux-gnu/pkgconfig/libffi.pc"
    rm -rf "$dir.new/debs" "$dir"
    echo "${AARCH64_LIBS[*]}" >"$dir.new/.packages"
    mv "$dir.new" "$dir"
    say "arm64 libraries in $dir"
}

# The packages apt would install for DIR's Build-Depends (apt-get
# build-dep reads DIR/debian/control), installed as the others are.
build_depends() {
    local dir=${1:?install-deps: deb needs the unpacked source directory} pkgs
    [ "$(id -u)" -ne 0 ] || apt-get update -qq
    mapfile -t pkgs < <(apt-get build-dep -s -qq --arch-only "$dir" 2>/dev/null |
                        awk '/^Inst / { print $2 }')
    install_missing "${pkgs[@]}"
    dpkg-checkbuilddeps -B "$dir/debian/control" || {
        say "error: $dir's build dependencies are still not met"
        return 1
    }
}

install_missing "${PACKAGES[@]}"
case $MODE in
deb) build_depends "${2:-}" ;;
jit) install_private_perf ;;
aarch64) install_aarch64_sysroot ;;
esac
