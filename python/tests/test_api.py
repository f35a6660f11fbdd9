"""The Model API: ports, plan, save/load, calling conventions and every error path."""

import os
import subprocess

import numpy as np
import pytest

import rafter
from conftest import BERT, ROOT


def bert_inputs(seq=7):
    d = BERT / f"seq{seq}"
    return np.load(d / "input_ids.npy"), np.load(d / "attention_mask.npy")


def test_ports(bert):
    assert [p.name for p in bert.inputs] == ["input_ids", "attention_mask"]
    assert bert.inputs[0].dtype == "i64"
    assert bert.inputs[0].dims == ["batch", "seq"]
    (out,) = bert.outputs
    assert (out.name, out.dtype, out.dims) == ("last_hidden_state", "f32", ["batch", "seq", 32])
    assert "cpu" in bert.devices


def rafter_cli():
    """The `rafter` command built from this tree (scripts/test_python.sh builds it)."""
    exe = ROOT / "target" / "release" / "rafter"
    if not exe.is_file():
        msg = f"{exe} not built (cargo build --release -p rafter-cli)"
        if os.environ.get("RAFTER_PY_REQUIRE_ALL") == "1":
            pytest.fail(msg)
        pytest.skip(msg)
    return exe


def test_plan_names_kernels_and_bounds(bert):
    plan = bert.plan()
    assert plan.startswith("program `")
    assert "input input_ids: i64[batch, seq]" in plan
    assert "bounds: " in plan and "seq<=16" in plan
    assert "\nsteps:\n" in plan and " k0 `" in plan
    assert plan.splitlines()[-1].startswith("memory cpu: arena ")


def test_plan_is_what_rafter_plan_prints(bert, tmp_path):
    """One renderer (rafter_compiler::plan_report): the CLI's report of the same ONNX model
    with the same bounds, and of the saved artifact, is m.plan() to the byte."""
    exe = rafter_cli()
    model = BERT / "model.onnx"
    cli = subprocess.run(
        [str(exe), "plan", str(model), "--dim", "batch<=4", "--dim", "seq<=16"],
        capture_output=True, text=True, check=True,
    ).stdout
    assert cli == bert.plan()
    rfa = tmp_path / "bert.rfa"
    bert.save(rfa)
    cli = subprocess.run([str(exe), "plan", str(rfa)], capture_output=True, text=True,
                         check=True).stdout
    assert cli == rafter.load(rfa).plan()


def test_call_conventions_agree(bert):
    ids, mask = bert_inputs()
    want = np.load(BERT / "seq7" / "last_hidden_state.npy")
    for got in (
        bert(ids, mask),
        bert(input_ids=ids, attention_mask=mask),
        bert(ids, attention_mask=mask),
        bert(ids.tolist(), mask.tolist()),  # lists take the input's dtype
    ):
        assert isinstance(got, np.ndarray) and got.dtype == np.float32
        np.testing.assert_allclose(got, want, atol=1e-4)
    # A non-contiguous array is read correctly (made row-major first).
    wide = np.zeros((ids.shape[0], ids.shape[1] * 2), ids.dtype)
    wide[:, ::2] = ids
    np.testing.assert_allclose(bert(wide[:, ::2], mask), want, atol=1e-4)


def test_save_load_roundtrip(bert, tmp_path):
    ids, mask = bert_inputs()
    path = tmp_path / "bert.rfa"
    size = bert.save(path)
    assert size == path.stat().st_size > 0
    loaded = rafter.load(path)
    np.testing.assert_array_equal(loaded(ids, mask), bert(ids, mask))
    # compile() of an artifact path loads it (told apart by content, not extension).
    renamed = tmp_path / "bert.onnx"
    renamed.write_bytes(path.read_bytes())
    np.testing.assert_array_equal(rafter.compile(renamed)(ids, mask), bert(ids, mask))
    # A loaded model saves its artifact again.
    again = tmp_path / "again.rfa"
    loaded.save(again)
    assert again.read_bytes() == path.read_bytes()


