"""transformers as the reference: its single full forward's logits and scores, one model load per process."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM


@lru_cache(maxsize=8)
def hf_model(path: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_logits(path: str | Path, ids: list[int]) -> torch.Tensor:
    """transformers' single full forward: [L, V] float32 logits."""
    return hf_model(str(path))(torch.tensor([ids])).logits[0].float()


def hf_scores(path: str | Path, ids: list[int], start: int) -> list[float]:
    """log_softmax(logits)[p, ids[p+1]] for p = start .. L-2 (a fresh list each call)."""
    return list(_hf_scores(str(path), tuple(ids), start))


# Tests compare many answers with the scores of the same few prompts (32 requests over 4 prompts when a worker is
# killed): one forward per prompt, not one per answer. Scores are small (a float a row); logits are not kept.
@lru_cache(maxsize=256)
@torch.inference_mode()
def _hf_scores(path: str, ids: tuple[int, ...], start: int) -> tuple[float, ...]:
    lp = torch.log_softmax(hf_logits(path, list(ids)), dim=-1)
    pos = torch.arange(start, len(ids) - 1)
    return tuple(lp[pos, torch.tensor(ids[start + 1:])].tolist())
