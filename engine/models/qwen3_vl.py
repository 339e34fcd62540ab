"""Qwen3-VL (dense): the Qwen3 text decoder with interleaved M-RoPE, and a vision tower whose DeepStack features
are added to the first decoder layers' output at the image rows (engine/models/vision/qwen3_vision.py)."""

from __future__ import annotations

from typing import Any

from engine.models.qwen3 import Qwen3ForCausalLM
from engine.models.vision.language import VisionLanguage
from engine.models.vision.qwen3_vision import Qwen3VisionTower


class Qwen3VLForConditionalGeneration(VisionLanguage, Qwen3ForCausalLM):
    mrope_interleaved = True

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.visual = Qwen3VisionTower(cfg.vision_config)
