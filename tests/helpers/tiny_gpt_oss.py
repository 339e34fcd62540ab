"""A tiny random gpt-oss checkpoint built locally with transformers' own GptOssConfig / GptOssForCausalLM (no hub),
with tests/helpers/tiny_models.py's tokenizer: three layers (sliding, full, sliding) of window 7 (not a multiple of
the tests' block size of 4, shorter than the prompts), YaRN rotary with an original length of 16 (so positions past
it are interpolated), a SwiGLU limit that the gate and up values cross, sinks and router biases wide enough to move
every row well past 1e-4.

Also the hub's MXFP4 layout of the experts (quantization_config quant_method "mxfp4"), written from the format's
definition (OCP Microscaling: blocks of 32 FP4 e2m1 values sharing one E8M0 power-of-two scale): write_mxfp4 turns a
checkpoint's float experts into `*_blocks` / `*_scales` tensors, and returns the dequantized values it encoded."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import GptOssConfig, GptOssForCausalLM, GptOssForSequenceClassification

from tests.helpers.tiny_families import WINDOW  # the families' window of 7: check_prefix_cache reads it
from tests.helpers.tiny_models import VOCAB, _tokenizer

YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "beta_fast": 32.0, "beta_slow": 1.0,
        "truncate": False, "original_max_position_embeddings": 16}
SWIGLU_LIMIT = 0.3


def config() -> GptOssConfig:
    return GptOssConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=32, num_attention_heads=4,
                        num_key_value_heads=2, head_dim=24, num_hidden_layers=3, num_local_experts=4,
                        num_experts_per_tok=2, sliding_window=WINDOW, max_position_embeddings=64, rms_norm_eps=1e-5,
                        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                        rope_parameters=dict(YARN), swiglu_limit=SWIGLU_LIMIT, tie_word_embeddings=False,
                        eos_token_id=0, bos_token_id=None, pad_token_id=1)


def build_gpt_oss(folder: Path, seed: int = 0, num_labels: int | None = None) -> Path:
    """Writes config.json + model.safetensors (float32) + tokenizer into folder; returns folder. num_labels: a
    GptOssForSequenceClassification of that many labels instead of the causal LM."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder)
    torch.manual_seed(seed)
    cfg = config()
    if num_labels is not None:
        cfg.num_labels = num_labels
    model = GptOssForCausalLM(cfg) if num_labels is None else GptOssForSequenceClassification(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            # Sinks and router biases wider than the rest: each is a handful of values that must move the rows.
            p.normal_(0, 1.0 if name.endswith(("sinks", "router.bias")) else 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


@cache
def gpt_oss_path() -> Path:
    """The tiny checkpoint, built on first use in this process."""
    root = Path(tempfile.mkdtemp(prefix="rayscore-gpt-oss-"))
    atexit.register(shutil.rmtree, root, True)
    return build_gpt_oss(root / "gpt-oss")


# FP4 e2m1 by code (OCP Microscaling): code & 8 is the sign; magnitudes 0, 0.5, 1, 1.5, 2, 3, 4, 6.
FP4_MAGNITUDES = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
FP4_EMAX = 2  # the largest e2m1 magnitude is 1.5 * 2 ** 2


def quantize_mxfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """w [E, rows, cols] (cols a multiple of 32) -> (blocks [E, rows, cols / 32, 16] uint8, scales [E, rows,
    cols / 32] uint8, the dequantized [E, rows, cols] it encodes). Per block of 32: the shared exponent is
    floor(log2(max |w|)) - FP4_EMAX (the spec's choice), each value rounded to the nearest FP4 magnitude of
    w / 2 ** exponent (clamped to 6), two codes a byte, the low nibble first."""
    e, rows, cols = w.shape
    blocks = w.float().reshape(e, rows, cols // 32, 32)
    amax = blocks.abs().amax(-1, keepdim=True).clamp_min(2.0 ** -100)
    exp = torch.floor(torch.log2(amax)) - FP4_EMAX  # [E, rows, G, 1]
    scaled = blocks / torch.exp2(exp)
    mag = (scaled.abs()[..., None] - FP4_MAGNITUDES).abs().argmin(-1)  # nearest magnitude's code, 0..7
    codes = (mag + 8 * (scaled < 0)).to(torch.uint8)  # [E, rows, G, 32]
    packed = codes[..., 0::2] | (codes[..., 1::2] << 4)  # [E, rows, G, 16]
    values = FP4_MAGNITUDES[mag] * torch.where(scaled < 0, -1.0, 1.0) * torch.exp2(exp)
    return packed, (exp[..., 0] + 127).to(torch.uint8), values.reshape(e, rows, cols)


def write_mxfp4(src: Path, dst: Path) -> dict[str, torch.Tensor]:
    """A copy of the float checkpoint `src` in the hub's MXFP4 layout: each layer's experts.gate_up_proj and
    experts.down_proj ([E, in, out], as transformers holds them) stored as `_blocks` / `_scales` of the transposed
    [E, out, in] weight, biases and every other tensor as they are; config.json gains quantization_config. Returns
    the float [E, in, out] weights the quantized checkpoint encodes, by their float names."""
    shutil.copytree(src, dst)
    state = load_file(str(dst / "model.safetensors"))
    encoded: dict[str, torch.Tensor] = {}
    for name in [n for n in state if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        blocks, scales, values = quantize_mxfp4(state.pop(name).transpose(1, 2))
        state[f"{name}_blocks"], state[f"{name}_scales"] = blocks, scales
        encoded[name] = values.transpose(1, 2).contiguous()
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((dst / "config.json").read_text())
    cfg["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": [
        "model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]}
    (dst / "config.json").write_text(json.dumps(cfg))
    return encoded
