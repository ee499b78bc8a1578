# A clean Debian 12 root to test in (sourced by test-fresh.sh and
# test-deb.sh, after lib.sh; the caller defines say and die, and sets
# CHROOT, the root's directory, and WORK, where logs go).
#
# - The root is debootstrap's minbase of bookworm, from the first Debian
#   mirror of this machine's apt configuration.  The bare root is cached
#   as a tarball in the user's cache directory (FRESH_REBUILD=1 makes it
#   anew), so later runs unpack it in seconds.
# - It gets the apt sources a Debian 12 install has (release, updates,
#   security) and this machine's apt proxy, if any.
# - It is a mount point with /proc, /sys and /dev mounted; in_root runs a
#   command in it through chroot, as root, with a minimal environment (CI
#   and PERF_TESTS_REQUIRED are passed on).
# - On every exit path (failure, Ctrl-C, TERM) the processes left in the
#   root are killed, its mounts unmounted and the root removed.

SUITE=bookworm
CACHE_DIR=${PERF_TRAMPOLINE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/perf-trampolines}
ARCH=$(dpkg --print-architecture)
BASE=$CACHE_DIR/debian-$SUITE-minbase-$ARCH.tar.gz

mounts_under() {
    awk -v root="$1" '$2 == root || index($2, root "/") == 1 { print $2 }' \
        /proc/self/mounts | sort -r
}

# Kill what still runs in the root, unmount it, remove it.
remove_root() {
    local proc m
    [ -d "$CHROOT" ] || return 0
    # Processes left in the root (a test's child, a hung build) would keep
    # its mounts busy.
    for proc in /proc/[0-9]*; do
        if [ "$(readlink "$proc/root" 2>/dev/null)" = "$CHROOT" ]; then
            kill -9 "${proc#/proc/}" 2>/dev/null || true
        fi
    done
    for m in $(mounts_under "$CHROOT"); do
        # A slave first: if a signal came between --rbind and
        # --make-rslave, unmounting a shared peer would unmount the
        # host's own mounts under /sys or /dev.
        mount --make-rslave "$m" 2>/dev/null || true
        umount "$m" 2>/dev/null || umount -l "$m" || true
    done
    if [ -n "$(mounts_under "$CHROOT")" ]; then
        say "error: still mounted under $CHROOT; not removing it:"
        mounts_under "$CHROOT" >&2
        return 1
    fi
    # --one-file-system: never descend into anything still mounted.
    rm -rf --one-file-system "$CHROOT"
}

cleanup() {
    local status=$?
    # No second signal may interrupt the unmounting.
    trap '' INT TERM
    trap - EXIT
    remove_root || status=1
    exit $status
}

in_root() { chroot "$CHROOT" /usr/bin/env -i HOME=/root TERM="${TERM:-dumb}" \
    PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 \
    ${CI:+CI=$CI} ${PERF_TESTS_REQUIRED:+PERF_TESTS_REQUIRED=$PERF_TESTS_REQUIRED} \
    "$@"; }

