#!/usr/bin/env bash
# Build llama.cpp (CPU only, native flags, Release) from the llama-cpp-python sdist on
# PyPI into .cache/llama.cpp/ (git-ignored): the peer for the LLM benchmarks and the
# source of the llama.cpp references in scripts/gen_llm_fixtures.py.
#
#   benchmarks/setup_llama_cpp.sh            fetch (pinned version + sha256), build, report
#   benchmarks/setup_llama_cpp.sh --print-dir   print .cache/llama.cpp and exit
#   benchmarks/setup_llama_cpp.sh --no-amx      native, without ggml's AMX kernels (see below)
#   benchmarks/setup_llama_cpp.sh --lib-only    only libllama and the ggml libraries (see below)
#
# What it leaves (LLAMA_DIR=.cache/llama.cpp):
#   $LLAMA_DIR/src/llama_cpp_python-$VERSION/   the unpacked sdist; vendor/llama.cpp holds
#                 llama.cpp's source, convert_hf_to_gguf.py and gguf-py, which the fixture
#                 script runs (the converter and gguf-py of the same commit as the binaries)
#   $LLAMA_DIR/build/bin/   llama-bench, llama-completion, llama-quantize, llama-tokenize
#                 and the shared libraries libllama.so, libggml*.so (--lib-only: those only)
#   $LLAMA_DIR/python/llama_cpp/   the sdist's Python bindings (llama-cpp-python), with
#                 lib/ pointing at the libraries above: `sys.path.insert(0, "$LLAMA_DIR/python")`
#                 then `import llama_cpp` uses this build (needs numpy, diskcache, jinja2,
#                 typing-extensions: scripts/setup_venv.sh --llm has them). The bindings are
#                 the sdist's own ctypes code; only the C++ build is shared with the tools
#                 instead of being compiled a second time by pip.
#   $LLAMA_DIR/STAMP        version, sdist sha256 and cmake flags of the finished build
#   $LLAMA_DIR/tools-venv/  pinned cmake and ninja from PyPI (used when the system has none)
#
# --lib-only (or LLAMA_LIB_ONLY=1): build only the `llama` target, the shared libraries the
# Python bindings load. That is all scripts/gen_llm_fixtures.py uses (the bindings for its
# references and tokenizer checks, libllama's quantizer through scripts/llm_fixtures/quantize.py),
# so CI (scripts/test.sh) builds this: the tools add llama.cpp's `common` library and
# cpp-httplib, 71 more build steps after the libraries' 78. Same flags, so the same
# libraries: a full build later reuses the objects, and a lib-only call after a full build
# finds it up to date.
#
# Idempotent: when STAMP matches what this script would build, it only reports. The
# build uses all cores (`nproc`); set JOBS to override. Prints the time each step took.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
LLAMA_DIR=$ROOT/.cache/llama.cpp

VERSION=0.3.36
SDIST=llama_cpp_python-$VERSION.tar.gz
SDIST_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
TOOL_PKGS=(cmake==4.4.4 ninja==1.13.2)
TARGETS_ALL=(llama-bench llama-completion llama-quantize llama-tokenize llama)
TARGETS_LIB=(llama)
CMAKE_FLAGS=(
  -DCMAKE_BUILD_TYPE=Release
  -DGGML_NATIVE=ON
  -DBUILD_SHARED_LIBS=ON
  -DGGML_CPU=ON -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF
  -DGGML_OPENMP=ON
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF
  -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_BUILD_TOOLS=ON
)

# --no-amx (or LLAMA_NO_AMX=1): build without ggml's AMX kernels. On a VM whose cpuid
# advertises AMX, the native build compiles them and llama-bench died with SIGILL in
# `tinygemm_kernel_amx<block_q8_0>` at q8_0/q4_0 (2026-11-29, 2-core Xeon VM), although a
# tile instruction after `arch_prctl(ARCH_REQ_XCOMP_PERM)` runs there: the peer's best
# configuration that works is then native without AMX. GCC's explicit -mno-* flags win
# over -march=native whatever their order.
no_amx=${LLAMA_NO_AMX:-0}
lib_only=${LLAMA_LIB_ONLY:-0}
for arg in "$@"; do
  case "$arg" in
    --no-amx) no_amx=1 ;;
    --lib-only) lib_only=1 ;;
    --print-dir) echo "$LLAMA_DIR"; exit 0 ;;
    -h|--help) sed -n '2,35p' "$0"; exit 0 ;;
    *) echo "setup_llama_cpp.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

if [[ $no_amx == 1 ]]; then
  NO_AMX_FLAGS="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  CMAKE_FLAGS+=("-DCMAKE_C_FLAGS=$NO_AMX_FLAGS" "-DCMAKE_CXX_FLAGS=$NO_AMX_FLAGS")
fi

SRC=$LLAMA_DIR/src/llama_cpp_python-$VERSION
BUILD=$LLAMA_DIR/build
stamp_for() {
  echo "llama-cpp-python $VERSION sha256 $SDIST_SHA256 flags ${CMAKE_FLAGS[*]} targets $* cpu $(grep -m1 '^model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
}
STAMP_ALL=$(stamp_for "${TARGETS_ALL[@]}")
if [[ $lib_only == 1 ]]; then
  TARGETS=("${TARGETS_LIB[@]}")
  STAMP_WANT=$(stamp_for "${TARGETS_LIB[@]}")
else
  TARGETS=("${TARGETS_ALL[@]}")
  STAMP_WANT=$STAMP_ALL
fi

