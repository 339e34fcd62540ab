"""The texts of the tokens a logprob answer names: every dialect's renderer asks once per answer (or per event)."""

from __future__ import annotations

from collections.abc import Set

from ingress.backend import TextSide


async def token_texts(text: TextSide, ids: Set[int]) -> dict[int, str]:
    """Each id's text, decoded alone by the served tokenizer (one call for all of them)."""
    if not ids:
        return {}
    order = sorted(ids)
    return dict(zip(order, await text.token_texts(order), strict=True))
