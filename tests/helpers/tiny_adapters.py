"""Tiny random PEFT LoRA adapters of a local base checkpoint, built with PEFT itself (B randomized: PEFT starts it at
zero, which would make any adapter equal to the base), and PEFT's own forward as the reference."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM

ALL_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build_adapter(folder: Path, base: Path, rank: int, seed: int, targets: list[str] | None = None,
                  alpha: int | None = None, rslora: bool = False) -> Path:
    """Writes adapter_config.json + adapter_model.safetensors into folder; returns folder."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=alpha or 2 * rank, target_modules=targets or ALL_TARGETS, lora_dropout=0.0,
                     use_rslora=rslora)
    peft = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.1)
    peft.save_pretrained(str(folder))
    return folder


@cache
def _peft(base: str, adapter: str) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    return PeftModel.from_pretrained(model, adapter).eval()


@torch.inference_mode()
def peft_scores(base: Path, adapter: Path, ids: list[int], start: int) -> list[float]:
    """PEFT's log_softmax(logits)[p, ids[p+1]] for p = start .. L-2, with the adapter applied."""
    logits = _peft(str(base), str(adapter))(input_ids=torch.tensor([ids])).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(start, len(ids) - 1), torch.tensor(ids[start + 1:])].tolist()
