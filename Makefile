# Front door: build and test CPython 3.11.2 with perf trampolines.
# `make help` lists the targets.

TREE      := build/cpython
PYTHON    := $(TREE)/python
NPROC     := $(shell nproc 2>/dev/null || echo 2)
# Extra ./configure arguments (frame pointers and perf trampolines are the
# configure defaults on x86_64/aarch64 Linux).
CONFIGURE_FLAGS ?=

.PHONY: all build deps tree export test demo bench clean help

all: build

help:
	@echo "make            build $(PYTHON) (fetches and assembles the tree if needed)"
	@echo "make test       build, then run the tests; ends with 'N passed, N failed, N skipped'"
	@echo "make demo       profile examples/demo.py under perf and show Python frames"
	@echo "make bench      benchmarks: stock 3.11.2 vs ours (perf off/on) vs upstream"
	@echo "make tree       (re)assemble $(TREE) from the pristine source + overlay + patches"
	@echo "make export     write edits in $(TREE) back to the overlay and patches/"
	@echo "make deps       install missing Debian build dependencies (as root)"
	@echo "make clean      remove build/"

deps:
	@tools/install-deps.sh

tree: deps
	@tools/assemble.sh

export:
	@tools/export.sh

build: tree
	@tools/build.sh $(TREE) $(CONFIGURE_FLAGS)

test: build
	@tools/run-tests.sh

demo: build
	@tools/demo.sh

clean:
	rm -rf build
