"""Tiny random `*ForSequenceClassification` checkpoints, built locally with transformers' own classes (no hub), and
transformers' own pooled scores for them: what the engine's classify answers are checked against."""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForSequenceClassification, LlamaConfig, Qwen2Config

from tests.helpers.tiny_deepseek_v3 import VARIANTS
from tests.helpers.tiny_deepseek_v3 import config as dsv3_config
from tests.helpers.tiny_families import _configs
from tests.helpers.tiny_models import VOCAB, _tokenizer

LABELS = {1: {0: "reward"}, 3: {0: "negative", 1: "neutral", 2: "positive"}}
_COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, max_position_embeddings=512, rms_norm_eps=1e-5, eos_token_id=0,
               bos_token_id=None, pad_token_id=1)


def _config(family: str) -> tuple[str, object]:
    """(the causal LM's class name, its config) of a family."""
    if family == "llama":
        return "LlamaForCausalLM", LlamaConfig(**_COMMON)
    if family == "qwen2":
        return "Qwen2ForCausalLM", Qwen2Config(**_COMMON, rope_parameters={"rope_type": "default",
                                                                             "rope_theta": 1000000.0})
    if family in VARIANTS:
        return "DeepseekV3ForCausalLM", dsv3_config(family)
    cls, cfg = _configs()[family]
    return cls.__name__, copy.deepcopy(cfg)


def build_classifier(folder: Path, family: str, num_labels: int, seed: int = 0) -> Path:
    """Writes a `<Family>ForSequenceClassification` checkpoint (num_labels, id2label) + tokenizer; returns folder."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder)
    causal, cfg = _config(family)
    name = "Gemma3TextForSequenceClassification" if causal == "Gemma3ForCausalLM" else \
        causal.replace("ForCausalLM", "ForSequenceClassification")
    labels = LABELS.get(num_labels, {i: f"LABEL_{i}" for i in range(num_labels)})
    cfg.num_labels = num_labels  # type: ignore[attr-defined]
    cfg.id2label = labels  # type: ignore[attr-defined]
    cfg.label2id = {v: k for k, v in labels.items()}  # type: ignore[attr-defined]
    torch.manual_seed(seed)
    model = getattr(transformers, name)(cfg)
    with torch.no_grad():  # random init is small: widen it so the scores are spread and tests sensitive
        for p in model.parameters():
            p.normal_(0, 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@cache
def _reference_model(path: str) -> torch.nn.Module:
    return AutoModelForSequenceClassification.from_pretrained(path, dtype=torch.float32).eval()


def reference_scores(path: Path | str, ids: list[int]) -> list[float]:
    """transformers' pooled raw scores for one unpadded prompt: [num_labels] float32."""
    with torch.no_grad():
        return _reference_model(str(path))(torch.tensor([ids])).logits[0].float().tolist()
