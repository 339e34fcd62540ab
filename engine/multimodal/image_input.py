"""One image of a request, as the engine takes it: the processor's patches and grid, and a hash of its content."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from protocol.images import MERGE, ImageData, image_digest


@dataclass(frozen=True, eq=False)  # compared by digest, never by the tensor
class ImageInput:
    """The image processor's output for one image (transformers' Qwen2VLImageProcessor: `pixel_values` rows of
    one image, its `image_grid_thw`) and a digest of the patches, which keys the prefix cache: two images behind
    the same placeholder ids never share KV. The prompt holds the image's placeholder run already expanded
    (`num_tokens` image-token ids)."""

    # [t * h * w, channels * temporal_patch * patch * patch] float32 patches, in the processor's order.
    pixel_values: torch.Tensor
    # Patches along time, height and width (before the 2 x 2 merge).
    grid_thw: tuple[int, int, int]
    # blake2b of the patches' bytes and the grid, as a signed 64-bit int (a block hash's extra key).
    digest: int

    @classmethod
    def of(cls, pixel_values: torch.Tensor, grid_thw: tuple[int, int, int]) -> ImageInput:
        t, h, w = (int(x) for x in grid_thw)
        if pixel_values.dim() != 2 or pixel_values.shape[0] != t * h * w:
            raise ValueError(f"pixel_values has shape {tuple(pixel_values.shape)}; grid_thw {(t, h, w)} needs "
                             f"{t * h * w} rows")
        pixels = pixel_values.detach().to("cpu", torch.float32).contiguous()
        return cls(pixels, (t, h, w), image_digest(pixels.numpy().tobytes(), (t, h, w)))

    @classmethod
    def from_carrier(cls, data: ImageData) -> ImageInput:
        """The engine's image of a carrier from the ingress: its bytes viewed as patches (copied once, so the
        tensor owns writable memory), its digest as computed there (the same function as `of`)."""
        pixels = torch.frombuffer(bytearray(data.pixels), dtype=torch.float32).view(data.rows, data.cols)
        return cls(pixels, data.grid_thw, data.digest)

    @property
    def num_patches(self) -> int:
        """Patches the vision tower runs over (its rows before the merger): the unit of the step's image budget."""
        t, h, w = self.grid_thw
        return t * h * w

    @property
    def num_tokens(self) -> int:
        """Placeholder tokens the image takes in the prompt: its patches over the 2 x 2 merge."""
        t, h, w = self.grid_thw
        return t * h * w // (MERGE * MERGE)

    @property
    def llm_grid(self) -> tuple[int, int, int]:
        """(t, h, w) of the merged tokens: the M-RoPE axes' extents."""
        t, h, w = self.grid_thw
        return t, h // MERGE, w // MERGE
