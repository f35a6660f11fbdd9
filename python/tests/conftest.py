"""Shared paths and the rule for optional dependencies.

Tests that need torch, torchvision, onnxruntime or the LLM fixtures skip with the reason
when run by hand without them; with RAFTER_PY_REQUIRE_ALL=1 (scripts/test_python.sh in CI)
a missing one fails instead, so CI never skips silently.
"""

import importlib
import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BERT = ROOT / "tests" / "fixtures" / "bert_tiny"


def need(module: str):
    """Imports `module`, or skips (fails under RAFTER_PY_REQUIRE_ALL=1) without it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("RAFTER_PY_REQUIRE_ALL") == "1":
            pytest.fail(f"{module} is required here (RAFTER_PY_REQUIRE_ALL=1): {e}")
        pytest.skip(f"{module} is not installed: {e}")


def llm_fixtures() -> Path:
    """The LLM fixtures folder (scripts/test.sh makes it; RAFTER_LLM_FIXTURES points at it)."""
    env = os.environ.get("RAFTER_LLM_FIXTURES")
    path = Path(env) if env else ROOT / ".cache" / "llm-fixtures"
    if not (path / "manifest.json").is_file():
        msg = f"LLM fixtures not found in {path} (scripts/test.sh makes them)"
        if os.environ.get("RAFTER_PY_REQUIRE_ALL") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return path


@pytest.fixture(scope="session")
def bert():
    """The bert_tiny encoder compiled for the CPU with batch <= 4, seq <= 16."""
    import rafter

    return rafter.compile(str(BERT / "model.onnx"), dims={"batch": 4, "seq": "<=16"})
