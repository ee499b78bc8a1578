# Front door: build and test CPython 3.11.2 with perf trampolines.
# `make help` lists the targets.

TREE      := build/cpython
PYTHON    := $(TREE)/python
NPROC     := $(shell nproc 2>/dev/null || echo 2)
# Extra ./configure arguments (frame pointers and perf trampolines are the
# configure defaults on x86_64/aarch64 Linux).
CONFIGURE_FLAGS ?=
# Arguments of every build of ours: the static tracing probes (USDT)
# Debian's python3.11 has, so that bpftrace and SystemTap scripts written
# for it work on ours (needs systemtap-sdt-dev).
BASE_FLAGS := --with-dtrace

# A second interpreter, for the perf_jit tests and demo: without frame
# pointers (the configuration perf_jit exists for) and with a shared
# libpython (as Debian and embedders use it), found through its rpath.
NOFP_TREE := build/cpython-nofp
NOFP_FLAGS := --without-frame-pointers --enable-shared \
	LDFLAGS=-Wl,-rpath,$(CURDIR)/$(NOFP_TREE)
NOFP_PYTHON := $(CURDIR)/$(NOFP_TREE)/python

# make release: the build to run in production, in a tree of its own:
# PGO + LTO (as Debian builds its python3.11), trained with perf
# trampolines off and on (tools/pgo_task.py), and frame records only on
# the Python call chain (configure.ac says how; a record in every function
# costs about 3%).  make install and make debian build the same way
# (RELEASE_FLAGS= for a quick unoptimized build; make test builds its
# Debian tree so).  make release-nofp: the same without frame pointers,
# for make bench to show what they cost.
RELEASE_TREE := build/cpython-release
RELEASE_NOFP_TREE := build/cpython-release-nofp
# make stock-release: pristine 3.11.2 built as make release builds ours,
# without frame pointers (as Debian builds it; its configure has no
# option for them), for make bench to tell what our patch costs in the
# release build from what Debian's build gains over building from source.
STOCK_RELEASE_TREE := build/cpython-stock-release
# -fno-reorder-blocks-and-partition: what the training never ran stays in
# its function (BUILDING.md says why).
RELEASE_FLAGS ?= --enable-optimizations --with-lto \
	PROFILE_TASK=$(CURDIR)/tools/pgo_task.py \
	CFLAGS_NODIST=-fno-reorder-blocks-and-partition
RELEASE_FRAME_POINTERS := --with-frame-pointers=python
# Its executable is linked not position-independent, as Debian links its
# python3.11.  The code stays position-independent: libpython3.11.a goes
# into embedders' executables, which GCC makes PIE by default.  dpkg's
# spec file leaves -shared alone, so extension modules stay shared
# objects; the _NODIST variable keeps it out of sysconfig's LDFLAGS,
# which third-party extensions are built with.
NO_PIE_LINK := -specs=/usr/share/dpkg/no-pie-link.specs
RELEASE_EXE_FLAGS := LDFLAGS_NODIST=$(NO_PIE_LINK)

# make dist: the overlay, patches/ and the regenerated configure as one
# patch for the pristine source.  make install builds that patch applied
# to the pristine source, configured for PREFIX, in a tree of its own
# (tools/install.sh says why), and installs it as `make altinstall` does.
DIST_PATCH := build/dist/cpython-3.11.2-perf-trampolines.patch
PREFIX    ?= /usr/local
DESTDIR   ?=

# make debian: Debian 12's own python3.11 source (the orig tarball and
# Debian's patch series, its newest revision) with the dist patch,
# configured as Debian configures its shared build, for PREFIX
# (tools/debian.sh).
DEBIAN_TREE := build/cpython-debian

# make aarch64: the interpreter cross-built for arm64, with BTI and PAC,
# run under qemu-user through its python-qemu wrapper
# (tools/build-aarch64.sh).
AARCH64_TREE := build/cpython-aarch64

.PHONY: all build deps deps-test deps-jit tree export dist install test test-fresh demo demo-jit picture nofp release release-nofp stock-release bench bench-perf-off clean help
.PHONY: deps-debian debian install-debian test-debian
.PHONY: deps-aarch64 aarch64 test-aarch64 test-release deb test-deb deb-fresh
.PHONY: ext

all: build

