"""Awaiting several worker calls together, none left behind."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable
from typing import TypeVar

T = TypeVar("T")


async def all_or_none(aws: Iterable[Awaitable[T]]) -> list[T]:
    """gather, but when one fails (or we are cancelled) the others are cancelled and have unwound before
    this returns: no stream is left running inside a task nobody awaits."""
    tasks = [asyncio.ensure_future(a) for a in aws]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
