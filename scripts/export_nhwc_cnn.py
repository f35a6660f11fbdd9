"""Exports a small ResNet-style CNN that takes NHWC input (a permute first), as PyTorch users
write it, to ONNX: `python scripts/export_nhwc_cnn.py OUT_DIR`.

Two files: `nhwc_cnn_static.onnx` (input 1x224x224x3) and `nhwc_cnn_dynamic.onnx` (batch,
height and width dynamic), for `rafter plan --target vulkan` before/after comparisons of
GPU placement (issue 24). Weights are random (seeded); only the graph's structure matters.
torchvision is not needed: the blocks are written out here.
"""

import sys
from pathlib import Path

import torch
from torch import nn


class Block(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        y = torch.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class NhwcResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 32, 7, 2, 3, bias=False), nn.BatchNorm2d(32), nn.ReLU(),
                                  nn.MaxPool2d(3, 2, 1))
        self.layers = nn.Sequential(Block(32, 32, 1), Block(32, 64, 2), Block(64, 128, 2), Block(128, 256, 2))
        self.fc = nn.Linear(256, 1000)

    def forward(self, x):
        x = x.permute(0, 3, 1, 2)
        x = self.layers(self.stem(x))
        x = torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1)
        return self.fc(x)


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    model = NhwcResNet().eval()
    x = torch.randn(1, 224, 224, 3)
    torch.onnx.export(model, (x,), out / "nhwc_cnn_static.onnx", input_names=["image"],
                      output_names=["logits"], opset_version=17, dynamo=False)
    torch.onnx.export(model, (x,), out / "nhwc_cnn_dynamic.onnx", input_names=["image"],
                      output_names=["logits"], opset_version=17, dynamo=False,
                      dynamic_axes={"image": {0: "batch", 1: "height", 2: "width"}})


if __name__ == "__main__":
    main()