help:
	@echo "make, make build   build $(PYTHON) (fetches and assembles the tree if needed)"
	@echo "make test       build, then run the tests; ends with 'N passed, N failed, N skipped'"
	@echo "make test-fresh make demo and make test in a clean Debian 12 root (debootstrap)"
	@echo "make demo       profile examples/demo.py under perf and show Python frames"
	@echo "make demo-jit   the same with -X perf_jit on a build without frame pointers"
	@echo "make picture    remake the README's flame graph, examples/flamegraph.png (needs chromium)"
	@echo "make bench      benchmarks: ours and its release build (perf off/on) vs stock 3.11.2, Debian's python3.11, upstream"
	@echo "make bench-perf-off  make bench's step alone: what each perf-off change of the evaluator patch wins"
	@echo "make tree       (re)assemble $(TREE) from the pristine source + overlay + patches"
	@echo "make export     write edits in $(TREE) back to the overlay and patches/"
	@echo "make release    build $(RELEASE_TREE): PGO + LTO, trained with -X perf too"
	@echo "make release-nofp  the same without frame pointers (for make bench)"
	@echo "make stock-release pristine 3.11.2 built alike, no frame pointers (for make bench)"
	@echo "make nofp       build $(NOFP_TREE): no frame pointers, shared libpython (perf_jit)"
	@echo "make dist       write $(DIST_PATCH) (patch -p1 on pristine 3.11.2)"
	@echo "make install    build for PREFIX ($(PREFIX)) and install python3.11 there, as altinstall does"
	@echo "make debian     build $(DEBIAN_TREE): Debian 12's python3.11 source and patches + ours"
	@echo "make test-debian   the tests of make test (less the tooling's) on the Debian build"
	@echo "make install-debian   install the Debian build for PREFIX, as altinstall does"
	@echo "make test-release   the tests of make test (less the tooling's) on the release build"
	@echo "make deb        Debian 12's python3.11 packages with ours, by Debian's rules, into build/deb/"
	@echo "make deb-fresh  make deb in a clean Debian 12 root (debootstrap), its packages into build/deb/"
	@echo "make test-deb   install build/deb/*.deb over Debian's in a clean Debian 12 root, check, go back"
	@echo "make aarch64    cross-build $(AARCH64_TREE) for arm64 (runs under qemu-user)"
	@echo "make test-aarch64   our tests with the arm64 build under qemu-user"
	@echo "make test-regrtest-perf  CPython's whole suite with and without PYTHONPERFSUPPORT=1"
	@echo "make test-asan  our tests on an ASan/UBSan build, build/cpython-asan"
	@echo "make test-valgrind  valgrind memcheck of a -X perf workload (needs valgrind)"
	@echo "make ext        perftramp311 (ext/) for stock 3.11: venvs, wheels and its sdist in build/ext/"
	@echo "make deps       install the missing Debian packages building and using it need (as root)"
	@echo "make deps-test  ... and those the tests need (the test targets run it)"
	@echo "make deps-jit   ... and perf 6.12 in build/perf/ (a build's record prefers it)"
	@echo "make deps-debian   ... and what make debian needs"
	@echo "make deps-aarch64  ... and what make aarch64 needs (a sysroot in build/sysroot-aarch64/)"
	@echo "make clean      remove build/"

# Building, make demo, make install: the build dependencies, perf and
# gdb.  The test targets add the test toolchain (deps-test).
deps:
	@tools/install-deps.sh

deps-test: deps
	@tools/install-deps.sh test

# perftramp311, the extension giving stock 3.11.x the same trampolines
# (ext/): installed by pip alone, offline, for Debian's python3.11
# and pyenv's 3.11.x (tools/ext.sh); its tests run in make test.
ext: deps
	@tools/install-deps.sh ext
	@tools/ext.sh

# A private perf 6.12 (Debian 12: from bookworm-backports) in build/perf/,
# which record run from a build here prefers.
deps-jit: deps
	@tools/install-deps.sh jit

# What make debian's configuration (Debian's own) uses beyond ours.
deps-debian: deps
	@tools/install-deps.sh debian

# gdb-multiarch, and arm64 libraries in a private sysroot.
deps-aarch64: deps
	@tools/install-deps.sh aarch64

tree: deps
	@tools/assemble.sh

export:
	@tools/export.sh

build: tree
	@tools/build.sh $(TREE) $(BASE_FLAGS) $(CONFIGURE_FLAGS)

nofp: deps-jit tree
	@TREE=$(NOFP_TREE) tools/assemble.sh
	@tools/build.sh $(NOFP_TREE) $(BASE_FLAGS) $(NOFP_FLAGS) $(CONFIGURE_FLAGS)

release: tree
	@TREE=$(RELEASE_TREE) tools/assemble.sh
	@tools/build.sh $(RELEASE_TREE) $(BASE_FLAGS) $(RELEASE_FLAGS) \
		$(RELEASE_FRAME_POINTERS) $(RELEASE_EXE_FLAGS) $(CONFIGURE_FLAGS)

# CPython links _bootstrap_python with the make variable only (the
# executable gets both: the same spec twice, to no effect).
release release-nofp stock-release install: export LDFLAGS_NODIST := $(NO_PIE_LINK)

release-nofp: tree
	@TREE=$(RELEASE_NOFP_TREE) tools/assemble.sh
	@tools/build.sh $(RELEASE_NOFP_TREE) $(BASE_FLAGS) $(RELEASE_FLAGS) \
		$(RELEASE_EXE_FLAGS) --without-frame-pointers $(CONFIGURE_FLAGS)

stock-release: deps
	@tools/bench-stock.sh $(STOCK_RELEASE_TREE) $(BASE_FLAGS) \
		$(RELEASE_FLAGS) $(RELEASE_EXE_FLAGS)

