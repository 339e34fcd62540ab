"""Image placeholder runs in token ids: finding them, and expanding a prompt whose template wrote one placeholder per
image (Qwen's chat template: <|vision_start|><|image_pad|><|vision_end|>) into the run the engine takes, one
placeholder per merged patch (ImageInput.num_tokens), as transformers' processor does."""

from __future__ import annotations

from dataclasses import dataclass

from engine.multimodal.image_input import ImageInput
from protocol.images import expand_runs, placeholder_runs


@dataclass(frozen=True)
class ImageSpan:
    """Where an image's placeholder run sits in the prompt: token indices start .. start + length - 1."""

    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


def placeholder_spans(token_ids: list[int], image_token_id: int) -> list[ImageSpan]:
    """The maximal runs of the image placeholder id, in order (protocol's rule, which the ingress applies too)."""
    return [ImageSpan(start, length) for start, length in placeholder_runs(token_ids, image_token_id)]


def image_spans(token_ids: list[int], images: list[ImageInput], image_token_id: int) -> list[ImageSpan]:
    """The placeholder runs, one per image. Raises ValueError when the runs and the images differ in number."""
    spans = placeholder_spans(token_ids, image_token_id)
    if len(spans) != len(images):
        raise ValueError(f"the prompt has {len(spans)} image placeholder runs (token id {image_token_id}) "
                         f"for {len(images)} images")
    return spans


def expand_placeholders(token_ids: list[int], images: list[ImageInput], image_token_id: int) -> list[int]:
    """token_ids with the i-th placeholder run (of any length, one token as a template writes it) replaced by
    images[i].num_tokens placeholders (protocol's expand_runs: the ingress expands every dialect's prompt with it).
    Raises ValueError when the runs and the images differ in number."""
    return expand_runs(token_ids, [image.num_tokens for image in images], image_token_id)
