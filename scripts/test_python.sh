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

scripts/setup_venv.sh --python
PY=$ROOT/.venv/bin/python
if ! command -v cargo >/dev/null 2>&1 && [[ -f $HOME/.cargo/env ]]; then
  # shellcheck disable=SC1091
  . "$HOME/.cargo/env"
fi

WHEELS=$ROOT/.whl/python
rm -rf "$WHEELS"
start=$SECONDS
echo "test_python.sh: maturin build --release (python/pyproject.toml)"
cd "$ROOT/python"
"$ROOT/.venv/bin/maturin" build --release --quiet -o "$WHEELS" \
  --interpreter "$PY"
echo "test_python.sh: built $(cd "$WHEELS" && ls) in $((SECONDS - start)) s"
cd "$ROOT"
"$PY" -m pip install --disable-pip-version-check --no-input -q --force-reinstall --no-deps \
  "$WHEELS"/rafter-*.whl

export RAFTER_PY_REQUIRE_ALL=${RAFTER_PY_REQUIRE_ALL:-1}
export RAFTER_LLM_FIXTURES=${RAFTER_LLM_FIXTURES:-$ROOT/.cache/llm-fixtures}
# Run from outside python/ so the tests import the installed wheel, not the source tree.
cd "$ROOT/python/tests"
exec "$PY" -m pytest -q -p no:cacheprovider "$@" .
