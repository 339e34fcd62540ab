"""workers/many.py: several requests' deltas as one stream of tagged messages (EngineWorker.generate_many)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator

import pytest

from protocol import RequestOutput
from workers.many import merged


def _chunk(rid: str, n: int, last: bool = False) -> RequestOutput:
    return RequestOutput(request_id=rid, new_token_ids=[n], finished=last)


async def test_deltas_ready_together_are_one_message_and_every_delta_comes_once_in_order() -> None:
    step = [asyncio.Event() for _ in range(3)]

    async def request(rid: str, n: int) -> AsyncGenerator[RequestOutput, None]:
        for i in range(n):  # each delta waits for its "engine step", as AsyncEngine's streams do
            await step[i].wait()
            yield _chunk(rid, i, last=i == n - 1)

    async def steps() -> None:
        for event in step:
            event.set()
            await asyncio.sleep(0.01)

    stepper = asyncio.create_task(steps())
    messages = [m async for m in merged([request("a", 3), request("b", 2)])]
    await stepper
    assert [(i, c.new_token_ids[0]) for m in messages for i, c in m if i == 0] == [(0, 0), (0, 1), (0, 2)]
    assert [(i, c.new_token_ids[0]) for m in messages for i, c in m if i == 1] == [(1, 0), (1, 1)]
    assert len(messages) == 3  # one a step: a and b together twice, then a alone


async def test_an_error_ends_the_whole_and_closes_the_others() -> None:
    closed: list[str] = []

    async def fails() -> AsyncGenerator[RequestOutput, None]:
        yield _chunk("a", 0)
        raise RuntimeError("engine died")

    async def hangs() -> AsyncGenerator[RequestOutput, None]:
        try:
            yield _chunk("b", 0)
            await asyncio.Event().wait()
        finally:
            closed.append("b")

    with pytest.raises(RuntimeError, match="engine died"):
        async for _ in merged([fails(), hangs()]):
            pass
    assert closed == ["b"]


async def test_closing_the_messages_closes_every_stream() -> None:
    closed: list[str] = []

    async def hangs(rid: str) -> AsyncGenerator[RequestOutput, None]:
        try:
            yield _chunk(rid, 0)
            await asyncio.Event().wait()
        finally:
            closed.append(rid)

    async with contextlib.aclosing(merged([hangs("a"), hangs("b")])) as messages:
        first = await anext(messages)
    assert sorted(i for i, _ in first) == [0, 1]
    assert sorted(closed) == ["a", "b"]
