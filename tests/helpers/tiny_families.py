"""Tiny random checkpoints of the families beyond Llama/Qwen2, built locally with transformers' own config and
model classes (no hub), with tests/helpers/tiny_models.py's tokenizer. Windows of 7 positions (not a multiple of
the tests' block size of 4), explicit head_dim unlike hidden / heads, soft-caps small enough to bend the values."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    MistralConfig,
    MistralForCausalLM,
    Phi3Config,
    Phi3ForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
    Qwen3MoeConfig,
    Qwen3MoeForCausalLM,
)

from tests.helpers.tiny_models import VOCAB, _tokenizer

WINDOW = 7
# Phi-3's LongRoPE: served up to this many positions (engine/models/phi3.py).
PHI3_ORIGINAL_MAX = 96

_COMMON: dict[str, Any] = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5,
                               eos_token_id=0, bos_token_id=None, pad_token_id=1)


def _configs() -> dict[str, tuple[type, Any]]:
    moe = dict(_COMMON, head_dim=24, num_hidden_layers=3, num_experts=4, num_experts_per_tok=2,
               moe_intermediate_size=32, tie_word_embeddings=False)
    return {
        # Qwen2 with its (rarely used) sliding layers: layer 1 of 2, by max_window_layers as Qwen3.
        "qwen2-window": (Qwen2ForCausalLM, Qwen2Config(**_COMMON, num_hidden_layers=2, use_sliding_window=True,
                                                        sliding_window=WINDOW, max_window_layers=1)),
        # Layer 0 full, layer 1 sliding (Qwen3's max_window_layers rule).
        "qwen3": (Qwen3ForCausalLM, Qwen3Config(**_COMMON, head_dim=32, num_hidden_layers=2, use_sliding_window=True,
                                                 sliding_window=WINDOW, max_window_layers=1,
                                                 tie_word_embeddings=True)),
        "qwen3-full": (Qwen3ForCausalLM, Qwen3Config(**_COMMON, head_dim=32, num_hidden_layers=2,
                                                      tie_word_embeddings=False)),
        # Layers 0 and 2 sparse, layer 1 dense (mlp_only_layers); normalized top-k.
        "qwen3-moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**moe, decoder_sparse_step=1, mlp_only_layers=[1],
                                                           norm_topk_prob=True)),
        # Layer 1 sparse only (decoder_sparse_step 2), raw top-k weights, every layer windowed.
        "qwen3-moe-window": (Qwen3MoeForCausalLM, Qwen3MoeConfig(**moe, decoder_sparse_step=2, norm_topk_prob=False,
                                                                  use_sliding_window=True, sliding_window=WINDOW)),
        "mistral": (MistralForCausalLM, MistralConfig(**_COMMON, head_dim=32, num_hidden_layers=2,
                                                       sliding_window=WINDOW, tie_word_embeddings=False)),
        "gemma2": (Gemma2ForCausalLM, Gemma2Config(**_COMMON, head_dim=32, num_hidden_layers=3,
                                                    query_pre_attn_scalar=24, sliding_window=WINDOW,
                                                    attn_logit_softcapping=2.0, final_logit_softcapping=4.0)),
        "gemma3": (Gemma3ForCausalLM, Gemma3TextConfig(
            **_COMMON, head_dim=32, num_hidden_layers=3, query_pre_attn_scalar=24, sliding_window=WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"], final_logit_softcapping=6.0,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 1000000.0}})),
        # head_dim 16, partial_rotary_factor 0.5: 8 rotary dims, so 4 LongRoPE factors.
        "phi3": (Phi3ForCausalLM, Phi3Config(
            **_COMMON, num_hidden_layers=2, sliding_window=WINDOW, original_max_position_embeddings=PHI3_ORIGINAL_MAX,
            tie_word_embeddings=False,
            rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                             "short_factor": [2.0, 4.0, 8.0, 16.0],
                             "long_factor": [1.1, 2.0, 4.0, 8.0]})),
    }


FAMILIES = list(_configs())


def build_family(folder: Path, family: str, seed: int = 0) -> Path:
    """Writes config.json + model.safetensors + tokenizer into folder; returns folder."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder)
    cls, cfg = _configs()[family]
    torch.manual_seed(seed)
    return save_widened(cls(cfg), folder)


def save_widened(model: Any, folder: Path, std: float = 0.2) -> Path:
    """Every parameter redrawn from N(0, std), then the model saved into folder: random init is small, and wider
    weights spread the logits, so every part of a family moves the rows far past the tests' 1e-4."""
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, std)
    model.save_pretrained(folder, safe_serialization=True)
    return folder
