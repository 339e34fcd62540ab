"""The coalescer (ingress/transport/coalesce.py) over a worker call that the test holds open: who goes alone, who
waits and goes together, each caller's own answers back, and a caller that leaves."""

from __future__ import annotations

import asyncio

import pytest

from ingress.transport.coalesce import Coalescer
from protocol import GenerateRequest, RequestOutput, SamplingParams


def scoring(rid: str, n: int = 8, max_tokens: int = 0) -> GenerateRequest:
    return GenerateRequest(rid=rid, input_ids=list(range(1, n + 1)), params=SamplingParams(max_tokens=max_tokens))


class HeldCall:
    """A worker call that answers each request with a chunk named after it, once the test releases it."""

    def __init__(self) -> None:
        self.calls: list[list[str]] = []
        self.release = asyncio.Event()
        self.cancelled: list[list[str]] = []
        self.fail: Exception | None = None

    async def __call__(self, reqs: list[GenerateRequest]) -> list[RequestOutput]:
        rids = [r.rid for r in reqs]
        self.calls.append(rids)
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append(rids)
            raise
        if self.fail is not None:
            raise self.fail
        return [RequestOutput(request_id=r.rid, finished=True) for r in reqs]


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def rids(chunks: list[RequestOutput]) -> list[str]:
    return [c.request_id for c in chunks]


def test_below_the_limit_each_goes_alone() -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=3, max_tokens=2048)
        tasks = [asyncio.ensure_future(co.answers([scoring(f"r{i}")])) for i in range(3)]
        await settle()
        assert call.calls == [["r0"], ["r1"], ["r2"]]
        call.release.set()
        assert [rids(await t) for t in tasks] == [["r0"], ["r1"], ["r2"]]
        assert (co.calls, co.coalesced) == (3, 0)

    asyncio.run(main())


def test_arrivals_at_the_limit_go_as_one_call_and_each_gets_its_own() -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=2048)
        first = asyncio.ensure_future(co.answers([scoring("a")]))
        await settle()
        later = [asyncio.ensure_future(co.answers([scoring(f"b{i}"), scoring(f"c{i}")])) for i in range(3)]
        await settle()
        assert call.calls == [["a"]]  # the others wait for a free slot
        call.release.set()
        assert rids(await first) == ["a"]
        assert [rids(await t) for t in later] == [["b0", "c0"], ["b1", "c1"], ["b2", "c2"]]
        assert call.calls == [["a"], ["b0", "c0", "b1", "c1", "b2", "c2"]]
        assert (co.calls, co.coalesced) == (2, 3)

    asyncio.run(main())


def test_a_coalesced_call_holds_at_most_max_tokens() -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=20)
        first = asyncio.ensure_future(co.answers([scoring("a")]))
        await settle()
        later = [asyncio.ensure_future(co.answers([scoring(f"b{i}")])) for i in range(5)]  # 8 tokens each
        await settle()
        call.release.set()
        await asyncio.gather(first, *later)
        assert call.calls == [["a"], ["b0", "b1"], ["b2", "b3"], ["b4"]]

    asyncio.run(main())


def test_a_prompt_with_one_new_token_coalesces_and_counts_it() -> None:
    """vLLM's prompt_logprobs request and lm-eval's loglikelihood request generate one token: scoring's cost, so they
    coalesce; the new token counts toward max_tokens (7 + 1 + 7 + 1 = 16 fits, a third does not)."""
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=16)
        first = asyncio.ensure_future(co.answers([scoring("a")]))
        await settle()
        later = [asyncio.ensure_future(co.answers([scoring(f"b{i}", n=7, max_tokens=1)])) for i in range(3)]
        await settle()
        assert call.calls == [["a"]]  # they wait for the slot, as scoring does
        call.release.set()
        await asyncio.gather(first, *later)
        assert call.calls == [["a"], ["b0", "b1"], ["b2"]]

    asyncio.run(main())


