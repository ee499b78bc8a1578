#!/bin/bash
# make test-deb: the packages of make deb (build/deb/*.deb) installed over
# Debian's in a clean Debian 12 root (tools/fresh-root.sh), as the README
# says, then checked and taken back out:
# - The root gets what a user of Debian's Python has: python3,
#   python3-venv, python3-numpy, python3-lxml, python3-yaml (and
#   linux-perf), with Debian's python3.11 packages at the revision ours
#   are built on.
# - The README's install command upgrades exactly the python3.11 packages
#   installed, to our version, and installs no other.
# - tools/deb-checks.sh runs in it: -X perf, PYTHONPERFSUPPORT=1, the sys
#   API and perf record -g on /usr/bin/python3; Debian's extensions and
#   packaged programs under PYTHONPERFSUPPORT=1; venv.  Then dpkg -V.
# - The README's way back brings Debian's revision again (dpkg -V clean).
# Needs root.  The root is build/deb-test/root (DEB_TEST_DIR).
set -euo pipefail
{
. "$(dirname "$0")/lib.sh"

WORK=$(realpath -m "${DEB_TEST_DIR:-$ROOT/build/deb-test}")
CHROOT=$WORK/root
DEBS=$ROOT/build/deb
USER_PACKAGES=(python3 python3-venv python3-numpy python3-lxml python3-yaml linux-perf)

say() { echo "test-deb: $*" >&2; }
die() { say "error: $*"; exit 1; }
. "$ROOT/tools/fresh-root.sh"

shopt -s nullglob
debs=("$DEBS"/*.deb)
shopt -u nullglob
[ ${#debs[@]} -gt 0 ] || die "no packages in $DEBS: run make deb first"
version=$(dpkg-deb -f "${debs[0]}" Version)
base=${version%+perf*}
[ "$base" != "$version" ] || die "${debs[0]} is not ours: version $version"
started=$SECONDS
make_root
fails=0
fail() { say "FAIL  $*"; fails=$((fails + 1)); }

# installed_ours: "PACKAGE VERSION" of the installed packages that
# build/deb has a package of.
our_names=$(for d in "${debs[@]}"; do dpkg-deb -f "$d" Package; done | sort -u)
installed_ours() {
    in_root dpkg-query -W -f '${db:Status-Abbrev} ${Package} ${Version}\n' |
        awk -v names="$our_names" '
            BEGIN { split(names, list, "\n"); for (i in list) ours[list[i]] }
            $1 == "ii" && $2 in ours { print $2, $3 }' | sort
}

# Debian's python3.11 packages at the revision ours are built on (the
# archive may have a newer one, whose source this machine's mirrors did
# not serve when make deb ran: ours would then be older, and apt right to
# keep Debian's).
say "installing a Python user's packages: ${USER_PACKAGES[*]} (python3.11 at $base)"
# (linux-perf, for one, needs libpython3.11: each such dependency at $base)
pin=$CHROOT/etc/apt/preferences.d/test-deb
printf 'Package: %s\nPin: version %s\nPin-Priority: 1001\n' \
    "$(echo $our_names)" "$base" >"$pin"
root_install "$WORK/user-packages.log" "${USER_PACKAGES[@]}"
rm "$pin"
candidate=$(in_root apt-cache policy python3.11 | awk '/Candidate:/ { print $2 }')
if dpkg --compare-versions "$candidate" gt "$version"; then
    say "note: the archive has python3.11 $candidate, newer than ours: apt" \
        "keeps Debian's on an updated system (make deb again when its source is out)"
fi
before=$(installed_ours)

mkdir -p "$CHROOT/root/deb"
cp "${debs[@]}" "$CHROOT/root/deb/"
say "apt install --only-upgrade ./build/deb/*.deb (the README's command)"
in_root sh -c 'cd /root && apt install -y --only-upgrade ./deb/*.deb' \
    >"$WORK/install.log" 2>&1 || { tail -20 "$WORK/install.log" >&2; fail "apt install"; }
after=$(installed_ours)
if [ "$(awk '{ print $1 }' <<<"$before")" != "$(awk '{ print $1 }' <<<"$after")" ] ||
        [ -n "$(awk -v v="$version" '$2 != v' <<<"$after")" ]; then
    fail "the install changed which python3.11 packages are installed, or left one at Debian's:"
    diff <(echo "$before") <(echo "$after") >&2 || true
else
    say "ok    upgraded to $version, nothing else installed:" $(awk '{ print $1 }' <<<"$after")
fi

cp "$ROOT/tools/deb-checks.sh" "$CHROOT/root/deb-checks.sh"
in_root bash /root/deb-checks.sh || fails=$((fails + $?))

# dpkg_verify WHEN: dpkg -V of the python3.11 packages prints nothing.
dpkg_verify() {
    local out
    out=$(in_root dpkg -V $(awk '{ print $1 }' <<<"$after") 2>&1)
    if [ -n "$out" ]; then
        fail "dpkg -V $1:"
        echo "$out" >&2
    else
        say "ok    dpkg -V $1: clean"
    fi
}
dpkg_verify "with ours"

say "back to Debian's (the README's command)"
in_root sh -c "apt install -y --allow-downgrades \
    \$(dpkg-query -W -f '\${Package}=\${Version}\n' | sed -n 's/+perf[0-9]*\$//p')" \
    >"$WORK/back.log" 2>&1 || { tail -20 "$WORK/back.log" >&2; fail "going back"; }
back=$(installed_ours)
if [ -n "$(awk -v v="$base" '$2 != v' <<<"$back")" ]; then
    fail "not all back at $base:"
    echo "$back" >&2
elif in_root python3 -c 'import sys; sys.activate_stack_trampoline' 2>/dev/null; then
    fail "python3 still has sys.activate_stack_trampoline after going back"
else
    say "ok    back at Debian's $base:" $(awk '{ print $1 }' <<<"$back")
fi
dpkg_verify "after going back"

echo
echo "test-deb: $fails failed checks; $((SECONDS - started)) s in a clean Debian 12 root"
[ "$fails" -eq 0 ]
exit
}
