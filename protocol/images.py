"""The image carrier: one preprocessed image as it crosses the ingress -> worker boundary, and the placeholder
expansion every dialect applies to a prompt's ids.

The ingress decodes and preprocesses (ingress/images.py); the worker turns each carrier into the engine's image
(engine/multimodal/image_input.py) without touching its pixels again. Plain builtins, so it pickles small: the patches
are float32 bytes (row-major [rows, cols]), never a tensor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

# Qwen2-VL's family merges 2 x 2 patches into one placeholder token (vision_config.spatial_merge_size).
MERGE = 2


def image_digest(pixels: bytes, grid_thw: tuple[int, int, int]) -> int:
    """blake2b of an image's float32 patch bytes and its grid, as a signed 64-bit int: the prefix cache's key for
    the blocks its placeholder run meets (two images behind the same placeholder ids never share KV)."""
    h64 = hashlib.blake2b(pixels, digest_size=8, person=b"rayscore-img")
    h64.update(repr(tuple(int(x) for x in grid_thw)).encode())
    return int.from_bytes(h64.digest(), "little", signed=True)


@dataclass(frozen=True, eq=False)
class ImageData:
    """The image processor's output for one image (transformers' Qwen2VLImageProcessor: its `pixel_values` rows and
    `image_grid_thw`), with the content digest computed once, where the image was decoded."""

    # [rows, cols] float32 little-endian patches, row-major, in the processor's order; rows = t * h * w.
    pixels: bytes
    rows: int
    cols: int
    # Patches along time, height and width (before the 2 x 2 merge).
    grid_thw: tuple[int, int, int]
    digest: int

    @classmethod
    def of(cls, pixels: bytes, rows: int, cols: int, grid_thw: tuple[int, int, int]) -> ImageData:
        t, h, w = (int(x) for x in grid_thw)
        if rows != t * h * w or len(pixels) != rows * cols * 4:
            raise ValueError(f"{len(pixels)} bytes as [{rows}, {cols}] float32 do not fit grid_thw {(t, h, w)}")
        return cls(pixels, rows, cols, (t, h, w), image_digest(pixels, (t, h, w)))

    @property
    def num_tokens(self) -> int:
        """Placeholder tokens the image takes in the expanded prompt: its patches over the 2 x 2 merge."""
        t, h, w = self.grid_thw
        return t * h * w // (MERGE * MERGE)


def placeholder_runs(token_ids: list[int], image_token_id: int) -> list[tuple[int, int]]:
    """(start, length) of each maximal run of the image placeholder id, in order."""
    runs: list[tuple[int, int]] = []
    run = -1
    for i, tok in enumerate(token_ids):
        if tok == image_token_id and run < 0:
            run = i
        elif tok != image_token_id and run >= 0:
            runs.append((run, i - run))
            run = -1
    if run >= 0:
        runs.append((run, len(token_ids) - run))
    return runs


def expand_runs(token_ids: list[int], counts: list[int], image_token_id: int) -> list[int]:
    """token_ids with the i-th placeholder run (of any length: one token as a chat template writes it, or already
    expanded as slime and verl send it) replaced by counts[i] placeholders. Raises ValueError naming both counts
    when the runs and the images differ in number."""
    runs = placeholder_runs(token_ids, image_token_id)
    if len(runs) != len(counts):
        raise ValueError(f"the prompt has {len(runs)} image placeholder runs (token id {image_token_id}) "
                         f"for {len(counts)} images")
    out: list[int] = []
    at = 0
    for (start, length), n in zip(runs, counts, strict=True):
        out += token_ids[at:start] + [image_token_id] * n
        at = start + length
    return out + token_ids[at:]
