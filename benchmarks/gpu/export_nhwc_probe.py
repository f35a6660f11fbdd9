#!/usr/bin/env python3
"""Export a small NHWC-input CNN the way users export torchvision models behind a permute,
to probe GPU placement (issue 24 item 3): `rafter plan --target vulkan` on it shows what
keeps a real export's kernels on the CPU.

    python benchmarks/gpu/export_nhwc_probe.py OUT.onnx
    rafter plan OUT.onnx --target vulkan --dim 'n<=4' --dim 'h<=256' --dim 'w<=256'

The model (random weights, seed 0): x [n, h, w, 3] -> permute to NCHW, / 255, pad H and W
to even sizes with pads computed from the input's shape (`x.shape[2] % 2`: the shape
arithmetic of real exports), a ResNet stem (7x7/2 conv, relu, 3x3/2 max pool), two
residual blocks (the second strided, with a 1x1 downsample), global mean, linear, softmax.
Dynamic n, h, w; opset 17; the TorchScript exporter (dynamo=False), as
scripts/export_models.py. Needs torch (no torchvision).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, stride):
        super().__init__()
        cin = c if stride == 1 else c // 2
        self.c1, self.b1 = nn.Conv2d(cin, c, 3, stride, 1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, 1, 1), nn.BatchNorm2d(c)
        self.down = None if stride == 1 else nn.Conv2d(cin, c, 1, stride)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        y = self.b2(self.c2(y))
        return F.relu(y + (x if self.down is None else self.down(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem, self.pool = nn.Conv2d(3, 16, 7, 2, 3), nn.MaxPool2d(3, 2, 1)
        self.l1, self.l2, self.fc = Block(16, 1), Block(32, 2), nn.Linear(32, 10)

    def forward(self, x):
        x = x.permute(0, 3, 1, 2) / 255.0
        x = F.pad(x, (0, x.shape[3] % 2, 0, x.shape[2] % 2))
        x = self.pool(F.relu(self.stem(x)))
        x = self.l2(self.l1(x)).mean((2, 3))
        return self.fc(x.reshape(x.shape[0], -1)).softmax(-1)


def main():
    torch.manual_seed(0)
    model = Net().eval()
    x = torch.rand(1, 64, 64, 3) * 255
    torch.onnx.export(
        model, (x,), sys.argv[1], input_names=["image"], output_names=["probs"],
        dynamic_axes={"image": {0: "n", 1: "h", 2: "w"}}, opset_version=17, dynamo=False,
    )


if __name__ == "__main__":
    main()
