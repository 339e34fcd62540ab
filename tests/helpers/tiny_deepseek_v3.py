"""Tiny random DeepSeek-V3 checkpoints built with transformers' own DeepseekV3Config and model (no hub), and the
hub's FP8 layout of them (float8_e4m3fn weights with `weight_scale_inv` block scales, the quantization_config
transformers reads). Weights scaled so each part moves the rows well past 1e-4: MLA's low-rank projections and
norms, the decoupled rotary part (YaRN with mscale, interleaved or not), the sigmoid router with its
e_score_correction_bias and group limit, the routed scale and the shared expert."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file
from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

from tests.helpers.tiny_models import VOCAB, _tokenizer

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 128,
        "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}

# Layer 0 dense (first_k_dense_replace 1), layers 1-2 MoE: 8 routed experts in 2 groups, the top group only
# (topk_group 1), 2 experts per token, one shared expert.
_COMMON: dict[str, Any] = dict(
    vocab_size=VOCAB, hidden_size=64, intermediate_size=96, moe_intermediate_size=32, num_hidden_layers=3,
    num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8,
    v_head_dim=12, n_routed_experts=8, n_shared_experts=1, num_experts_per_tok=2, n_group=2, topk_group=1,
    first_k_dense_replace=1, routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=512,
    rms_norm_eps=1e-5, num_mtp_layers=0, tie_word_embeddings=False, eos_token_id=0, bos_token_id=None,
    pad_token_id=1)

VARIANTS: dict[str, dict[str, Any]] = {
    # q through its own low rank (q_a_proj, q_a_layernorm, q_b_proj), interleaved rotary pairs, YaRN.
    "dsv3": dict(q_lora_rank=24, rope_interleave=True, rope_parameters=YARN),
    # q_proj straight from the hidden state, rotate-half rotary, plain RoPE, raw top-k weights.
    "dsv3-plain-q": dict(q_lora_rank=None, rope_interleave=False, norm_topk_prob=False,
                         rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
}


def config(variant: str) -> DeepseekV3Config:
    return DeepseekV3Config(**{**_COMMON, **VARIANTS[variant]})


def build_deepseek_v3(folder: Path, variant: str = "dsv3", seed: int = 0) -> Path:
    """Writes config.json + model.safetensors + tokenizer into folder; returns folder."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder)
    torch.manual_seed(seed)
    model = DeepseekV3ForCausalLM(config(variant))
    with torch.no_grad():
        for name, p in model.named_parameters():
            # The router's logits pass a sigmoid: spread them so the top-k and the group limit are decided by
            # margins well above float32 noise.
            p.normal_(0, 1.0 if name.endswith("mlp.gate.weight") else 0.2)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # moves the choice of experts, not their weights
                b.copy_(torch.randn(b.shape) * 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@cache
def dsv3_path(variant: str) -> Path:
    """The variant's tiny checkpoint, built on first use in this process."""
    root = Path(tempfile.mkdtemp(prefix=f"rayscore-{variant}-"))
    atexit.register(shutil.rmtree, root, True)
    return build_deepseek_v3(root / variant, variant, seed=50 + list(VARIANTS).index(variant))


# --- the hub's FP8 layout ------------------------------------------------------------------------------------
FP8_MAX = torch.finfo(torch.float8_e4m3fn).max


def quantize_fp8_blocks(w: torch.Tensor, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """w [out, in] -> (float8_e4m3fn weight [out, in], weight_scale_inv [ceil(out/block), ceil(in/block)] float32)
    such that w ~= weight * scale_inv per block (DeepSeek's act_quant/weight_dequant convention: the stored scale is
    the multiplier that dequantizes). Edge blocks are partial, as the hub's files have them."""
    out, inp = w.shape
    rows, cols = -(-out // block), -(-inp // block)
    q = torch.empty(out, inp, dtype=torch.float8_e4m3fn)
    scale = torch.empty(rows, cols, dtype=torch.float32)
    for r in range(rows):
        for c in range(cols):
            tile = w[r * block:(r + 1) * block, c * block:(c + 1) * block].float()
            s = tile.abs().max().clamp(min=1e-12) / FP8_MAX
            scale[r, c] = s
            q[r * block:(r + 1) * block, c * block:(c + 1) * block] = (tile / s).to(torch.float8_e4m3fn)
    return q, scale


def quantize_checkpoint(src: Path, dst: Path, block: int) -> Path:
    """A copy of src in the hub's FP8 layout: every 2-D projection weight of the decoder layers (not the norms, the
    router, the embeddings nor the LM head, as DeepSeek-V3's files) as float8_e4m3fn with its weight_scale_inv, and
    config.json's quantization_config {quant_method fp8, fmt e4m3, activation_scheme dynamic, weight_block_size}."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            (dst / f.name).write_bytes(f.read_bytes())
    state = load_file(str(src / "model.safetensors"))
    out: dict[str, torch.Tensor] = {}
    for name, t in state.items():
        if t.dim() == 2 and ".layers." in name and not name.endswith("mlp.gate.weight"):
            out[name], out[name.removesuffix("weight") + "weight_scale_inv"] = quantize_fp8_blocks(t, block)
        else:
            out[name] = t
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                  "weight_block_size": [block, block]}
    (dst / "config.json").write_text(json.dumps(cfg, indent=2))
    return dst