# make_root: the root, mounted, with its apt sources; cleanup is set to
# run on exit and on INT and TERM.
make_root() {
    local mirror security
    [ "$(id -u)" -eq 0 ] || die "needs root (debootstrap, chroot and mounts)"
    # /proc/self/mounts escapes white space: such a root could not be unmounted.
    [[ $CHROOT != *[[:space:]]* ]] || die "the root's path may not contain white space: $CHROOT"
    "$ROOT/tools/install-deps.sh" fresh
    trap cleanup EXIT
    trap 'say "interrupted"; exit 130' INT
    trap 'say "terminated"; exit 143' TERM

    # (awk reads everything: an early exit would fail the pipeline)
    mirror=$(apt_mirrors | awk '!/security/ && !found++')
    security=$(apt_mirrors | awk '/security/ && !found++')
    [ -n "$mirror" ] || die "no Debian mirror in this machine's apt configuration"

    if [ -d "$CHROOT" ]; then
        say "removing the root a previous run left in $CHROOT"
        remove_root || die "cannot remove $CHROOT"
    fi
    mkdir -p "$CHROOT"

    if [ -f "$BASE" ] && [ -z "${FRESH_REBUILD:-}" ]; then
        say "unpacking the cached $SUITE minbase root ($BASE)"
        tar -xzpf "$BASE" -C "$CHROOT"
    else
        say "debootstrap --variant=minbase $SUITE from $mirror (a few minutes)"
        debootstrap --variant=minbase "$SUITE" "$CHROOT" "$mirror" \
            >"$WORK/debootstrap.log" 2>&1 ||
            { tail -20 "$WORK/debootstrap.log" >&2; die "debootstrap failed (log above)"; }
        mkdir -p "$CACHE_DIR"
        tar -czpf "$BASE.tmp.$$" -C "$CHROOT" . && mv "$BASE.tmp.$$" "$BASE"
    fi

    # What a Debian 12 installation from the same mirror has configured.
    {
        printf 'Types: deb\nURIs: %s\nSuites: %s %s-updates\nComponents: main\n' \
            "$mirror" "$SUITE" "$SUITE"
        printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        if [ -n "$security" ]; then
            printf '\nTypes: deb\nURIs: %s\nSuites: %s-security\nComponents: main\n' \
                "$security" "$SUITE"
            printf 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n'
        fi
    } >"$CHROOT/etc/apt/sources.list.d/debian.sources"
    rm -f "$CHROOT/etc/apt/sources.list"
    cp /etc/resolv.conf "$CHROOT/etc/resolv.conf"
    # An apt proxy this machine needs, the root needs too.
    apt-config dump | grep -i '::proxy' >"$CHROOT/etc/apt/apt.conf.d/90proxy" || true

    # The root is a mount point, as / is on a real system (unshare's private
    # propagation, which the tests use, needs one).
    mount --bind "$CHROOT" "$CHROOT"
    mount --make-private "$CHROOT"
    mount -t proc proc "$CHROOT/proc"
    local m
    for m in sys dev; do
        mount --rbind "/$m" "$CHROOT/$m"
        mount --make-rslave "$CHROOT/$m"
    done
}

# root_install LOG PACKAGE...: apt-get install in the root (after an
# update), its output in LOG, the end of it shown on failure.
root_install() {
    local log=$1
    shift
    in_root apt-get update -qq >"$log" 2>&1 &&
        in_root apt-get install -y -qq "$@" >>"$log" 2>&1 ||
        { tail -20 "$log" >&2; die "installing $* in the root failed (log: $log)"; }
}

# copy_pyenv FROM TO: what the tests use of this machine's pyenv (FROM),
# whatever of it there is, into TO (the root's ~/.pyenv):
# - upstream 3.12's and 3.13's perf test files alone (test_upstream);
# - the pyenv command with its python-build plugin (PyenvTests);
# - its 3.11.x (make ext, ExtInstallTests) as `pyenv install` left them:
#   not their own test suite (123 MB), and in site-packages only what
#   ensurepip put there, pip and setuptools, not what was installed
#   since, whose scripts (RECORD: ../../../bin/...) go too.
copy_pyenv() {
    local from=$1 to=$2 f version dest record dist path rel
    local site=lib/python3.11/site-packages
    for f in "$from"/versions/3.1[23].*/lib/python3.1[23]/test/test_perf{_profiler,maps}.py; do
        [ -f "$f" ] || continue
        mkdir -p "$(dirname "$to/${f#"$from"/}")"
        cp "$f" "$to/${f#"$from"/}"
    done
    if [ -x "$from/libexec/pyenv" ]; then
        mkdir -p "$to/plugins"
        cp -a "$from/bin" "$from/libexec" "$from/pyenv.d" "$to/"
        cp -a "$from/plugins/python-build" "$to/plugins/"
    fi
    for version in "$from"/versions/3.11.*; do
        [ -x "$version/bin/python3.11" ] || continue
        dest=$to/versions/${version##*/}
        mkdir -p "$dest"
        tar -C "$version" --anchored --exclude=./lib/python3.11/test \
            --exclude="./$site" -cf - . | tar -C "$dest" -xf -
        for record in "$version/$site"/*.dist-info/RECORD; do
            [ -f "$record" ] || continue
            dist=${record%/RECORD}
            dist=${dist##*/}
            # RECORD's paths are relative to site-packages; a name that
            # leaves the version elsewhere is not followed.
            while IFS=, read -r path _; do
                case $path in
                    ../../../*) rel=${path#../../../} ;;
                    *) rel=$site/$path ;;
                esac
                case /$rel/ in */../*|*/./*|//*) continue ;; esac
                if [[ $dist == pip-* || $dist == setuptools-* ]]; then
                    if [ -f "$version/$rel" ]; then
                        printf '%s\n' "$rel"
                    fi
                elif [[ $rel != "$site"/* ]]; then
                    rm -f "$dest/$rel"
                fi
            done <"$record"
        done | tar -C "$version" --no-recursion --verbatim-files-from \
                   -T - -cf - | tar -C "$dest" -xf -
    done
}
