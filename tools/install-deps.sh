#!/bin/bash
# Install the Debian packages needed to build and test the patched
# interpreter.  As root, missing packages are installed; otherwise the exact
# command is printed and the script fails.
set -euo pipefail

PACKAGES=(build-essential pkg-config autoconf2.69 libffi-dev zlib1g-dev
          libssl-dev libbz2-dev liblzma-dev libsqlite3-dev libreadline-dev
          libncurses-dev uuid-dev libgdbm-dev libgdbm-compat-dev gdb
          linux-perf binutils gcc-aarch64-linux-gnu)
# Extra groups: "bench" adds hyperfine (not needed: kept for manual use).
[ "${1:-}" = bench ] && PACKAGES+=(hyperfine)

missing=()
for p in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' ||
        missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" -ne 0 ]; then
    echo "install-deps: missing Debian packages; run:" >&2
    echo "    sudo apt-get install ${missing[*]}" >&2
    exit 1
fi
echo "install-deps: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >&2
apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2