@pytest.mark.parametrize("req", [
    GenerateRequest(rid="g", input_ids=[1, 2, 3], params=SamplingParams(max_tokens=2)),  # a generation
    scoring("g", n=64),  # over max_tokens
    scoring("g", n=32, max_tokens=1),  # with its new token, over max_tokens
])
def test_what_may_not_coalesce_never_waits(req: GenerateRequest) -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=32)
        first = asyncio.ensure_future(co.answers([scoring("a")]))
        await settle()
        alone = asyncio.ensure_future(co.answers([req]))
        await settle()
        assert call.calls == [["a"], ["g"]]
        call.release.set()
        await asyncio.gather(first, alone)

    asyncio.run(main())


def test_off_when_max_in_flight_is_zero() -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=0, max_tokens=2048)
        tasks = [asyncio.ensure_future(co.answers([scoring(f"r{i}")])) for i in range(4)]
        await settle()
        assert len(call.calls) == 4
        call.release.set()
        await asyncio.gather(*tasks)

    asyncio.run(main())


def test_a_caller_that_leaves_before_the_call_is_never_sent() -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=2048)
        first = asyncio.ensure_future(co.answers([scoring("a")]))
        await settle()
        gone = asyncio.ensure_future(co.answers([scoring("gone")]))
        stays = asyncio.ensure_future(co.answers([scoring("stays")]))
        await settle()
        gone.cancel()
        await settle()
        call.release.set()
        await first
        assert rids(await stays) == ["stays"]
        assert call.calls == [["a"], ["stays"]]

    asyncio.run(main())


def test_a_sent_call_is_cancelled_only_when_all_its_callers_left() -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=2048)
        first = asyncio.ensure_future(co.answers([scoring("a")]))
        await settle()
        x = asyncio.ensure_future(co.answers([scoring("x")]))
        y = asyncio.ensure_future(co.answers([scoring("y")]))
        await settle()
        call.release.set()
        await first
        await settle()
        assert call.calls[-1] == ["x", "y"]
        # Held again: x leaves, y still waits, so the call runs on; then y leaves too and the call is cancelled.
        call.release.clear()
        call.calls.clear()
        p = asyncio.ensure_future(co.answers([scoring("p")]))  # goes alone: a slot is free
        await settle()
        q = asyncio.ensure_future(co.answers([scoring("q")]))
        r = asyncio.ensure_future(co.answers([scoring("r")]))
        await settle()
        assert call.calls == [["p"]]
        p.cancel()  # frees the slot: q and r go together
        await settle()
        assert call.calls == [["p"], ["q", "r"]]
        q.cancel()
        await settle()
        assert call.cancelled == [["p"]]
        r.cancel()
        await settle()
        assert call.cancelled == [["p"], ["q", "r"]]
        assert co._in_flight == 0 and not co._queue
        await asyncio.gather(x, y)

    asyncio.run(main())


def test_a_failed_call_fails_each_of_its_callers() -> None:
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=2048)
        first = asyncio.ensure_future(co.answers([scoring("a")]))
        await settle()
        later = [asyncio.ensure_future(co.answers([scoring(f"b{i}")])) for i in range(2)]
        await settle()
        call.fail = RuntimeError("worker lost")
        call.release.set()
        for t in (first, *later):
            with pytest.raises(RuntimeError, match="worker lost"):
                await t
        assert co._in_flight == 0

    asyncio.run(main())


def test_a_long_call_holds_no_slot() -> None:
    """Generations in flight never make a scoring request wait: only small scoring calls take the slots."""
    async def main() -> None:
        call = HeldCall()
        co = Coalescer(call, max_in_flight=1, max_tokens=2048)
        gen = GenerateRequest(rid="g", input_ids=[1, 2, 3], params=SamplingParams(max_tokens=500))
        long = asyncio.ensure_future(co.answers([gen]))
        await settle()
        short = asyncio.ensure_future(co.answers([scoring("s")]))
        await settle()
        assert call.calls == [["g"], ["s"]]
        call.release.set()
        await asyncio.gather(long, short)

    asyncio.run(main())
