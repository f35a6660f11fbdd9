"""DLPack: torch tensors in and out without copies, numpy out without a copy, the lent
memory outliving the rafter tensor; inputs read in place (no copy), strided ones copied
once, and a call holding its inputs until its work completes."""

import gc
import time
import weakref

import numpy as np
import pytest

import rafter
from conftest import BERT, need


def test_numpy_output_views_rafter_memory(bert):
    ids = np.load(BERT / "seq7" / "input_ids.npy")
    mask = np.load(BERT / "seq7" / "attention_mask.npy")
    (t,) = bert._native.run([ids, mask])
    assert isinstance(t, rafter.Tensor) and t.dtype == "f32" and t.shape == [1, 7, 32]
    a = np.from_dlpack(t)
    assert a.ctypes.data == t.data_ptr  # a view, not a copy
    ref = a.copy()
    del t
    gc.collect()
    np.testing.assert_array_equal(a, ref)  # the view keeps the memory alive


def test_torch_in_and_out_without_copies(bert):
    torch = need("torch")
    ids = torch.from_numpy(np.load(BERT / "seq7" / "input_ids.npy"))
    mask = torch.from_numpy(np.load(BERT / "seq7" / "attention_mask.npy"))
    # In: the torch tensors themselves go to the native call, read in place via DLPack.
    inputs, like = bert._gather((ids, mask), {})
    assert like == "torch" and inputs[0] is ids and inputs[1] is mask
    # Out: a torch tensor over rafter's own output memory.
    (t,) = bert._native.run(inputs)
    y = torch.from_dlpack(t)
    assert y.data_ptr() == t.data_ptr
    del t
    gc.collect()
    want = np.load(BERT / "seq7" / "last_hidden_state.npy")
    np.testing.assert_allclose(y.numpy(), want, atol=1e-4)
    # The public call returns torch for torch inputs, with the same values.
    out = bert(ids, mask)
    assert isinstance(out, torch.Tensor)
    np.testing.assert_allclose(out.numpy(), want, atol=1e-4)
    # A non-contiguous torch tensor is made contiguous first, not misread.
    wide = torch.zeros(1, 14, dtype=torch.int64)
    wide[:, ::2] = ids
    np.testing.assert_allclose(bert(wide[:, ::2], mask).numpy(), want, atol=1e-4)


def test_non_cpu_and_non_tensor_inputs_are_refused(bert):
    class NotCpu:
        def __dlpack_device__(self):
            return (2, 0)

        def __dlpack__(self, **kw):
            raise BufferError("on the GPU")

    mask = np.ones((1, 7), np.int64)
    with pytest.raises(BufferError):
        bert._native.run([NotCpu(), mask])
    with pytest.raises(rafter.InputError, match="not a tensor"):
        bert._native.run([object(), mask])


# -- inputs read in place (no copy) -----------------------------------------------------


@pytest.fixture(scope="module")
def affine(tmp_path_factory):
    """``y = x @ w + b`` over f32 x [n, 8] (n <= 64), built with onnx.helper: its input
    only meets CPU kernels, so calls read it in place. Returns the model, w and b."""
    onnx = need("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    w = rng.standard_normal((8, 4)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w"], ["xw"]),
            helper.make_node("Add", ["xw", "b"], ["y"]),
        ],
        "affine",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 4])],
        [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path_factory.mktemp("affine") / "affine.onnx"
    onnx.save(model, str(path))
    m = rafter.compile(str(path), dims={"n": 64}, threads=1)
    return m, w, b


def _copies(m):
    c = m.input_copies
    return c["converted"], c["written"]


def test_torch_and_numpy_inputs_are_read_without_a_copy(affine):
    torch = need("torch")
    m, w, b = affine
    assert m.inputs_in_place == ["x"]
    before = _copies(m)
    x = np.random.default_rng(1).standard_normal((5, 8)).astype(np.float32)
    np.testing.assert_allclose(m(x), x @ w + b, rtol=1e-5, atol=1e-5)
    t = torch.from_numpy(x.copy())
    y = m(t)
    assert isinstance(y, torch.Tensor)
    np.testing.assert_allclose(y.numpy(), x @ w + b, rtol=1e-5, atol=1e-5)
    # Neither the numpy array nor the torch tensor was copied, by rafter's reader or into
    # an input buffer: the kernels read the callers' memory.
    assert _copies(m) == before
    # So does a submitted call.
    np.testing.assert_allclose(m.submit(x).result(), x @ w + b, rtol=1e-5, atol=1e-5)
    assert _copies(m) == before


def test_strided_and_misaligned_inputs_are_copied_once_and_read_right(affine):
    torch = need("torch")
    m, w, b = affine
    x = np.random.default_rng(2).standard_normal((6, 8)).astype(np.float32)
    want = x @ w + b
    fortran = np.asfortranarray(x)
    wide = np.zeros((6, 16), np.float32)
    wide[:, ::2] = x
    raw = np.zeros(x.nbytes + 1, np.uint8)
    misaligned = raw[1:].view(np.float32).reshape(6, 8)
    misaligned[...] = x
    assert misaligned.ctypes.data % 4 != 0
    cases = [
        ("fortran", fortran),
        ("strided", wide[:, ::2]),
        ("misaligned", misaligned),
        ("torch transposed", torch.from_numpy(np.ascontiguousarray(x.T)).t()),
        ("reversed rows", x[::-1].copy()[::-1]),
    ]
    for name, value in cases:
        converted, written = _copies(m)
        got = m(value)
        got = got.numpy() if isinstance(got, torch.Tensor) else got
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=name)
        assert _copies(m) == (converted + 1, written), name


