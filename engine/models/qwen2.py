"""Qwen2: the Llama layout with a bias on the q/k/v projections (and none on o_proj)."""

from __future__ import annotations

from typing import Any

from engine.models.llama import LlamaForCausalLM


class Qwen2ForCausalLM(LlamaForCausalLM):
    @staticmethod
    def attention_biases(cfg: Any) -> tuple[bool, bool]:
        return True, False
