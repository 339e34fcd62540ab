"""Tiny random vision-language checkpoints (Qwen2.5-VL, Qwen3-VL, Qwen3-VL-MoE) built locally with transformers,
their image processor (PIL, no torchvision) and prompts with an image's placeholder run already expanded."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from transformers import (
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)
from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

from engine.multimodal.image_input import ImageInput
from tests.helpers.tiny_models import _tokenizer

# Where real checkpoints put the placeholder ids: the last rows of the vocabulary, after the tokenizer's base size
# (SmolLM2's 49,152 here, plus Qwen's four vision tokens: ids 49152-49155 of 49,156 rows; Qwen2.5-VL's image token is
# 151655 of 152,064). Large ids, so that a rule holding only for small ones (a table sized by the base vocabulary, an
# id through a 16-bit type, a reference marking a fixed id) shows; the tokenizer's added special tokens with the Qwen
# families' names (BPE never produces them from other text), below them Qwen's chat turn markers.
BASE_VOCAB = 49152
VOCAB = BASE_VOCAB + 4
VISION_START, VISION_END, IMAGE_TOKEN, VIDEO_TOKEN = range(BASE_VOCAB, VOCAB)
SPECIAL = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
IM_START = VOCAB - len(SPECIAL)
# Qwen's chat template for a message whose content is text (an image part is already text here: the ingress's mark).
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
_TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=3, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=1024, rms_norm_eps=1e-6, eos_token_id=0, pad_token_id=1,
             bos_token_id=None)
_IDS = dict(image_token_id=IMAGE_TOKEN, video_token_id=VIDEO_TOKEN, vision_start_token_id=VISION_START,
            vision_end_token_id=VISION_END)
PATCH = {"qwen2_5_vl": 14, "qwen3_vl": 16, "qwen3_vl_moe": 16}


def build_tiny_vlm(folder: Path, family: str, seed: int = 0, tie: bool = False, scale: float | None = 0.2) -> Path:
    """Writes config.json + model.safetensors + tokenizer into folder; returns folder. Qwen2.5-VL's window (56
    pixels: 2 x 2 merged tokens) is smaller than the test images, so window and full attention blocks differ.
    scale: every weight drawn from N(0, scale) (spread logits: every part moves the rows at 1e-4); None keeps
    transformers' own initialisation, as a new user's random checkpoint has it."""
    folder.mkdir(parents=True, exist_ok=True)
    _tokenizer(folder, SPECIAL, VOCAB)
    torch.manual_seed(seed)
    model: torch.nn.Module
    if family == "qwen2_5_vl":
        vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=14, spatial_merge_size=2,
                      temporal_patch_size=2, window_size=56, out_hidden_size=64, fullatt_block_indexes=[1])
        text = dict(_TEXT, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                            "mrope_section": [2, 3, 3]})
        cfg = Qwen2_5_VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie, **_IDS)
        model = Qwen2_5_VLForConditionalGeneration(cfg)
    elif family in ("qwen3_vl", "qwen3_vl_moe"):
        vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=16, spatial_merge_size=2,
                      temporal_patch_size=2, out_hidden_size=64, num_position_embeddings=16,
                      deepstack_visual_indexes=[0, 1])
        text = dict(_TEXT, head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                         "mrope_section": [2, 3, 3], "mrope_interleaved": True})
        if family == "qwen3_vl":
            cfg = Qwen3VLConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie, **_IDS)
            model = Qwen3VLForConditionalGeneration(cfg)
        else:  # layers 0 and 2 sparse (6 experts, top 2), layer 1 dense: both MLPs and the router are exercised
            text = dict(text, moe_intermediate_size=24, num_experts=6, num_experts_per_tok=2, decoder_sparse_step=1,
                        mlp_only_layers=[1])
            cfg = Qwen3VLMoeConfig(text_config=text, vision_config=vision, tie_word_embeddings=tie, **_IDS)
            model = Qwen3VLMoeForConditionalGeneration(cfg)
    else:
        raise ValueError(family)
    if scale is not None:
        with torch.no_grad():  # random init is small; wider weights spread the logits so tests are sensitive
            for p in model.parameters():
                p.normal_(0, scale)
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def processor(family: str) -> Qwen2VLImageProcessorPil:
    """The family's image processor (transformers' PIL one), with a pixel range for small test images."""
    patch = PATCH[family]
    unit = (patch * 2) ** 2
    return Qwen2VLImageProcessorPil(patch_size=patch, merge_size=2, temporal_patch_size=2, min_pixels=unit * 4,
                                    max_pixels=unit * 64)


def random_image(width: int, height: int, seed: int) -> Image.Image:
    rng = np.random.default_rng(seed)
    return Image.fromarray((rng.random((height, width, 3)) * 255).astype("uint8"))


def image_input(family: str, image: Image.Image) -> ImageInput:
    out = processor(family)(images=[image], return_tensors="pt")
    t, h, w = out["image_grid_thw"][0].tolist()
    return ImageInput.of(out["pixel_values"], (t, h, w))


def text_ids(n: int, seed: int) -> list[int]:
    """Random ids of ordinary tokens (no special one), from the whole base vocabulary."""
    rng = np.random.default_rng(seed)
    return rng.integers(2, IM_START, n).tolist()


def expand(ids: list[int], images: list[ImageInput], at: list[int]) -> list[int]:
    """ids with each image's vision_start, placeholder run and vision_end inserted before position at[i]."""
    out: list[int] = []
    prev = 0
    for image, pos in zip(images, at, strict=True):
        out += ids[prev:pos] + [VISION_START] + [IMAGE_TOKEN] * image.num_tokens + [VISION_END]
        prev = pos
    return out + ids[prev:]