def test_int_inputs_are_written_once(bert):
    ids = np.load(BERT / "seq7" / "input_ids.npy")
    mask = np.load(BERT / "seq7" / "attention_mask.npy")
    converted, written = _copies(bert)
    bert(ids, mask)
    in_place = set(bert.inputs_in_place)
    assert _copies(bert) == (converted, written + 2 - len(in_place))


def test_a_call_keeps_its_inputs_alive_until_its_work_completes(affine):
    m, w, b = affine
    x = np.random.default_rng(3).standard_normal((64, 8)).astype(np.float32)
    want = x @ w + b
    # The native call holds the array (through its DLPack capsule) while it is pending,
    # though the caller dropped every reference to it.
    arr = x.copy()
    ref = weakref.ref(arr)
    call = m._native.submit([arr])
    del arr
    gc.collect()
    assert ref() is not None, "freed while the call may still read it"
    np.testing.assert_allclose(np.from_dlpack(call.wait()[0]), want, rtol=1e-5, atol=1e-5)
    del call
    _released(m, ref)
    # A dropped call (its outputs never taken) and a dropped future release it once the
    # work has completed, and the next calls are right.
    for drop in ("call", "future"):
        arr = x.copy()
        ref = weakref.ref(arr)
        pending = m._native.submit([arr]) if drop == "call" else m.submit(arr)
        del arr, pending
        _released(m, ref)
        np.testing.assert_allclose(m(x), want, rtol=1e-5, atol=1e-5)


def test_failed_calls_leave_the_callers_inputs_intact(bert):
    ids = np.load(BERT / "seq7" / "input_ids.npy")
    mask = np.load(BERT / "seq7" / "attention_mask.npy")
    ids_copy, mask_copy = ids.copy(), mask.copy()
    with pytest.raises(rafter.InputError):
        bert(ids, mask.astype(np.int32))  # the second input fails after the first is read
    with pytest.raises(rafter.InputError):
        bert(np.ones((1, 17), np.int64), np.ones((1, 17), np.int64))  # above seq <= 16
    with pytest.raises(rafter.InputError):
        bert.submit(ids, np.ones((1, 5), np.int64))  # seq 7 against seq 5
    gc.collect()
    np.testing.assert_array_equal(ids, ids_copy)
    np.testing.assert_array_equal(mask, mask_copy)
    want = np.load(BERT / "seq7" / "last_hidden_state.npy")
    np.testing.assert_allclose(bert(ids, mask), want, atol=1e-4)


def test_read_only_and_big_endian_arrays_are_accepted(affine):
    m, w, b = affine
    x = np.random.default_rng(4).standard_normal((3, 8)).astype(np.float32)
    ro = x.copy()
    ro.flags.writeable = False
    np.testing.assert_allclose(m(ro), x @ w + b, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(m(x.astype(">f4")), x @ w + b, rtol=1e-5, atol=1e-5)


def _released(m, ref, timeout=30.0):
    """Waits until the array behind `ref` is freed (the runtime let go of it). A runtime
    thread drops its last reference without the GIL, so PyO3 defers the decref until a
    thread next enters the native module: the loop enters it."""
    deadline = time.monotonic() + timeout
    while ref() is not None:
        assert time.monotonic() < deadline, "the input was never released"
        m._native.input_copies()
        gc.collect()
        time.sleep(0.01)
