#!/usr/bin/env bash
# Build the `rafter` Python package's wheel with maturin (from scratch: a fresh wheel every
# run; the Rust crates it links come from cargo's release cache in target/), install it into
# the project venv (.venv, with `scripts/setup_venv.sh --python`), and run python/tests.
#
# RAFTER_PY_REQUIRE_ALL=1 makes a missing reference (torch, torchvision, onnxruntime,
# tokenizers, the LLM fixtures) fail the run instead of skipping its tests. The LLM fixtures
# come from RAFTER_LLM_FIXTURES, else .cache/llm-fixtures (scripts/test.sh makes them).
# Extra arguments go to pytest.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
# shellcheck source=scripts/phase.sh
. scripts/phase.sh

phase "setup_venv.sh --python"
scripts/setup_venv.sh --python
PY=$ROOT/.venv/bin/python
if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

WHEELS=$ROOT/.whl/python
rm -rf "$WHEELS"
# maturin builds `-p rafter-py` alone; it reuses the release build above only where cargo
# resolves the same features for a crate as `cargo test --workspace --release` did (else
# most of rafter is built again, ~3 minutes). crates/rafter-py/Cargo.toml lists the shared
# dependencies whose workspace features it must turn on; this catches a new one.
phase "feature check: rafter-py alone vs the workspace"
host=$(rustc -vV | sed -n 's/^host: //p')
ws_features=$(mktemp)
py_features=$(mktemp)
cargo tree --workspace -e normal,build,dev --prefix none -f '{p} {f}' --target "$host" \
  >"$ws_features"
cargo tree -p rafter-py --features pyo3/extension-module -e normal,build --prefix none \
  -f '{p} {f}' --target "$host" >"$py_features"
differ=$(comm -13 <(sed 's/ (\*)$//' "$ws_features" | sort -u) \
  <(sed 's/ (\*)$//' "$py_features" | sort -u) | grep -v '^pyo3' || true)
rm -f "$ws_features" "$py_features"
if [[ -n $differ ]]; then
  echo "test_python.sh: maturin's rafter-py build resolves these dependencies with other" \
    "features than the workspace's (add the workspace's features to crates/rafter-py/Cargo.toml):" >&2
  echo "$differ" >&2
  exit 1
fi

phase "maturin build"
start=$SECONDS
echo "test_python.sh: maturin build --release (python/pyproject.toml)"
cd "$ROOT/python"
"$ROOT/.venv/bin/maturin" build --release --quiet -o "$WHEELS" \
  --interpreter "$PY"
echo "test_python.sh: built $(cd "$WHEELS" && ls) in $((SECONDS - start)) s"
cd "$ROOT"
"$PY" -m pip install --disable-pip-version-check --no-input -q --force-reinstall --no-deps \
  "$WHEELS"/rafter-*.whl

# A fresh venv as a user has one: `pip install ./python` (maturin through PEP 517, reusing
# target/'s build) pulls only numpy, and the README's two lines run on the BERT fixture.
phase "pip install ./python into a fresh venv"
FRESH=$ROOT/.cache/venv-python-fresh
rm -rf "$FRESH"
"$PY" -m venv "$FRESH"
start=$SECONDS
"$FRESH/bin/python" -m pip install --disable-pip-version-check --no-input -q --no-cache-dir "$ROOT/python"
echo "test_python.sh: pip install ./python into a fresh venv in $((SECONDS - start)) s:" \
  "$("$FRESH/bin/python" -m pip list --format=freeze 2>/dev/null | grep -v '^pip=' | tr '\n' ' ')"
(cd "$ROOT/tests/fixtures/bert_tiny" && "$FRESH/bin/python" - <<'PYEOF'
import numpy as np
import rafter
m = rafter.compile("model.onnx", dims={"seq": "<=64"})  # its position table holds 64
y = m(input_ids=np.load("seq7/input_ids.npy"), attention_mask=np.load("seq7/attention_mask.npy"))
err = float(np.abs(y - np.load("seq7/last_hidden_state.npy")).max())
assert err < 1e-4, err
print(f"test_python.sh: fresh venv: README example matches ONNX Runtime's output (max |diff| {err:.1e})")
PYEOF
)

phase "pytest python/tests"
export RAFTER_PY_REQUIRE_ALL=${RAFTER_PY_REQUIRE_ALL:-1}
export RAFTER_LLM_FIXTURES=${RAFTER_LLM_FIXTURES:-$ROOT/.cache/llm-fixtures}
# Run from outside python/ so the tests import the installed wheel, not the source tree.
cd "$ROOT/python/tests"
# (Not `exec`: the EXIT trap closes the phase.)
"$PY" -m pytest -q -p no:cacheprovider "$@" .
