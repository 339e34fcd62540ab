"""Read a PEFT LoRA adapter folder (adapter_config.json + adapter_model.safetensors) and check it against the served
model and the limits, each refusal naming what it refuses: a module the engine cannot adapt (embeddings, the LM
head, anything not a served linear), a rank over max_lora_rank, a PEFT feature the engine does not compute."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

# PEFT names a weight `base_model.model.<the model's own name>.lora_A.weight` ([r, in]) / `lora_B.weight` ([out, r]).
_NAME = re.compile(r"^base_model\.model\.(?:model\.)?layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.lora_([AB])\.weight$")
# Modules PEFT may adapt that the engine refuses by name: they are not (fused) linears of a decoder layer.
_EMBEDDINGS = ("embed_tokens", "lm_head", "score", "wte", "word_embeddings")


class LoraError(ValueError):
    """An adapter the engine refuses: the caller's to fix (a 400), its message naming the module or limit."""


@dataclass
class LoraAdapter:
    name: str
    path: str
    rank: int
    scaling: float
    # (layer, module name as PEFT writes it: q_proj, ...) -> (A [r, in], B [out, r])
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]]


def read_adapter(name: str, path: str | Path, max_rank: int, dtype: torch.dtype) -> LoraAdapter:
    folder = Path(path)
    config_file = folder / "adapter_config.json"
    if not config_file.is_file():
        raise LoraError(f"The adapter path {str(path)!r} is not a PEFT adapter folder: no adapter_config.json.")
    cfg = json.loads(config_file.read_text())
    if cfg.get("peft_type", "LORA") != "LORA":
        raise LoraError(f"The adapter {name!r} is a {cfg.get('peft_type')} adapter: only LORA is served.")
    rank = int(cfg.get("r", 0))
    if rank > max_rank:
        raise LoraError(f"The adapter {name!r} has rank {rank}, above the server's max_lora_rank {max_rank} "
                        "(config field max_lora_rank).")
    for module in _as_list(cfg.get("target_modules")) + _as_list(cfg.get("modules_to_save")):
        if module in _EMBEDDINGS:
            raise LoraError(f"The adapter {name!r} adapts the module {module!r}: embedding and LM-head adapters "
                            "are not served (q/k/v/o and gate/up/down projections are).")
    if cfg.get("modules_to_save"):
        raise LoraError(f"The adapter {name!r} saves whole modules {cfg['modules_to_save']} (modules_to_save): not "
                        "served.")
    for flag, what in (("use_dora", "DoRA"), ("lora_bias", "LoRA biases")):
        if cfg.get(flag):
            raise LoraError(f"The adapter {name!r} uses {what} ({flag}): not served.")
    if cfg.get("bias", "none") != "none":
        raise LoraError(f"The adapter {name!r} trains biases (bias={cfg['bias']!r}): not served.")
    if cfg.get("rank_pattern") or cfg.get("alpha_pattern"):
        raise LoraError(f"The adapter {name!r} sets per-module ranks (rank_pattern / alpha_pattern): not served.")
    alpha = float(cfg.get("lora_alpha", rank))
    scaling = alpha / math.sqrt(rank) if cfg.get("use_rslora") else alpha / rank
    files = [folder / "adapter_model.safetensors"]
    if not files[0].is_file():
        raise LoraError(f"The adapter {name!r} has no adapter_model.safetensors in {str(path)!r}.")
    pieces: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in load_file(str(files[0])).items():
        match = _NAME.match(key)
        if match is None:
            module = next((m for m in _EMBEDDINGS if f".{m}." in key), key)
            raise LoraError(f"The adapter {name!r} adapts the module {module!r}: only q/k/v/o and gate/up/down "
                            "projections of the decoder layers are served.")
        layer, _, module, ab = match.groups()
        pieces.setdefault((int(layer), module), {})[ab] = tensor.to(dtype)
    weights = {}
    for key, ab in pieces.items():
        if set(ab) != {"A", "B"}:
            raise LoraError(f"The adapter {name!r} has lora_A without lora_B (or the reverse) for layer {key[0]} "
                            f"{key[1]}.")
        weights[key] = (ab["A"], ab["B"])
    return LoraAdapter(name, str(path), rank, scaling, weights)


def _as_list(value: object) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):  # PEFT allows a regex string; the names it matches are checked per weight
        return [value]
    return [str(v) for v in value]  # type: ignore[attr-defined]
