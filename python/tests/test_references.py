"""Outputs against independent references: ONNX Runtime on an ONNX model, PyTorch on a
torch.nn.Module (torchvision's ResNet-18, random weights) through both of torch's ONNX
exporters."""

import numpy as np

import rafter
from conftest import BERT, need


def test_bert_matches_onnxruntime(bert):
    ort = need("onnxruntime")
    sess = ort.InferenceSession(str(BERT / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(7)
    for batch, seq in [(1, 1), (2, 5), (4, 16)]:
        ids = rng.integers(0, 100, (batch, seq), dtype=np.int64)
        mask = (rng.random((batch, seq)) < 0.8).astype(np.int64)
        mask[:, 0] = 1
        (want,) = sess.run(None, {"input_ids": ids, "attention_mask": mask})
        got = bert(input_ids=ids, attention_mask=mask)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_resnet18_module_matches_pytorch(tmp_path):
    torch = need("torch")
    tv = need("torchvision")
    torch.manual_seed(0)
    net = tv.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    m = rafter.compile(net, (x,), input_names=["image"], output_names=["logits"])
    assert [p.name for p in m.inputs] == ["image"]
    with torch.no_grad():
        want = net(x)
    got = m(x)
    assert isinstance(got, torch.Tensor) and got.shape == (1, 1000)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 1e-4 * max(scale, 1.0)
    # numpy in, numpy out: the same numbers.
    np.testing.assert_allclose(m(x.numpy()), got.numpy(), rtol=0, atol=0)
    # A dynamic batch, bounded: a second image in the same call.
    mb = rafter.compile(net, (x,), input_names=["image"], output_names=["logits"],
                        dynamic_axes={"image": {0: "batch"}}, dims={"batch": "<=2"})
    assert mb.inputs[0].dims == ["batch", 3, 224, 224]
    x2 = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        want2 = net(x2)
    assert (mb(x2) - want2).abs().max().item() <= 1e-4 * max(want2.abs().max().item(), 1.0)
    # The module's training flag is restored after export.
    net.train()
    rafter.compile(net, (x,))
    assert net.training


def test_resnet18_through_torch_export_matches_pytorch():
    """exporter="dynamo": torch.export traces the module, onnxscript writes the ONNX."""
    torch = need("torch")
    tv = need("torchvision")
    need("onnxscript")
    torch.manual_seed(1)
    net = tv.models.resnet18(weights=None).eval()
    x = torch.randn(1, 3, 224, 224)
    m = rafter.compile(net, (x,), exporter="dynamo")
    with torch.no_grad():
        want = net(x)
    got = m(x)
    assert got.shape == (1, 1000)
    assert (got - want).abs().max().item() <= 1e-4 * max(want.abs().max().item(), 1.0)


def test_torch_export_errors():
    torch = need("torch")
    import pytest

    net = torch.nn.Linear(3, 2)
    with pytest.raises(rafter.CompileError, match="exporter = 'jit'"):
        rafter.compile(net, (torch.zeros(1, 3),), exporter="jit")
    with pytest.raises(rafter.CompileError, match="needs example_inputs"):
        rafter.compile(net)
