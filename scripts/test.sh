#!/usr/bin/env bash
# Run the project's tests: ensure the venv and the ONNX conformance cache, then
# `cargo test --workspace --release` (extra arguments go to cargo test), and without
# arguments the Python package's tests (scripts/test_python.sh).
#
# The cache (.cache/onnx-conformance, git-ignored) is (re)generated with
# scripts/gen_conformance_data.py when its STAMP is missing or differs from the
# one the pinned generator would write.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
# shellcheck source=scripts/phase.sh
. scripts/phase.sh

phase "setup_venv.sh --server"
scripts/setup_venv.sh --server   # + the openai client for `rafter serve`'s test
PY=$ROOT/.venv/bin/python
CONF=$ROOT/.cache/onnx-conformance

phase "conformance cache"
want=$("$PY" scripts/gen_conformance_data.py --stamp)
have=$(cat "$CONF/STAMP" 2>/dev/null || true)
if [[ "$have" != "$want" ]]; then
  echo "test.sh: conformance cache missing or stale; generating $CONF"
  "$PY" scripts/gen_conformance_data.py "$CONF"
else
  echo "test.sh: conformance cache up to date ($CONF, $(head -n1 "$CONF/STAMP"))"
fi
export RAFTER_CONFORMANCE_DIR=$CONF
# Tokenizer and chat-template data for crates/rafter-generate (.cache/llm-tokenizers; the
# script keeps its own venv, .cache/venv-tokenizers, and rebuilds only when its stamp changes).
phase "tokenizer fixtures"
python3 scripts/gen_tokenizer_fixtures.py
# LLM fixtures (tests/fixtures/llm/README.md): tiny checkpoints of each architecture, their
# transformers references and GGUFs (llama.cpp's converter and quantizer, built from a pinned
# sdist: only its libraries, which is all the generator uses), checked against the committed
# expected.json. Regenerated when the generator, its
# pins or expected.json change (a stamp), or taken from RAFTER_LLM_FIXTURES when set.
if [[ -z ${RAFTER_LLM_FIXTURES:-} ]]; then
  LLM=$ROOT/.cache/llm-fixtures
  llm_want=$(cat scripts/gen_llm_fixtures.py scripts/llm_fixtures/*.py \
    tests/fixtures/llm/expected.json scripts/setup_venv.sh benchmarks/setup_llama_cpp.sh |
    sha256sum | cut -d' ' -f1)
  if [[ "$(cat "$LLM/STAMP" 2>/dev/null || true)" != "$llm_want" ]]; then
    echo "test.sh: LLM fixtures missing or stale; generating $LLM"
    phase "LLM fixtures: setup_venv.sh --llm"
    scripts/setup_venv.sh --llm
    phase "LLM fixtures: llama.cpp"
    benchmarks/setup_llama_cpp.sh --lib-only
    phase "LLM fixtures: gen_llm_fixtures.py"
    "$PY" scripts/gen_llm_fixtures.py --no-llama-cpp
    echo "$llm_want" >"$LLM/STAMP"
  else
    echo "test.sh: LLM fixtures up to date ($LLM)"
  fi
  export RAFTER_LLM_FIXTURES=$LLM
fi
# The corpus of models as ONNX Runtime's tools write them (scripts/make_corpus.py: ORT's
# quantizers, transformer optimizer and GenAI model builder, torch exports), with ORT's
# outputs; crates/rafter-conformance/tests/corpus.rs runs it on the CPU and on Vulkan.
# Rebuilt when the script or the pins change (a stamp), or taken from RAFTER_CORPUS_DIR.
if [[ -z ${RAFTER_CORPUS_DIR:-} ]]; then
  CORPUS=$ROOT/.cache/corpus
  corpus_want=$(cat scripts/make_corpus.py scripts/setup_venv.sh | sha256sum | cut -d' ' -f1)
  if [[ "$(cat "$CORPUS/STAMP" 2>/dev/null || true)" != "$corpus_want" ]]; then
    phase "corpus: setup_venv.sh --corpus"
    scripts/setup_venv.sh --corpus
    phase "corpus: make_corpus.py"
    rm -rf "$CORPUS"
    "$PY" scripts/make_corpus.py "$CORPUS"
    echo "$corpus_want" >"$CORPUS/STAMP"
  else
    echo "test.sh: corpus up to date ($CORPUS)"
  fi
  export RAFTER_CORPUS_DIR=$CORPUS
fi
# The venv's spirv-val (SPIRV-Tools 2025.5) validates cooperative-matrix modules.
export RAFTER_SPIRV_VAL=$ROOT/.venv/bin/spirv-val
# rafter-stress's random run (crates/rafter-stress/tests/stress.rs): 30 s of rounds here, not
# its own default of 60, to keep CI's time; each run draws a new seed, so the rounds add up
# over runs. RAFTER_STRESS_SECS=60 (or more) in the environment gives the long run.
export RAFTER_STRESS_SECS=${RAFTER_STRESS_SECS:-30}

if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi
echo "test.sh: RAFTER_CONFORMANCE_DIR=$RAFTER_CONFORMANCE_DIR RAFTER_SPIRV_VAL=$RAFTER_SPIRV_VAL" \
  "RAFTER_STRESS_SECS=$RAFTER_STRESS_SECS RAFTER_CORPUS_DIR=$RAFTER_CORPUS_DIR"
phase "cargo test --workspace --release $*"
cargo test --workspace --release "$@"
# The Vulkan HAL's tests again under the Khronos validation layer (core checks; Debian's
# vulkan-validationlayers, installed by .ci/run): each test fails on any message the layer
# reports (crates/rafter-hal-vulkan/tests/common). Synchronization validation is left to
# by-hand runs (RAFTER_VULKAN_VALIDATION=sync): Debian's layer (1.3.239) stalls seconds per
# host-waited timeline semaphore there (its own bug, KhronosGroup/Vulkan-ValidationLayers#4968).
# The binaries the workspace run built are run again (as cargo runs them: from the crate's
# folder): `cargo test -p rafter-hal-vulkan` would resolve features for that crate alone
# and rebuild its dependencies (~3 minutes) for the same tests.
# One test at a time (~5 s more): that layer tracks the objects of devices open at once in
# one process with races of its own; tests that each opened a device in parallel on a
# loaded host drew, about one run in 80, "VkBuffer was not created ... from the correct
# device" for a buffer the same device had just created.
if [[ $# == 0 ]]; then
  mapfile -t vk_tests < <(cargo test --workspace --release --no-run --message-format=json 2>/dev/null |
    "$PY" -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m.get("executable") and \
            "/crates/rafter-hal-vulkan/" in m["target"]["src_path"]:
        print(m["executable"])')
  if (( ${#vk_tests[@]} < 2 )); then
    echo "test.sh: rafter-hal-vulkan's test binaries not found (${#vk_tests[@]})" >&2
    exit 1
  fi
  phase "rafter-hal-vulkan's tests under the validation layer"
  for t in "${vk_tests[@]}"; do
    echo "test.sh: RAFTER_VULKAN_VALIDATION=core $(basename "$t") (rafter-hal-vulkan)"
    (cd "$ROOT/crates/rafter-hal-vulkan" && RAFTER_VULKAN_VALIDATION=core "$t" --test-threads=1)
  done
fi
# The Python package (python/, crates/rafter-py): its wheel built by maturin over the release
# build above, then python/tests. On a full run only (no arguments), as CI's.
if [[ $# == 0 ]]; then
  phase "scripts/test_python.sh"
  scripts/test_python.sh
fi