dist: deps
	@tools/dist.sh $(DIST_PATCH)

install: dist
	@tools/install.sh $(DIST_PATCH) "$(PREFIX)" "$(DESTDIR)" $(BASE_FLAGS) \
		$(RELEASE_FLAGS) $(RELEASE_FRAME_POINTERS) $(RELEASE_EXE_FLAGS) \
		$(CONFIGURE_FLAGS)

debian: deps-debian dist
	@tools/debian.sh $(DIST_PATCH) "$(PREFIX)" $(RELEASE_FLAGS) \
		$(RELEASE_FRAME_POINTERS) $(CONFIGURE_FLAGS)

install-debian: deps-debian dist
	@tools/debian.sh --install "$(DESTDIR)" $(DIST_PATCH) "$(PREFIX)" \
		$(RELEASE_FLAGS) $(RELEASE_FRAME_POINTERS) $(CONFIGURE_FLAGS)

# Our build is the cross build's build Python.
aarch64: deps-aarch64 build
	@tools/build-aarch64.sh $(BASE_FLAGS) $(CONFIGURE_FLAGS)

# make test runs our tests with our build, then ours and CPython's with
# the Debian build (our patch on what Debian ships; CPython's tests once),
# then (on an x86_64 host) ours with the aarch64 build under qemu-user;
# make test-debian and make test-aarch64 each one of those parts
# (without the tooling tests).
ifeq ($(shell uname -m),x86_64)
TEST_AARCH64 := aarch64
TEST_QEMU := --qemu $(AARCH64_TREE)
endif
# The tests' Debian tree is built without PGO and LTO (40 minutes less),
# with the release's frame records (the development build has them in
# every function): the tests run on both kinds.
test test-debian: RELEASE_FLAGS :=
test: deps-test build nofp debian ext $(TEST_AARCH64)
	@PERF_NOFP_PYTHON=$(NOFP_PYTHON) tools/run-tests.sh \
		--package-tree $(TREE) --tree $(DEBIAN_TREE) $(TEST_QEMU) --ext

test-debian: deps-test nofp debian
	@PERF_NOFP_PYTHON=$(NOFP_PYTHON) tools/run-tests.sh --no-tooling \
		--tree $(DEBIAN_TREE)

test-aarch64: deps-test aarch64
	@tools/run-tests.sh --qemu $(AARCH64_TREE)

test-release: deps-test nofp release
	@PERF_NOFP_PYTHON=$(NOFP_PYTHON) tools/run-tests.sh --no-tooling \
		--tree $(RELEASE_TREE)

# make deb: Debian's python3.11 source package of its newest revision
# with the dist patch in its quilt series, built by its own debian/rules
# (dpkg-buildpackage -B: PGO and LTO, 80 minutes on 2 shared cores) into
# build/deb/ (tools/deb.sh).  Debian's DEB_BUILD_OPTIONS: nocheck skips
# its test suite runs (the PGO training run stays).
DEB_BUILD_OPTIONS ?= nocheck parallel=$(NPROC)
deb: dist
	@DEB_BUILD_OPTIONS="$(DEB_BUILD_OPTIONS)" tools/deb.sh $(DIST_PATCH)

test-deb:
	@tools/test-deb.sh

# make deb in a clean Debian 12 root; its packages land in build/deb/.
deb-fresh:
	@tools/test-fresh.sh deb

# The README's two commands in a clean Debian 12 root (what CI runs).
test-fresh:
	@tools/test-fresh.sh

demo: build
	@tools/demo.sh

demo-jit: nofp
	@TREE=$(NOFP_TREE) tools/demo-jit.sh

# The README's picture, examples/flamegraph.png, from a record run of the demo.
picture: build
	@tools/picture.sh

# BENCH_RUNS=N (repetitions), BENCH_FILTER=fib,json (workloads),
# BENCH_UPSTREAM="py1 py2" (upstream interpreters; default: pyenv 3.12/3.13).
bench: build release ext
	@BASE_FLAGS="$(BASE_FLAGS)" tools/bench.sh

bench-perf-off: build
	@BASE_FLAGS="$(BASE_FLAGS)" tools/bench-perf-off.sh
	@python3 bench/figures.py collect-perf-off build/bench/perf_off.json
	@python3 bench/figures.py update

# --one-file-system: never into a fresh root's /dev or /sys that an
# interrupted make test-fresh left mounted.
clean:
	rm -rf --one-file-system build

# Reliability (issue 6): CPython's regression suite with and without
# PYTHONPERFSUPPORT=1 (about an hour on 2 cores), our tests on an
# ASan/UBSan build (build/cpython-asan), valgrind memcheck on -X perf.
.PHONY: test-regrtest-perf test-asan test-valgrind
test-regrtest-perf: build
	@tools/regrtest-perf.sh
test-asan: deps-test
	@tools/asan-test.sh
test-valgrind: build
	@tools/valgrind-test.sh
