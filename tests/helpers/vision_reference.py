"""transformers as the reference for a vision-language checkpoint: one full float32 forward of a prompt with its
images (mm_token_type_ids marking the placeholder runs, as the processor returns them), and greedy generate.

transformers takes the M-RoPE positions from mm_token_type_ids, not from input_ids: the marks come from the
checkpoint's own image_token_id (the processor's, read from its tokenizer, is the same id), never from a constant."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import torch
from transformers import AutoModelForImageTextToText

from engine.multimodal.image_input import ImageInput


@lru_cache(maxsize=4)
def vl_model(path: str) -> torch.nn.Module:
    return AutoModelForImageTextToText.from_pretrained(path, dtype=torch.float32).eval()


def _inputs(path: str, ids: list[int], images: list[ImageInput]) -> dict[str, torch.Tensor]:
    input_ids = torch.tensor([ids])
    marks = (input_ids == vl_model(path).config.image_token_id).int()  # text 0, image 1 (no video here)
    # Unmarked placeholders would put the image rows at text positions, 1e-3 off in the rows after them (issue 48).
    assert int(marks.sum()) == sum(im.num_tokens for im in images), "placeholders and images differ"
    out = {"input_ids": input_ids, "mm_token_type_ids": marks}
    if images:
        out["pixel_values"] = torch.cat([im.pixel_values for im in images])
        out["image_grid_thw"] = torch.tensor([im.grid_thw for im in images])
    return out


@torch.inference_mode()
def vl_scores(path: str | Path, ids: list[int], images: list[ImageInput], start: int) -> list[float]:
    """log_softmax(logits)[p, ids[p+1]] for p = start .. L-2."""
    logits = vl_model(str(path))(**_inputs(str(path), ids, images)).logits[0].float()
    lp = torch.log_softmax(logits, dim=-1)
    return lp[torch.arange(start, len(ids) - 1), torch.tensor(ids[start + 1:])].tolist()


@torch.inference_mode()
def vl_generate(path: str | Path, ids: list[int], images: list[ImageInput], n: int) -> list[int]:
    out = vl_model(str(path)).generate(**_inputs(str(path), ids, images), max_new_tokens=n, do_sample=False,
                                       min_new_tokens=n)
    return out[0, len(ids):].tolist()
