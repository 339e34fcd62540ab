"""Model families by the `architectures` name of a Hugging Face config. Every family is a LlamaForCausalLM
(a subclass where the layout differs), so the runner has one model type to read: forward, compute_logits,
target_logits, dtype, hidden_size and the KV shape."""

from __future__ import annotations

from engine.models.llama import LlamaForCausalLM
from engine.models.qwen2 import Qwen2ForCausalLM

CausalLM = LlamaForCausalLM

MODEL_REGISTRY: dict[str, type[CausalLM]] = {
    "LlamaForCausalLM": LlamaForCausalLM,
    "Qwen2ForCausalLM": Qwen2ForCausalLM,
}


def model_class(architectures: list[str] | None) -> type[CausalLM]:
    for arch in architectures or []:
        if arch in MODEL_REGISTRY:
            return MODEL_REGISTRY[arch]
    raise ValueError(f"unsupported model architecture {architectures}; supported: {sorted(MODEL_REGISTRY)}")
