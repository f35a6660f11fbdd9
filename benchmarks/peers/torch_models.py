"""The benchmark models as PyTorch modules, built exactly as
scripts/export_models.py builds them (same constructors, configs and seed), so
their weights are the ones in .cache/models/<name>.onnx; run.py checks every
output against ONNX Runtime's saved outputs, which confirms it.

Kept separate from export_models.py (rather than importing it) so that a torch
runner's peak RSS does not include onnx and onnxruntime."""
from __future__ import annotations

import torch

SEED = 0  # export_models.SEED


def _image(ctor_name: str):
    def build():
        import torchvision

        torch.manual_seed(SEED)
        return getattr(torchvision.models, ctor_name)(weights=None).eval()

    return build


class BertLastHidden(torch.nn.Module):
    """BertModel returning only last_hidden_state (no pooler), as exported."""

    def __init__(self, config) -> None:
        super().__init__()
        from transformers import BertModel

        self.bert = BertModel(config, add_pooling_layer=False)

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                        token_type_ids=token_type_ids, return_dict=True)
        return out.last_hidden_state


def _bert(**overrides):
    def build():
        from transformers import BertConfig

        cfg = BertConfig(**overrides)
        # as exported: plain MatMul/Softmax attention (the classic BERT graph)
        cfg._attn_implementation = "eager"
        torch.manual_seed(SEED)
        return BertLastHidden(cfg).eval()

    return build


BUILDERS = {
    "resnet50": _image("resnet50"),
    "mobilenet_v2": _image("mobilenet_v2"),
    "bert_base": _bert(),
    "minilm_l6": _bert(hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                       intermediate_size=1536),
}


def build(model: str) -> torch.nn.Module:
    return BUILDERS[model]()
