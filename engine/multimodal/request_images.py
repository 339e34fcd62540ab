"""A request's images inside the engine: where their placeholder runs sit, the prompt's M-RoPE positions, and the
vision tower's output for each image once computed: kept while any of the image's placeholder tokens is still to be
computed (so a prefill chunked anywhere, inside the run too, runs the tower once per image), dropped once the KV cache
holds them all or the request is preempted (the scheduler's image budget, engine/core/image_budget.py, counts what is
kept)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.multimodal.image_input import ImageInput
from engine.multimodal.placeholders import ImageSpan, image_spans
from engine.multimodal.positions import mrope_positions


@dataclass
class VisionOutput:
    """One image's rows for the decoder: [num_tokens, hidden] embeddings, and (Qwen3-VL's DeepStack) one
    [num_tokens, hidden] tensor per early decoder layer, added to that layer's output at the image's rows."""

    embeds: torch.Tensor
    deepstack: list[torch.Tensor] = field(default_factory=list)


class RequestImages:
    def __init__(self, token_ids: list[int], images: list[ImageInput], image_token_id: int) -> None:
        """Raises ValueError when the placeholder runs of token_ids do not match the images, one run per image of
        its num_tokens (the message names the counts)."""
        spans = image_spans(token_ids, images, image_token_id)
        for i, (span, image) in enumerate(zip(spans, images, strict=True)):
            if span.length != image.num_tokens:
                raise ValueError(f"image {i}'s placeholder run has {span.length} tokens; its grid_thw "
                                 f"{image.grid_thw} needs {image.num_tokens}")
        self.images = images
        self.spans = spans
        self.num_prompt_tokens = len(token_ids)
        self.prompt_positions, self.delta = mrope_positions(len(token_ids), images, spans)
        self.outputs: list[VisionOutput | None] = [None] * len(images)

    def positions(self, start: int, n: int) -> torch.Tensor:
        """[3, n] M-RoPE positions of token indices start .. start + n - 1 (prompt or generated)."""
        split = min(max(start, self.num_prompt_tokens), start + n)
        head = self.prompt_positions[:, start:split]
        tail = torch.arange(split, start + n) + self.delta
        return torch.cat([head, tail.expand(3, -1)], dim=1)

    def overlapping(self, start: int, n: int) -> list[tuple[int, ImageSpan, int, int]]:
        """(image index, its span, first, end) of each image whose run meets token indices start .. start + n - 1:
        rows first .. end - 1 of the image's output sit at token indices span.start + first ..."""
        hits = []
        for i, span in enumerate(self.spans):
            lo, hi = max(start, span.start), min(start + n, span.end)
            if lo < hi:
                hits.append((i, span, lo - span.start, hi - span.start))
        return hits

    def needing_tower(self, start: int, n: int) -> list[tuple[int, ImageSpan]]:
        """(image index, its span) of each image whose run meets token indices start .. start + n - 1 and whose
        tower output is not held: what computing those tokens would put through the tower."""
        return [(i, span) for i, span, _, _ in self.overlapping(start, n) if self.outputs[i] is None]

    @property
    def held_patches(self) -> int:
        """Patches of the images whose tower output is held (each output has num_patches / merge^2 rows)."""
        return sum(image.num_patches for image, out in zip(self.images, self.outputs, strict=True) if out is not None)

    def release(self, computed: int) -> None:
        """Drop the output of every image whose whole run lies before token index `computed`: its rows are in the KV
        cache, and a recompute (after preemption) or a later prefix hit needs no embedding of it."""
        for i, span in enumerate(self.spans):
            if span.end <= computed:
                self.outputs[i] = None

    def release_all(self) -> None:
        """Drop every output (the request ended, or was preempted: its recompute runs the tower again where the
        prefix cache does not cover the image's run)."""
        self.outputs = [None] * len(self.images)

    def block_keys(self, lo: int, hi: int) -> tuple[int, ...]:
        """The digests of the images whose runs meet token indices lo .. hi - 1: a prefix-cache block's extra key."""
        return tuple(self.images[i].digest for i, _, _, _ in self.overlapping(lo, hi - lo))
