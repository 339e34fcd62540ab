"""Tiny random Qwen3.5 checkpoints (dense and MoE), built with transformers' own config and model classes, with
tests/helpers/tiny_models.py's tokenizer. Layers linear, full, linear (both kinds, a linear one after the attention
one); grouped value heads (4 value heads over 2 key heads); partial rotary (a quarter of each attention head).
Weights N(0, 0.2) as tests/helpers/tiny_families.py's, which makes every part (conv, gates, decay, beta, the norms)
move the rows far past 1e-4 (tests/engine/test_models_qwen3_5.py turns each off and checks)."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig, Qwen3_5TextConfig

from tests.helpers.tiny_families import save_widened
from tests.helpers.tiny_models import VOCAB, _tokenizer

_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    max_position_embeddings=512, rms_norm_eps=1e-5, eos_token_id=0, bos_token_id=None, pad_token_id=1,
    num_hidden_layers=3, layer_types=["linear_attention", "full_attention", "linear_attention"],
    linear_conv_kernel_dim=4, linear_key_head_dim=16, linear_value_head_dim=8, linear_num_key_heads=2,
    linear_num_value_heads=4, tie_word_embeddings=False,
    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                     "mrope_section": [1, 1, 0], "mrope_interleaved": True})


def _configs() -> dict[str, tuple[type, Any]]:
    return {
        "qwen3_5": (Qwen3_5ForCausalLM, Qwen3_5TextConfig(**_COMMON, intermediate_size=128)),
        "qwen3_5-moe": (Qwen3_5MoeForCausalLM, Qwen3_5MoeTextConfig(
            **_COMMON, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
            shared_expert_intermediate_size=48)),
    }


QWEN3_5_FAMILIES = list(_configs())


def build_qwen3_5_vl(folder: Path, seed: int = 0) -> Path:
    """A Qwen3_5ForConditionalGeneration: the dense text config above under Qwen3-VL's tiny tower (no DeepStack),
    tests/helpers/tiny_vision.py's placeholder ids (after a real tokenizer's base size) and tokenizer."""
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    from tests.helpers.tiny_vision import _IDS, SPECIAL
    from tests.helpers.tiny_vision import VOCAB as VL_VOCAB

    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder, SPECIAL, VL_VOCAB)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                  temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16)
    text = dict(_COMMON, vocab_size=VL_VOCAB, intermediate_size=128, max_position_embeddings=1024,
                rope_parameters=dict(_COMMON["rope_parameters"], mrope_section=[1, 1, 0]))
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(Qwen3_5Config(text_config=text, vision_config=vision, **_IDS))
    return save_widened(model, folder)


def build_qwen3_5_classifier(folder: Path, num_labels: int, seed: int = 0) -> Path:
    """A Qwen3_5TextForSequenceClassification of the dense config above (a `score` head of num_labels)."""
    from transformers import Qwen3_5TextForSequenceClassification

    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder)
    cfg = Qwen3_5TextConfig(**_COMMON, intermediate_size=128, num_labels=num_labels)
    torch.manual_seed(seed)
    model = Qwen3_5TextForSequenceClassification(cfg)
    return save_widened(model, folder)


def build_qwen3_5(folder: Path, family: str, seed: int = 0) -> Path:
    """Writes config.json + model.safetensors + tokenizer into folder; returns folder."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder)
    cls, cfg = _configs()[family]
    torch.manual_seed(seed)
    model = cls(cfg)
    return save_widened(model, folder)


@cache
def qwen3_5_path(family: str) -> Path:
    """The family's tiny checkpoint, built on first use in this process."""
    root = Path(tempfile.mkdtemp(prefix=f"rayscore-{family}-"))
    atexit.register(shutil.rmtree, root, True)
    return build_qwen3_5(root / family, family, seed=50 + QWEN3_5_FAMILIES.index(family))
