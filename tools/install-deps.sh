#!/bin/bash
# Install what building and testing the patched interpreter needs.  As
# root, missing Debian packages are installed; otherwise the exact command
# is printed and the script fails.
#
#   tools/install-deps.sh          build, demo and test dependencies
#   tools/install-deps.sh bench    ... plus hyperfine (kept for manual use)
#   tools/install-deps.sh jit      ... plus a private perf >= 6.8 (below)
#   tools/install-deps.sh debian   ... plus what make debian's configuration
#                                  (Debian's own) uses beyond ours
#   tools/install-deps.sh fresh    ... plus debootstrap (make test-fresh)
#
# Packages are installed without their recommends, so every package the
# build, the demo or the tests run is named here (a clean Debian 12 root,
# make test-fresh, proves the list complete).
#
# "jit": `perf inject --jit` only merges DWARF-unwound jitdump frames
# correctly from perf 6.8 on; Debian 12 ships 6.1.  The system's perf is
# left alone: the linux-perf package of the release's backports suite is
# downloaded (through a private sources list and lists directory, mirrors
# taken from the machine's apt configuration) and unpacked under
# build/perf/, and the shared libraries it needs that are missing are
# installed from the release.  Nothing installed is removed, and nothing is
# upgraded unless a package being installed needs its newer version.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

PACKAGES=(build-essential pkg-config autoconf2.69 git patch libffi-dev zlib1g-dev
          libssl-dev libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev
          libncurses-dev uuid-dev libgdbm-dev libgdbm-compat-dev gdb
          linux-perf binutils gcc-aarch64-linux-gnu libc6-dev-arm64-cross
          qemu-user-static systemtap-sdt-dev
          # test_probes: a bpftrace one-liner on the probes under -X perf
          bpftrace
          # Debian's compiled extensions, run by test_extensions under -X perf
          python3-numpy python3-lxml python3-yaml python3-greenlet
          python3-gevent)
MODE=${1:-}
case $MODE in
"" | jit) ;;
bench) PACKAGES+=(hyperfine) ;;
# dpkg-buildflags, the system expat, Berkeley DB for dbm (Debian's
# --with-dbmliborder=bdb:gdbm), xz for Debian's tarball.
debian) PACKAGES+=(dpkg-dev libexpat1-dev libdb-dev xz-utils) ;;
fresh) PACKAGES=(debootstrap git) ;;
*) echo "install-deps: unknown mode '$MODE' (expected: bench, jit, debian, fresh)" >&2
   exit 2 ;;
esac
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
    local install=(apt-get install -y -qq --no-install-recommends --no-upgrade
                   --no-remove "${missing[@]}")
    # Nothing is removed (--no-remove makes apt fail instead).  An installed
    # package is upgraded only where a new one needs its newer version (a
    # -dev package and its library, after a security update): apt's rule,
    # said out loud.
    apt-get update -qq >"$log" 2>&1 || { cat "$log" >&2; rm -f "$log"; return 1; }
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

# Download linux-perf from <codename>-backports into $1 (a .deb).
download_backports_perf() {
    local dest=$1 codename mirrors work m keyring=
    codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-}")
    [ -n "$codename" ] || { say "error: no VERSION_CODENAME in /etc/os-release"; return 1; }
    mirrors=$(apt_mirrors)
    [ -n "$mirrors" ] || {
        say "error: no Debian mirror in /etc/apt/sources.list{,.d/} to take $codename-backports from"
        return 1
    }
    [ -f /usr/share/keyrings/debian-archive-keyring.gpg ] &&
        keyring="[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] "
    work=$(mktemp -d)
    trap 'rm -rf "$work"; trap - RETURN' RETURN
    # The first Debian mirror that is not the security archive (another
    # repository with "debian" in its URL has no backports suite).
    m=$(echo "$mirrors" | awk '!/security/ && !found++')
    echo "deb $keyring$m $codename-backports main" >"$work/sources.list"
    say "looking up linux-perf in $codename-backports ($(echo $mirrors | tr '\n' ' '))"
    private_apt "$work" apt-get -qq update 2>"$work/update.log" >&2 || {
        say "error: apt-get update of the private sources list failed:"
        cat "$work/update.log" >&2
        return 1
    }
    (cd "$work" && private_apt "$work" apt-get -qq download "linux-perf/$codename-backports") >&2 || {
        say "error: could not download linux-perf from $codename-backports"
        return 1
    }
    mv "$work"/linux-perf_*.deb "$dest"
}

# A private perf >= 6.8 at $PRIVATE_PERF (lib.sh).
install_private_perf() {
    local dir deb deps
    perf_is_new_enough "$PRIVATE_PERF" && return 0
    dir=$PRIVATE_PERF_DIR
    rm -rf "$dir.new"
    mkdir -p "$dir.new"
    deb=$dir.new/linux-perf.deb
    download_backports_perf "$deb"
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

install_missing "${PACKAGES[@]}"
if [ "$MODE" = jit ]; then
    install_private_perf
fi
