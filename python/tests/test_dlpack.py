"""DLPack: torch tensors in and out without copies, numpy out without a copy, and the
lent memory outliving the rafter tensor."""

import gc

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
