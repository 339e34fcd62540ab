"""Model families by the `architectures` name of a Hugging Face config."""

from __future__ import annotations

from torch import nn

from engine.models.llama import LlamaForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM

MODEL_REGISTRY: dict[str, type[nn.Module]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
}


def model_class(architectures: list[str] | None) -> type[nn.Module]:
    for arch in architectures or []:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(f"unsupported model architecture {architectures}; supported: {sorted(MODEL_REGISTRY)}")
