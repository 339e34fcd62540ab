"""A step's image rows: runs the vision tower for each image a chunk reaches that has no output yet (the output stays
with the request until its image's tokens are all computed: RequestImages.release), and gathers the rows of the
chunk's part of each image. Which images a step reaches is the scheduler's image budget's decision."""

from __future__ import annotations

import torch

from engine.models.llama import LlamaForCausalLM
from engine.models.vision.language import VisionRows
from engine.multimodal.request_images import RequestImages


class VisionEncoder:
    def __init__(self, model: LlamaForCausalLM, device: torch.device) -> None:
        self.model = model
        self.device = device
        self.tower_runs = 0  # images put through the vision tower (tests: once per image per request)
        self.tower_patches = 0  # patches put through it (tests: each step's equals SchedulerOutput.image_patches)

    def rows(self, image_chunks: list[tuple[int, RequestImages, int, int]]) -> VisionRows | None:
        """image_chunks: (first row in the flat batch, the request's images, chunk start, chunk length)."""
        rows: list[torch.Tensor] = []
        embeds: list[torch.Tensor] = []
        deep: list[list[torch.Tensor]] = []
        for offset, images, start, n in image_chunks:
            for i, span, first, end in images.overlapping(start, n):
                out = images.outputs[i]
                if out is None:
                    out = self.model.encode_image(images.images[i])  # type: ignore[operator]
                    images.outputs[i] = out
                    self.tower_runs += 1
                    self.tower_patches += images.images[i].num_patches
                row = offset + span.start + first - start
                rows.append(torch.arange(row, row + end - first, device=self.device))
                embeds.append(out.embeds[first:end])
                deep.append([d[first:end] for d in out.deepstack])
        if not rows:
            return None
        return VisionRows(torch.cat(rows), torch.cat(embeds), [torch.cat(layer) for layer in zip(*deep, strict=True)])
