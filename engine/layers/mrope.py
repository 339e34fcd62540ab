"""Multimodal rotary positions (M-RoPE, Qwen2-VL's family): each token has three positions (time, height, width)
and each frequency of the head turns by one of them. Qwen2.5-VL gives each axis a contiguous run of frequencies
(`mrope_section`); Qwen3-VL interleaves them (T H W T H W ..., the rest T), whatever its config's
`mrope_interleaved` says, as transformers does. A text token has
the same position on all three axes, which is plain RoPE."""

from __future__ import annotations

from typing import Any

import torch

from engine.layers.rotary import FamilyRotaryEmbedding


class MRotaryEmbedding(FamilyRotaryEmbedding):
    def __init__(self, cfg: Any, interleaved: bool) -> None:
        super().__init__(cfg)
        self.section = [int(s) for s in self.params["mrope_section"]]
        self.interleaved = interleaved

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """positions: [3, T] (time, height, width) -> cos, sin: [T, D], as transformers recomposes them."""
        assert self.inv_freq is not None, "RotaryEmbedding.to(device) was not called"
        freqs = positions[..., None].float() * self.inv_freq  # [3, T, D/2]
        cos, sin = freqs.cos() * self.attention_scaling, freqs.sin() * self.attention_scaling
        cos, sin = self._recompose(cos), self._recompose(sin)
        return cos.to(dtype), sin.to(dtype)

    def _recompose(self, freq: torch.Tensor) -> torch.Tensor:
        """[3, T, D/2] -> [T, D]: each frequency from its axis, then duplicated for rotate-half."""
        if self.interleaved:
            out = freq[0].clone()
            for axis in (1, 2):
                idx = slice(axis, self.section[axis] * 3, 3)
                out[..., idx] = freq[axis, ..., idx]
        else:
            out = torch.cat([part[i % 3] for i, part in enumerate(freq.split(self.section, dim=-1))], dim=-1)
        return torch.cat((out, out), dim=-1)
