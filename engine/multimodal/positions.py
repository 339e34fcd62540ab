"""M-RoPE positions of a prompt with images (transformers' get_rope_index for images) and of the tokens after it.

Text advances one position per token on all three axes. An image whose placeholder run starts where the next
text position is p takes (p + t, p + h, p + w) over its merged grid, and the text after it resumes at
p + max(h, w): so every token after the last image sits at its index plus a fixed shift (`delta`), which is
how generated tokens get their positions (transformers' rope_deltas)."""

from __future__ import annotations

import torch

from engine.multimodal.image_input import ImageInput
from engine.multimodal.placeholders import ImageSpan


def mrope_positions(num_tokens: int, images: list[ImageInput], spans: list[ImageSpan]) -> tuple[torch.Tensor, int]:
    """([3, num_tokens] positions of the prompt, the shift of every later token: position = index + delta)."""
    out = torch.empty(3, num_tokens, dtype=torch.long)
    delta, at = 0, 0
    for image, span in zip(images, spans, strict=True):
        out[:, at:span.start] = torch.arange(at, span.start) + delta
        p = span.start + delta
        t, h, w = image.llm_grid
        grid = torch.stack(torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"))
        out[:, span.start:span.end] = grid.reshape(3, -1) + p
        delta = p + max(h, w) - span.end
        at = span.end
    out[:, at:] = torch.arange(at, num_tokens) + delta
    return out, delta
