#!/usr/bin/env bash
# Create (or reuse) the benchmark peers' Python venv at .venv-bench/ (git-ignored).
#
#   benchmarks/setup_peers.sh
#
# Installs the peers that benchmarks/run.py compares rafter with, each pinned:
# onnxruntime (CPU EP), torch (eager and torch.compile/TorchInductor), torchvision
# and transformers (the model definitions, random init, no weights downloaded),
# and IREE (iree-base-compiler: iree-import-onnx + iree-compile; iree-base-runtime:
# the llvm-cpu/local-task runtime). Separate from the project's .venv so the
# peers' versions can move without touching the conformance/fixture pins.
#
# torch: the CPU-only wheel index (download.pytorch.org/whl/cpu) is used when it
# answers; otherwise PyPI's default linux wheel (CUDA-enabled and large; only
# its CPU path is used). IREE is optional: if it cannot be installed the script
# says so, writes .venv-bench/IREE_UNAVAILABLE with the reason, and run.py skips
# IREE with that note in its table.
#
# Idempotent: pip runs only for pins that are missing or at another version.
# Set PYTHON to choose the interpreter (default python3.11, else python3; 3.11).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
VENV=$ROOT/.venv-bench

# Pins (the same torch/ORT/transformers versions as scripts/setup_venv.sh --full,
# so that the models re-created here match scripts/export_models.py's exports).
BASE_PKGS=(numpy==2.4.6 onnx==1.23.2 protobuf==7.36.2 ml_dtypes==0.6.0 onnxruntime==1.32.0)
TORCH_PKGS=(torch==2.15.0 torchvision==0.29.2)
HF_PKGS=(transformers==5.23.0)
IREE_PKGS=(iree-base-compiler==3.13.0 iree-base-runtime==3.13.0)
TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu

for arg in "$@"; do
  case "$arg" in
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    *) echo "setup_peers.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

pick_python() {
  local c
  for c in ${PYTHON:-} python3.11 python3; do
    if command -v "$c" >/dev/null 2>&1 &&
       "$c" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
      echo "$c"; return 0
    fi
  done
  echo "setup_peers.sh: need Python 3.11 (set PYTHON=...)" >&2
  return 1
}

if [[ -x $VENV/bin/python ]] && "$VENV/bin/python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' 2>/dev/null; then
  echo "setup_peers.sh: reusing $VENV ($("$VENV/bin/python" --version))"
else
  if [[ -e $VENV ]]; then
    echo "setup_peers.sh: $VENV is broken or not Python 3.11; recreating"
    rm -rf "$VENV"
  fi
  py=$(pick_python)
  echo "setup_peers.sh: creating $VENV with $py ($("$py" --version))"
  "$py" -m venv "$VENV"
fi

PIP=("$VENV/bin/python" -m pip install --disable-pip-version-check --no-input -q)

# Prints the specs among "$@" that are not installed at their pinned version.
missing() {
  "$VENV/bin/python" - "$@" <<'EOF'
import sys
from importlib.metadata import version, PackageNotFoundError
out = []
for spec in sys.argv[1:]:
    name, want = spec.split("==")
    try:
        have = version(name)
    except PackageNotFoundError:
        have = None
    # torch reports local versions such as 2.15.0+cpu
    if have is None or have.split("+")[0] != want:
        out.append(spec)
print(" ".join(out))
EOF
}

# 1. numpy, onnx, onnxruntime
m=$(missing "${BASE_PKGS[@]}")
if [[ -n $m ]]; then
  echo "setup_peers.sh: installing: $m"
  "${PIP[@]}" "${BASE_PKGS[@]}"
fi

# 2. torch + torchvision: CPU wheels if their index answers, else PyPI
m=$(missing "${TORCH_PKGS[@]}")
if [[ -n $m ]]; then
  if "$VENV/bin/python" -c "import urllib.request,sys; urllib.request.urlopen('$TORCH_CPU_INDEX/', timeout=10)" 2>/dev/null; then
    echo "setup_peers.sh: installing (CPU wheels from $TORCH_CPU_INDEX): ${TORCH_PKGS[*]}"
    "${PIP[@]}" --index-url "$TORCH_CPU_INDEX" --extra-index-url https://pypi.org/simple "${TORCH_PKGS[@]}"
  else
    echo "setup_peers.sh: $TORCH_CPU_INDEX unreachable; installing PyPI's default (CUDA-enabled) wheels: ${TORCH_PKGS[*]}"
    "${PIP[@]}" "${TORCH_PKGS[@]}"
  fi
fi

# 3. transformers
m=$(missing "${HF_PKGS[@]}")
if [[ -n $m ]]; then
  echo "setup_peers.sh: installing: $m"
  "${PIP[@]}" "${HF_PKGS[@]}"
fi

# 4. IREE (optional)
rm -f "$VENV/IREE_UNAVAILABLE"
m=$(missing "${IREE_PKGS[@]}")
if [[ -n $m ]]; then
  echo "setup_peers.sh: installing: $m"
  if ! out=$("${PIP[@]}" "${IREE_PKGS[@]}" 2>&1); then
    echo "$out" | tail -5 >&2
    echo "pip install ${IREE_PKGS[*]} failed: $(echo "$out" | tail -1)" > "$VENV/IREE_UNAVAILABLE"
    echo "setup_peers.sh: WARNING: IREE could not be installed; benchmarks/run.py will skip it" >&2
  fi
fi
if [[ ! -e $VENV/IREE_UNAVAILABLE ]]; then
  for tool in iree-import-onnx iree-compile; do
    if [[ ! -x $VENV/bin/$tool ]]; then
      echo "$tool missing from $VENV/bin after installing ${IREE_PKGS[*]}" > "$VENV/IREE_UNAVAILABLE"
      echo "setup_peers.sh: WARNING: $tool missing; benchmarks/run.py will skip IREE" >&2
    fi
  done
fi

# Versions, as run.py reports them.
"$VENV/bin/python" - <<'EOF'
from importlib.metadata import version, PackageNotFoundError
names = ["numpy", "onnx", "onnxruntime", "torch", "torchvision", "transformers",
         "iree-base-compiler", "iree-base-runtime"]
def v(n):
    try:
        return version(n)
    except PackageNotFoundError:
        return "not installed"
print("setup_peers.sh: " + ", ".join(f"{n} {v(n)}" for n in names))
EOF
echo "setup_peers.sh: done ($VENV/bin/python)"
