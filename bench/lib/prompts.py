"""Seeded prompts cut from real text, the same for every side.

The text is the Python standard library's own source (present wherever Python is, read in sorted order, so
the token stream is the same on every run of one Python build). Real text rather than random ids keeps
aggregates such as the mean logprob and argmax agreement meaningful.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any


class PromptSource:
    def __init__(self, tokenizer: Any, min_tokens: int = 200_000) -> None:
        self.ids = _stream(tokenizer, min_tokens)

    def window(self, rng: random.Random, n: int) -> list[int]:
        """n consecutive tokens at a random offset."""
        if n > len(self.ids):
            raise ValueError(f"asked for {n} tokens, the corpus has {len(self.ids)}")
        start = rng.randrange(0, len(self.ids) - n + 1)
        return self.ids[start:start + n]

    def windows(self, seed: int, lengths: list[int]) -> list[list[int]]:
        rng = random.Random(seed)
        return [self.window(rng, n) for n in lengths]

    def lengths(self, seed: int, count: int, lo: int, hi: int) -> list[int]:
        rng = random.Random(seed)
        return [rng.randint(lo, hi) for _ in range(count)]


def _stream(tokenizer: Any, min_tokens: int) -> list[int]:
    from transformers.utils import logging

    logging.set_verbosity_error()  # "sequence longer than the model max length": irrelevant, we cut windows
    ids: list[int] = []
    for path in sorted(Path(os.__file__).parent.glob("*.py")):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids.extend(tokenizer.encode(text, add_special_tokens=False))
        if len(ids) >= min_tokens:
            return ids
    raise RuntimeError(f"the standard library gave only {len(ids)} tokens of text, {min_tokens} needed")
