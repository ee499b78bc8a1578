#!/bin/bash
# make aarch64: cross-build the patched interpreter for aarch64-linux-gnu
# into $AARCH64_TREE, with Debian's cross compiler, our x86_64 build as the
# build Python and the arm64 libraries of $AARCH64_SYSROOT (both from
# tools/install-deps.sh aarch64), then write $AARCH64_TREE/python-qemu:
# the interpreter under qemu-user (and run-qemu, for other programs).
#
# -mbranch-protection=standard: BTI landing pads and PAC return addresses,
# what arm64 distributions build with; the trampolines are then the BTI/PAC
# template in PROT_BTI arenas, and qemu's "max" CPU enforces both.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

QEMU=$(command -v qemu-aarch64-static || true)
[ -n "$QEMU" ] || { echo "build-aarch64: qemu-aarch64-static is not installed (make deps)" >&2; exit 1; }
S=$AARCH64_SYSROOT
# Debian's arm64 C library for the cross compiler (libc6-arm64-cross).
CROSS_LIB=/usr/aarch64-linux-gnu/lib
LIBDIRS=$S/usr/lib/aarch64-linux-gnu:$S/lib/aarch64-linux-gnu
INTERP=-Wl,--dynamic-linker=$CROSS_LIB/ld-linux-aarch64.so.1

TREE=$AARCH64_TREE "$ROOT/tools/assemble.sh"
# pkg-config answers for the arm64 .pc files, with the sysroot in front.
export PKG_CONFIG_LIBDIR=$S/usr/lib/aarch64-linux-gnu/pkgconfig
export PKG_CONFIG_SYSROOT_DIR=$S
# dtrace -G compiles the probes' semaphores with $CC, which must find the
# sysroot's <sys/sdt.h> without -I (it takes no include options); and
# pkg-config must not drop -I flags for being in CPATH.
export CC=aarch64-linux-gnu-gcc CPATH=$S/usr/include/aarch64-linux-gnu
export PKG_CONFIG_ALLOW_SYSTEM_CFLAGS=1
# The rpath finds the sysroot's libraries at run time, and the dynamic
# linker is named by its host path: qemu then runs the interpreter without
# -L, which would show the program that directory as "/" (a walk from /,
# as record's output directory makes, would land there).  configure cannot
# probe files of the target's /dev or run its getaddrinfo().
"$ROOT/tools/build.sh" "$AARCH64_TREE" "$@" \
    --build=x86_64-linux-gnu --host=aarch64-linux-gnu \
    --with-build-python="$ROOT/build/cpython/python" \
    CFLAGS=-mbranch-protection=standard \
    CPPFLAGS="-I$S/usr/include -I$S/usr/include/aarch64-linux-gnu" \
    LDFLAGS="-L${LIBDIRS//:/ -L} -Wl,-rpath,$LIBDIRS:$CROSS_LIB $INTERP" \
    ac_cv_file__dev_ptmx=yes ac_cv_file__dev_ptc=no ac_cv_buggy_getaddrinfo=no

# run-qemu runs an aarch64 program on the CPU model PERF_QEMU_CPU, by
# default "max" with BTI and PAC enforced and the codes computed by
# qemu's implementation-defined function (pauth-impdef): with the
# architected QARMA5 every signed call made the interpreter about 7 times
# slower, and nothing of ours depends on the function, only on where the
# code sits in a pointer.  It finds the usual dynamic linker through -L
# unless told --no-prefix; python-qemu runs the interpreter (no -L, see
# above), passing itself as argv[0]: the interpreter takes that for
# sys.executable, so the interpreters it starts run under qemu too (no
# binfmt_misc registration needed).  Both exec: the pid stays the
# program's.
cat >"$AARCH64_TREE/run-qemu" <<EOF
#!/bin/sh
if [ "\$1" = --no-prefix ]; then
    shift
else
    set -- -L /usr/aarch64-linux-gnu "\$@"
fi
exec $QEMU -cpu "\${PERF_QEMU_CPU:-max,pauth-impdef=on}" "\$@"
EOF
cat >"$AARCH64_TREE/python-qemu" <<EOF
#!/bin/sh
exec "$AARCH64_TREE/run-qemu" --no-prefix -0 "\$0" "$AARCH64_TREE/python" "\$@"
EOF
chmod +x "$AARCH64_TREE/run-qemu" "$AARCH64_TREE/python-qemu"
# The extension modules the tests need, built and loadable.
"$AARCH64_TREE/python-qemu" -c '
import platform, sys, _ctypes, _ssl, _testcapi, _testinternalcapi, zlib
print("build-aarch64:", platform.machine(), "interpreter:", sys.executable)' >&2
