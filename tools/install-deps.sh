#!/bin/bash
# Install the Debian packages needed to build and test the patched
# interpreter.  As root, missing packages are installed; otherwise the exact
# command is printed and the script fails.
#
#   tools/install-deps.sh          build and test dependencies
#   tools/install-deps.sh bench    ... plus hyperfine (kept for manual use)
#   tools/install-deps.sh jit      ... plus perf >= 6.8 for the perf_jit tests
#
# "jit": `perf inject --jit` only merges DWARF-unwound jitdump frames
# correctly from perf 6.8 on; Debian 12 ships 6.1.  The newer linux-perf
# comes from the release's backports suite, looked up through a private
# sources list and lists directory (mirrors taken from the machine's own
# apt configuration), so the system's apt sources and lists are not changed.
# It replaces the installed linux-perf package (/usr/bin/perf).
set -euo pipefail

PACKAGES=(build-essential pkg-config autoconf2.69 libffi-dev zlib1g-dev
          libssl-dev libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev
          libncurses-dev uuid-dev libgdbm-dev libgdbm-compat-dev gdb
          linux-perf binutils gcc-aarch64-linux-gnu qemu-user-static)
MODE=${1:-}
case $MODE in
"") ;;
bench) PACKAGES+=(hyperfine) ;;
jit) ;;
*) echo "install-deps: unknown mode '$MODE' (expected: bench, jit)" >&2
   exit 2 ;;
esac
PERF_JIT_MIN=6.8

say() { echo "install-deps: $*" >&2; }

# "perf version 6.12.95" -> success if at least $PERF_JIT_MIN.  Distribution
# suffixes ("6.7-3") are not patch levels, so only major.minor counts.
perf_is_new_enough() {
    local v
    v=$(perf version 2>/dev/null | sed -n 's/^perf version \([0-9]*\.[0-9]*\).*/\1/p')
    [ -n "$v" ] &&
        [ "$(printf '%s\n%s\n' "$PERF_JIT_MIN" "$v" | sort -V | head -1)" = "$PERF_JIT_MIN" ]
}

# Debian mirrors named by the machine's apt configuration (both formats).
apt_mirrors() {
    {
        sed -n 's/^URIs:[[:space:]]*//p' /etc/apt/sources.list.d/*.sources 2>/dev/null | tr ' ' '\n'
        grep -hE '^[[:space:]]*deb[[:space:]]' /etc/apt/sources.list \
            /etc/apt/sources.list.d/*.list 2>/dev/null |
            sed -E 's/\[[^]]*\]//' | awk '{print $2}'
    } | grep -E '^(https?|file):' | grep -iE 'debian' | sort -u || true
}

install_backports_perf() {
    local codename mirrors work m keyring=
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
    trap 'rm -rf "$work"' RETURN
    mkdir -p "$work/lists/partial" "$work/parts" "$work/cache/archives/partial"
    # The release itself is listed too: the backported package's
    # dependencies come from it.
    for m in $mirrors; do
        case $m in
        *security*) echo "deb $keyring$m $codename-security main" ;;
        *) echo "deb $keyring$m $codename main"
           echo "deb $keyring$m $codename-updates main"
           echo "deb $keyring$m $codename-backports main" ;;
        esac
    done >"$work/sources.list"
    local opts=(-o "Dir::Etc::SourceList=$work/sources.list"
                -o "Dir::Etc::SourceParts=$work/parts"
                -o "Dir::State::Lists=$work/lists"
                -o "Dir::Cache=$work/cache"
                -o "APT::Sandbox::User=root")
    say "looking up linux-perf in $codename-backports ($(echo $mirrors | tr '\n' ' '))"
    apt-get "${opts[@]}" -qq update >&2 2>"$work/update.log" || {
        say "error: apt-get update of the private sources list failed:"
        cat "$work/update.log" >&2
        return 1
    }
    say "installing linux-perf from $codename-backports"
    # Only linux-perf comes from backports; its dependencies keep the
    # release's versions.
    apt-get "${opts[@]}" install -y -qq --no-install-recommends \
        "linux-perf/$codename-backports" >&2
}

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$p")
done
need_perf=0
if [ "$MODE" = jit ] && ! perf_is_new_enough; then
    need_perf=1
fi
[ ${#missing[@]} -eq 0 ] && [ $need_perf -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    [ ${#missing[@]} -gt 0 ] && {
        say "missing Debian packages; run:"
        say "    sudo apt-get install ${missing[*]}"
    }
    [ $need_perf -eq 1 ] &&
        say "perf >= $PERF_JIT_MIN is needed (have: $(perf version 2>/dev/null || echo none)); run: sudo $0 jit"
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    apt-get update -qq >&2
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
fi
if [ $need_perf -eq 1 ]; then
    install_backports_perf
    perf_is_new_enough || {
        say "error: perf is still $(perf version 2>/dev/null || echo missing) after installing from backports"
        exit 1
    }
    say "$(perf version)"
fi