def test_devices():
    devs = rafter.devices()
    assert devs[0]["name"] == "cpu" and devs[0]["available"] is True and devs[0]["cores"] >= 1
    vk = [d for d in devs if d["name"] == "vulkan"]
    assert len(vk) == 1 and (vk[0]["available"] or vk[0]["error"])


def test_hierarchy():
    for e in (rafter.ModelError, rafter.CompileError, rafter.InputError, rafter.RunError,
              rafter.DeviceError, rafter.LLMError):
        assert issubclass(e, rafter.Error) and issubclass(e, Exception)


def test_model_errors(tmp_path):
    with pytest.raises(rafter.ModelError, match="missing.onnx"):
        rafter.compile(tmp_path / "missing.onnx")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\xff\xff\xff\xff not a protobuf")
    with pytest.raises(rafter.ModelError):
        rafter.compile(junk)
    with pytest.raises(rafter.ModelError, match="missing.rfa"):
        rafter.load(tmp_path / "missing.rfa")


def test_corrupt_artifact(bert, tmp_path):
    path = tmp_path / "bert.rfa"
    bert.save(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    bad = tmp_path / "bad.rfa"
    bad.write_bytes(bytes(data))
    with pytest.raises(rafter.ModelError):
        rafter.load(bad)
    short = tmp_path / "short.rfa"
    short.write_bytes(bytes(data[:100]))
    with pytest.raises(rafter.ModelError):
        rafter.load(short)


def test_compile_errors(tmp_path):
    onnx = BERT / "model.onnx"
    with pytest.raises(rafter.CompileError, match="tpu"):
        rafter.compile(onnx, target="tpu")
    with pytest.raises(rafter.CompileError, match="no symbol `sequence`"):
        rafter.compile(onnx, dims={"sequence": 16})
    with pytest.raises(rafter.CompileError, match="expected an upper bound"):
        rafter.compile(onnx, dims={"seq": "lots"})
    with pytest.raises(rafter.CompileError, match="positive"):
        rafter.compile(onnx, dims={"seq": 0})
    with pytest.raises(rafter.CompileError, match="cannot compile a int"):
        rafter.compile(3)
    with pytest.raises(rafter.CompileError, match="threads = -1"):
        rafter.compile(onnx, threads=-1)
    path = tmp_path / "m.rfa"
    rafter.compile(onnx, dims={"batch": 1, "seq": 8}).save(path)
    with pytest.raises(rafter.CompileError, match="fixed when it was compiled"):
        rafter.compile(path, dims={"seq": 8})


def test_input_errors(bert):
    ids, mask = bert_inputs()
    with pytest.raises(rafter.InputError, match="takes 2 inputs"):
        bert(ids, mask, mask)
    with pytest.raises(rafter.InputError, match="missing inputs: attention_mask"):
        bert(ids)
    with pytest.raises(rafter.InputError, match="no input `mask`"):
        bert(ids, mask=mask)
    with pytest.raises(rafter.InputError, match="given twice"):
        bert(ids, mask, input_ids=ids)
    with pytest.raises(rafter.InputError, match="input `input_ids`: expected i64, got i32"):
        bert(ids.astype(np.int32), mask)
    with pytest.raises(rafter.InputError, match="attention_mask"):
        bert(ids, mask[:, :5])  # seq disagrees between the inputs
    with pytest.raises(rafter.InputError):
        bert(ids[0], mask)  # wrong rank
    with pytest.raises(rafter.InputError):
        bert(np.zeros((1, 17), np.int64), np.ones((1, 17), np.int64))  # over the bound
    with pytest.raises(rafter.InputError, match="cannot read"):
        bert("text", mask)
    # The model still runs correctly after every refusal.
    np.testing.assert_allclose(bert(ids, mask), np.load(BERT / "seq7" / "last_hidden_state.npy"), atol=1e-4)


def test_bad_index_is_an_error_not_a_crash(bert):
    ids, mask = bert_inputs()
    bad = ids.copy()
    bad[0, 0] = 1_000_000  # vocab is 100
    try:
        bert(bad, mask)
    except rafter.Error:
        pass  # refused with a message: fine; reaching here at all means no crash