have_stamp=$(cat "$LLAMA_DIR/STAMP" 2>/dev/null || true)
if [[ -e $LLAMA_DIR/python/llama_cpp/lib/libllama.so ]] &&
   { { [[ $have_stamp == "$STAMP_ALL" ]] && [[ -x $BUILD/bin/llama-bench ]]; } ||
     { [[ $lib_only == 1 && $have_stamp == "$STAMP_WANT" ]]; }; }; then
  echo "setup_llama_cpp.sh: up to date ($LLAMA_DIR, llama-cpp-python $VERSION, ${have_stamp#*targets })"
  exit 0
fi

mkdir -p "$LLAMA_DIR/dl" "$LLAMA_DIR/src"
t_all=$SECONDS

pick_python() {
  local c
  for c in ${PYTHON:-} "$ROOT/.venv/bin/python" python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1; then echo "$c"; return 0; fi
  done
  echo "setup_llama_cpp.sh: need a Python 3 interpreter with pip (set PYTHON=...)" >&2
  return 1
}

# 1. cmake and ninja: the system's if present, else pinned wheels in tools-venv.
t=$SECONDS
if command -v cmake >/dev/null 2>&1 && command -v ninja >/dev/null 2>&1; then
  CMAKE=$(command -v cmake); NINJA=$(command -v ninja)
else
  TV=$LLAMA_DIR/tools-venv
  if [[ ! -x $TV/bin/cmake || ! -x $TV/bin/ninja ]]; then
    py=$(pick_python)
    rm -rf "$TV"
    "$py" -m venv "$TV"
    "$TV/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-cache-dir "${TOOL_PKGS[@]}"
  fi
  CMAKE=$TV/bin/cmake; NINJA=$TV/bin/ninja
fi
echo "setup_llama_cpp.sh: $("$CMAKE" --version | head -n1), ninja $("$NINJA" --version) ($((SECONDS - t)) s)"

# 2. The sdist from PyPI, pinned by version, checked by sha256.
t=$SECONDS
if [[ ! -f $LLAMA_DIR/dl/$SDIST ]] || ! echo "$SDIST_SHA256  $LLAMA_DIR/dl/$SDIST" | sha256sum -c --quiet 2>/dev/null; then
  rm -f "$LLAMA_DIR/dl/$SDIST"
  py=$(pick_python)
  # --no-binary for this package only (its build requirements stay wheels); pip only
  # reads its metadata, nothing is compiled here.
  "$py" -m pip download --disable-pip-version-check --no-input -q --no-deps \
    --no-binary llama-cpp-python -d "$LLAMA_DIR/dl" "llama-cpp-python==$VERSION"
fi
if ! echo "$SDIST_SHA256  $LLAMA_DIR/dl/$SDIST" | sha256sum -c --quiet; then
  echo "setup_llama_cpp.sh: $LLAMA_DIR/dl/$SDIST: sha256 $(sha256sum "$LLAMA_DIR/dl/$SDIST" | cut -d' ' -f1) != pinned $SDIST_SHA256" >&2
  exit 1
fi
if [[ ! -f $SRC/vendor/llama.cpp/CMakeLists.txt ]]; then
  rm -rf "$SRC"
  tar -xzf "$LLAMA_DIR/dl/$SDIST" -C "$LLAMA_DIR/src"
fi
echo "setup_llama_cpp.sh: sdist $SDIST (sha256 ok) in $SRC ($((SECONDS - t)) s)"

# 3. Configure and build the tools and the shared libraries.
t=$SECONDS
"$CMAKE" -S "$SRC/vendor/llama.cpp" -B "$BUILD" -G Ninja -DCMAKE_MAKE_PROGRAM="$NINJA" \
  "${CMAKE_FLAGS[@]}" >"$LLAMA_DIR/cmake.log" 2>&1 || {
  tail -n 30 "$LLAMA_DIR/cmake.log" >&2
  echo "setup_llama_cpp.sh: cmake configure failed (log: $LLAMA_DIR/cmake.log)" >&2
  exit 1
}
echo "setup_llama_cpp.sh: configured ($((SECONDS - t)) s)"
t=$SECONDS
"$CMAKE" --build "$BUILD" -j "${JOBS:-$(nproc)}" --target "${TARGETS[@]}" >"$LLAMA_DIR/build.log" 2>&1 || {
  tail -n 30 "$LLAMA_DIR/build.log" >&2
  echo "setup_llama_cpp.sh: build failed (log: $LLAMA_DIR/build.log)" >&2
  exit 1
}
echo "setup_llama_cpp.sh: built ${TARGETS[*]} with ${JOBS:-$(nproc)} jobs ($((SECONDS - t)) s)"

# 4. The Python bindings of the same sdist, bound to these libraries.
rm -rf "$LLAMA_DIR/python"
mkdir -p "$LLAMA_DIR/python"
cp -r "$SRC/llama_cpp" "$LLAMA_DIR/python/llama_cpp"
ln -s "$BUILD/bin" "$LLAMA_DIR/python/llama_cpp/lib"
for f in libllama.so libggml.so libggml-base.so libggml-cpu.so; do
  if [[ ! -e $BUILD/bin/$f ]]; then
    echo "setup_llama_cpp.sh: $BUILD/bin/$f missing after the build" >&2
    exit 1
  fi
done

if [[ $lib_only == 0 ]]; then
  "$BUILD/bin/llama-bench" --help >/dev/null
fi
echo "$STAMP_WANT" >"$LLAMA_DIR/STAMP"
echo "setup_llama_cpp.sh: done in $((SECONDS - t_all)) s: $BUILD/bin ($(ls "$BUILD/bin" | tr '\n' ' '))"
