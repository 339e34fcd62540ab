"""What a vision-language family adds to its text decoder (`*ForConditionalGeneration` checkpoints): the vision
tower under `visual.`, the text decoder's config as the model's own, M-RoPE ([3, T] positions), the image rows of
a step replaced by the tower's embeddings, and (Qwen3-VL's DeepStack) features added to the early layers' output
at those rows.

A family mixes this in front of its text class (class X(VisionLanguage, Qwen2ForCausalLM))."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from engine.layers.attention import AttentionBackend, AttentionMetadata
from engine.layers.mrope import MRotaryEmbedding
from engine.layers.rope import RotaryEmbedding
from engine.multimodal.image_input import ImageInput
from engine.multimodal.request_images import VisionOutput


@dataclass
class VisionRows:
    """A step's image rows: the rows of the flat batch that hold placeholder tokens, and what they take."""

    rows: torch.Tensor  # [R] rows of the flat batch
    embeds: torch.Tensor  # [R, hidden] the tower's embeddings, in place of the placeholder's
    deepstack: list[torch.Tensor] = field(default_factory=list)  # per early layer, [R, hidden] added after it


class VisionLanguage(nn.Module):
    # Set by the family: the tower class, built from the config's vision_config.
    visual: nn.Module
    # Checkpoint prefixes -> this model's: transformers 5 writes Qwen3-VL as model.language_model.* and
    # model.visual.*; Qwen2.5-VL checkpoints (and the hub's) hold model.* and visual.*.
    PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."))

    def __init__(self, cfg: Any) -> None:
        self.vl_config = cfg
        super().__init__(cfg.get_text_config())  # type: ignore[call-arg]  # the text family's __init__
        self.image_token_id = int(cfg.image_token_id)
        # transformers ties by the outer config (its own BC moves a pre-v5 text_config's flag there).
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        for old, new in cls.PREFIXES:
            if name.startswith(old):
                return new + name[len(old):]
        return name

    multimodal = True
    # Qwen3-VL's M-RoPE interleaves the axes' frequencies; Qwen2.5-VL's gives each a contiguous run.
    mrope_interleaved = False

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [MRotaryEmbedding(cfg, self.mrope_interleaved)]

    def position_limit(self) -> int | None:
        return None

    def batch_invariant_blockers(self) -> list[str]:
        return [*super().batch_invariant_blockers(), "a vision tower (vision_config)"]  # type: ignore[misc]

    @torch.inference_mode()
    def encode_image(self, image: ImageInput) -> VisionOutput:
        """The tower's output for one image, in the model dtype on its device."""
        out = self.visual(image.pixel_values, image.grid_thw)
        return VisionOutput(out[0], list(out[1:]))

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend, vision: VisionRows | None = None) -> torch.Tensor:
        """input_ids: [T]; positions: [3, T] (time, height, width). Returns the last layer's hidden states before
        the final norm: [T, hidden]."""
        h = self.model.embed_tokens(input_ids)  # [T, hidden]
        if vision is not None:
            h = h.index_copy(0, vision.rows, vision.embeds.to(h.dtype))
        rope = self.ropes[0]
        cos, sin = rope.cos_sin(positions, h.dtype)
        for i, (layer, (k_cache, v_cache)) in enumerate(zip(self.model.layers, kv_caches, strict=True)):
            h = layer(h, rope, cos, sin, k_cache, v_cache, meta, backend)
            if vision is not None and i < len(vision.deepstack):
                h = h.index_add(0, vision.rows, vision.deepstack[i].to(h.dtype))
        return h
