"""Qwen2.5-VL: the Qwen2 text decoder with M-RoPE, and a vision tower with window attention
(engine/models/vision/qwen2_5_vision.py)."""

from __future__ import annotations

from typing import Any

from engine.models.qwen2 import Qwen2ForCausalLM
from engine.models.vision.language import VisionLanguage
from engine.models.vision.qwen2_5_vision import Qwen2_5VisionTower


class Qwen2_5_VLForConditionalGeneration(VisionLanguage, Qwen2ForCausalLM):
    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.visual = Qwen2_5VisionTower(cfg.vision_config)
