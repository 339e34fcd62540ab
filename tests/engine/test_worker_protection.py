"""Self-protection on a real engine (tiny checkpoint, no Ray): the bounded queue refuses at once, limits on what
one request may return, carriers built in the engine thread, and a health check that tells stuck from busy.

The engine thread is held with a gate on the real engine's step (the one test-only hook): requests then wait to
start, exactly as they do behind a long prefill."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

from engine.async_engine import AsyncEngine, EngineUnhealthy
from engine.llm_engine import RequestError
from protocol.outputs import merge_outputs
from tests.helpers.engine import assert_rows, make_engine, rand_ids, scoring
from tests.helpers.reference import hf_scores


class Gate:
    """Holds the engine thread at the start of each step until opened (or delays each step)."""

    def __init__(self, eng: AsyncEngine, delay_s: float = 0.0) -> None:
        self.open = threading.Event()
        self.delay_s = delay_s
        step = eng.engine.step

        def gated_step():  # type: ignore[no-untyped-def]
            if delay_s:
                time.sleep(delay_s)
            else:
                self.open.wait()
            return step()

        eng.engine.step = gated_step  # type: ignore[method-assign]


def _engine(tiny_models, **cfg: object) -> AsyncEngine:
    return AsyncEngine(engine=make_engine(tiny_models["llama"], max_num_batched_tokens=16, **cfg))


@pytest.fixture
def engines() -> Iterator[list[AsyncEngine]]:
    made: list[AsyncEngine] = []
    yield made
    for e in made:
        e.shutdown()


async def _collect(eng: AsyncEngine, rid: str, ids: list[int], k: int = 0) -> list:
    return [o async for o in eng.generate(rid, ids, scoring(0, k))]


async def _until(cond, timeout: float = 30.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_full_queue_refuses_at_once_and_accepted_stay_exact(tiny_models, engines) -> None:
    eng = _engine(tiny_models, max_queued_requests=2, max_queued_tokens=1000)
    engines.append(eng)
    ids = [rand_ids(30, i) for i in range(3)]
    gate = Gate(eng)
    accepted = [asyncio.create_task(_collect(eng, f"a{i}", ids[i])) for i in range(2)]
    await _until(lambda: eng.admission.queued == (2, 60))
    refused = await _collect(eng, "over", ids[2])  # answered while the engine thread is held
    assert len(refused) == 1 and refused[0].finished
    fr = refused[0].finish_reason
    assert (fr.type, fr.code) == ("error", 503) and "max_queued_requests=2" in fr.message
    assert eng.admission.queued == (2, 60) and eng.stats().refused == 1  # nothing of it was queued
    gate.open.set()
    for task, prompt in zip(accepted, ids, strict=False):
        got = merge_outputs(await task)
        assert got.finish_reason.type == "length"
        assert_rows(got.input_token_logprobs, prompt, 0, hf_scores(tiny_models["llama"], prompt, 0))
    assert eng.admission.queued == (0, 0)


async def test_queued_tokens_bound_but_an_empty_queue_takes_any_prompt(tiny_models, engines) -> None:
    eng = _engine(tiny_models, max_queued_tokens=50)
    engines.append(eng)
    gate = Gate(eng)
    long_one = asyncio.create_task(_collect(eng, "long", rand_ids(80, 1)))  # 80 > 50, but the queue is empty
    await _until(lambda: eng.admission.queued == (1, 80))
    (refused,) = await _collect(eng, "more", rand_ids(5, 2))
    assert refused.finish_reason.code == 503 and "max_queued_tokens=50" in refused.finish_reason.message
    gate.open.set()
    assert (await long_one)[-1].finish_reason.type == "length"
    # Started requests no longer count: the queue is empty again and takes new work.
    assert (await _collect(eng, "after", rand_ids(5, 3)))[-1].finish_reason.type == "length"


async def test_stuck_engine_fails_health_check_busy_one_does_not(tiny_models, engines) -> None:
    stuck = _engine(tiny_models, stuck_engine_timeout_s=0.3)
    busy = _engine(tiny_models, stuck_engine_timeout_s=0.3)
    engines += [stuck, busy]
    await asyncio.sleep(0.5)
    stuck.check_health()  # idle for longer than the timeout: not stuck
    gate = Gate(stuck)
    Gate(busy, delay_s=0.1)  # every step takes 0.1 s: slow, but each one ends
    held = asyncio.create_task(_collect(stuck, "s", rand_ids(40, 4)))
    slow = asyncio.create_task(_collect(busy, "b", rand_ids(40, 4)))  # 40 tokens / 16 per step: 3 steps
    while not slow.done():
        busy.check_health()
        await asyncio.sleep(0.05)
    with pytest.raises(EngineUnhealthy, match=r"stuck_engine_timeout_s=0\.3"):
        stuck.check_health()
    gate.open.set()
    await held
    stuck.check_health()  # it moved again


async def test_carriers_are_built_in_the_engine_thread(tiny_models, engines) -> None:
    threads: set[str] = set()

    def convert(out):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        return out

    eng = AsyncEngine(engine=make_engine(tiny_models["llama"]), convert=convert)
    engines.append(eng)
    assert (await _collect(eng, "c", rand_ids(20, 5), k=3))[-1].finished
    assert threads == {"rayscore-engine"}


def test_limits_on_what_one_request_returns(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"], max_top_logprobs=5, max_logprob_entries=60)
    with pytest.raises(RequestError, match=r"the 6 most likely .* at most 5 \(config field `max_top_logprobs`\)"):
        eng.add_request("k", rand_ids(10, 1), scoring(0, 6))
    # 14 scored rows x (1 + 4) = 70 entries > 60
    with pytest.raises(RequestError,
                       match=r"70 logprob entries .* at most 60 per request \(config field `max_logprob_entries"):
        eng.add_request("e", rand_ids(15, 1), scoring(0, 4))
    out = eng.generate([rand_ids(15, 1)], scoring(0, 3))[0]  # 14 x 4 = 56: accepted
    assert len(out.input_top_logprobs) == 14 and all(len(r) == 3 for r in out.input_top_logprobs)


async def test_a_dying_loop_calls_on_fatal_before_failing_its_requests(tiny_models, engines) -> None:
    """A split worker passes on_fatal (workers/ranks.py's end_replica ends the process there, so the ingress retries
    the requests): it sees the error before any waiting request is answered."""
    seen: list[tuple[BaseException, int]] = []
    delivered: list = []
    eng = AsyncEngine(engine=make_engine(tiny_models["llama"], max_num_batched_tokens=16),
                      on_fatal=lambda e: seen.append((e, len(delivered))))
    engines.append(eng)

    def broken_step():  # type: ignore[no-untyped-def]
        raise RuntimeError("a rank's connection closed")

    eng.engine.step = broken_step  # type: ignore[method-assign]
    async for out in eng.generate("r", rand_ids(12, 1), scoring(0)):
        delivered.append(out)
    assert [(str(e), n) for e, n in seen] == [("a rank's connection closed", 0)]
    assert delivered[-1].finish_reason.code == 500 and not eng.is_alive  # with no on_fatal exit: failed as before
