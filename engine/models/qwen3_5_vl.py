"""Qwen3.5 with images (Qwen3_5ForConditionalGeneration, the layout of the hub's Qwen3.5 checkpoints): the hybrid
text decoder of engine/models/qwen3_5.py with interleaved M-RoPE, and Qwen3-VL's vision tower without DeepStack
(Qwen3.5's vision config has no deepstack_visual_indexes): engine/models/vision/qwen3_vision.py."""

from __future__ import annotations

from typing import Any

from engine.models.qwen3_5 import Qwen3_5ForCausalLM
from engine.models.vision.language import VisionLanguage
from engine.models.vision.qwen3_vision import Qwen3VisionTower


class Qwen3_5ForConditionalGeneration(VisionLanguage, Qwen3_5ForCausalLM):
    mrope_interleaved = True

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg)
        self.visual = Qwen3VisionTower(cfg.vision_config)

    def batch_invariant_blockers(self) -> list[str]:
        return [*Qwen3_5ForCausalLM.batch_invariant_blockers(self), "a vision tower (vision_config)"]
