#!/bin/bash
# make ext: build perftramp311 (ext/) for each stock CPython 3.11 here,
# the way its users install it, offline: Debian's /usr/bin/python3.11
# always, pyenv's 3.11.x where pyenv has one.  For each, the package
# source is staged standalone (ext/ plus the shared C sources, as
# `make ext-stage` does), pip installs it with --no-build-isolation into
# a venv of that interpreter, build/ext/venv-NAME, and builds its wheel
# into build/ext/dist/NAME/.  tools/run_tests.py runs ext/tests with every
# such venv.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
OUT=$ROOT/build/ext
say() { echo "ext: $*" >&2; }

# stage_shared DIR: the C sources ext/setup.py shares with the patch.
stage_shared() {
    mkdir -p "$1"
    cp "$ROOT"/Python/perf_trampoline.c "$ROOT"/Python/perf_map.c \
       "$ROOT"/Python/perf_jit_trampoline.c "$ROOT"/Python/perf_files.c \
       "$ROOT"/Python/perf_unwind.c "$ROOT"/Python/perf_gdb_jit.c \
       "$ROOT"/Python/asm_trampoline.S \
       "$ROOT"/Include/internal/pycore_perf.h "$1/"
}

# stage DIR: ext/ and the shared sources as one standalone directory.
stage() {
    local dir=$1
    rm -rf "$dir"
    mkdir -p "$dir"
    (cd "$ROOT/ext" && tar --exclude=build --exclude='*.egg-info' \
        --exclude=__pycache__ --exclude=shared -cf - .) | tar -C "$dir" -xf -
    stage_shared "$dir/shared"
}

# make ext-stage: ext/ itself made standalone (pip install ./ext from a
# copy of it, an sdist).
if [ "${1:-}" = stage-shared ]; then
    stage_shared "$2"
    exit 0
fi

interpreters=("debian:/usr/bin/python3.11")
pyenv_root=${PYENV_ROOT:-$HOME/.pyenv}
for py in "$pyenv_root"/versions/3.11.*/bin/python3.11; do
    if [ -x "$py" ]; then
        version=${py#"$pyenv_root"/versions/}
        interpreters+=("pyenv-${version%%/*}:$py")
    fi
done

[ -x /usr/bin/python3.11 ] || {
    say "error: /usr/bin/python3.11 is missing (make deps-test installs it)"
    exit 1
}
mkdir -p "$OUT"
for entry in "${interpreters[@]}"; do
    name=${entry%%:*}
    py=${entry#*:}
    src=$OUT/src-$name
    venv=$OUT/venv-$name
    say "$name: $py: staging $src, installing into $venv"
    stage "$src"
    rm -rf "$venv"
    env=()
    if [ "$name" = debian ]; then
        # Debian's pip, setuptools and wheel, as a Debian user has them.
        "$py" -m venv --system-site-packages "$venv"
    else
        # The interpreter's own pip and setuptools; setuptools builds
        # wheels with the wheel package, which pyenv does not install:
        # Debian's (pure Python) is lent to the build, nothing else.
        "$py" -m venv "$venv"
        lend=$OUT/lend-wheel
        mkdir -p "$lend"
        for f in /usr/lib/python3/dist-packages/wheel \
                 /usr/lib/python3/dist-packages/wheel-*-info; do
            ln -sfn "$f" "$lend/"
        done
        env=(PYTHONPATH="$lend")
    fi
    env "${env[@]}" "$venv/bin/python" -m pip install -q --no-index \
        --no-build-isolation "$src"
    env "${env[@]}" "$venv/bin/python" -m pip wheel -q --no-index \
        --no-build-isolation --no-deps -w "$OUT/dist/$name" "$src"
    # The C is built from the staged copy only: nothing in the source
    # directory may be left to the next build.
    rm -rf "$src/build"
    "$venv/bin/python" -m perftramp311 --status >&2
done
say "wheels: $(cd "$OUT" && echo dist/*/*.whl)"
