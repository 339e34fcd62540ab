"""Qwen3-VL-MoE: Qwen3-VL (interleaved M-RoPE, the vision tower with DeepStack) over a Qwen3-MoE text decoder,
sparse where Qwen3-MoE's rule puts it (decoder_sparse_step, mlp_only_layers), whose experts the checkpoint holds
stacked (engine/layers/moe.py StackedExperts) and whose router always renormalises its top-k weights."""

from __future__ import annotations

from typing import Any

import torch

from engine.layers.moe import SparseMoeBlock
from engine.models.llama import DecoderLayer
from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.qwen3_moe import Qwen3MoeForCausalLM, is_sparse
from engine.models.vision.language import VisionLanguage
from engine.models.vision.qwen3_vision import Qwen3VisionTower

_STACKS = (".mlp.experts.gate_up_proj", ".mlp.experts.down_proj")


class Qwen3VLMoeForConditionalGeneration(VisionLanguage, Qwen3MoeForCausalLM):
    mrope_interleaved = True

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.visual = Qwen3VisionTower(cfg.vision_config)

    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        layer = Qwen3ForCausalLM.make_layer(self, cfg, i)
        if is_sparse(cfg, i):
            layer.mlp = SparseMoeBlock(cfg, stacked=True)
        return layer

    @classmethod
    def checkpoint_tensor(cls, name: str, tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The hub's Qwen3-VL-MoE checkpoints store each stack transposed ([E, hidden, 2 x width] and
        [E, width, hidden]); transformers 5 writes ours. Its rule, followed here: a stack of the parameter's shape
        is taken as it is, any other transposed."""
        if name.endswith(_STACKS) and tensor.shape != shape:
            return tensor.transpose(1, 2).contiguous()
        return tensor
