"""Paused generation (SGLang's modes) in the engine: in_place and retract lose nothing and give transformers' greedy
tokens; abort ends in-flight requests with what they produced; requests that arrive while paused wait, up to
pause_timeout_s; a weight update runs during a pause once no request holds KV blocks; abort by id."""

from __future__ import annotations

import asyncio

import pytest

from engine.async_engine import AsyncEngine
from engine.loading.weight_update import apply_weights, stage_weights
from protocol.control import Abort, Pause, Resume
from protocol.outputs import merge_outputs
from tests.helpers.engine import greedy, make_engine, rand_ids


def engine(tiny_models, **overrides: object) -> AsyncEngine:
    return AsyncEngine(engine=make_engine(tiny_models["llama"], max_num_batched_tokens=8, **overrides))


async def run(eng: AsyncEngine, rid: str, ids: list[int], n: int):  # noqa: ANN201
    return merge_outputs([o async for o in eng.generate(rid, ids, greedy(n))])


async def until(cond, timeout: float = 20.0) -> None:  # noqa: ANN001
    deadline = asyncio.get_running_loop().time() + timeout
    while not cond():
        assert asyncio.get_running_loop().time() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("mode", ["in_place", "retract"])
async def test_pause_then_continue_loses_nothing(tiny_models, mode: str) -> None:
    eng = engine(tiny_models)
    try:
        prompts = [rand_ids(12 + i, 40 + i) for i in range(4)]
        want = [await run(eng, f"ref{i}", ids, 12) for i, ids in enumerate(prompts)]
        tasks = [asyncio.ensure_future(run(eng, f"r{i}", ids, 12)) for i, ids in enumerate(prompts)]
        await until(lambda: eng.engine.scheduler.running)
        assert eng.control(Pause(mode)).result(timeout=10) == 4
        steps = eng.engine.counters.steps
        late = asyncio.ensure_future(run(eng, "late", prompts[0], 12))  # arrives while paused: waits
        await asyncio.sleep(0.3)
        assert eng.engine.counters.steps == steps and not late.done()
        if mode == "retract":
            assert not eng.engine.scheduler.running
        eng.control(Resume()).result(timeout=10)
        got = await asyncio.gather(*tasks, late)
        for w, g in zip(want + [want[0]], got, strict=True):
            assert g.new_token_ids == w.new_token_ids and g.finish_reason.type == "length"
        assert eng.engine.kv.pool.num_free == eng.engine.kv.pool.num_blocks
    finally:
        eng.shutdown()


async def test_abort_mode_ends_requests_with_their_output(tiny_models) -> None:
    eng = engine(tiny_models)
    try:
        task = asyncio.ensure_future(run(eng, "a", rand_ids(10, 50), 400))
        await until(lambda: eng.engine.seqs.get("a") is not None and eng.engine.seqs["a"].num_output_tokens > 2)
        assert eng.control(Pause("abort")).result(timeout=10) == 1
        out = await task
        assert out.finish_reason.type == "abort" and 2 < len(out.new_token_ids) < 400
        # /continue_generation's default: nothing to free on CPU
        eng.control(Resume(empty_cache=True)).result(timeout=10)
        assert (await run(eng, "b", rand_ids(10, 51), 3)).finish_reason.type == "length"
    finally:
        eng.shutdown()


async def test_waiting_while_paused_is_bounded(tiny_models) -> None:
    eng = engine(tiny_models, pause_timeout_s=0.3)
    try:
        eng.control(Pause("abort")).result(timeout=10)
        out = await run(eng, "w", rand_ids(10, 52), 3)
        assert out.finish_reason.type == "error" and out.finish_reason.code == 503
        assert "pause_timeout_s" in out.finish_reason.message
    finally:
        eng.shutdown()


async def test_weight_update_while_paused_after_retract(tiny_models) -> None:
    """AReaL's sequence: pause, update the weights, continue; the retracted request finishes (on the new weights)."""
    eng = engine(tiny_models)
    try:
        task = asyncio.ensure_future(run(eng, "u", rand_ids(10, 53), 30))
        await until(lambda: eng.engine.scheduler.running)
        eng.control(Pause("retract")).result(timeout=10)
        staged = stage_weights(eng.engine, str(tiny_models["llama"]))
        _, in_engine = eng.run_exclusive(lambda e: apply_weights(e, staged, "v2")).result(timeout=10)
        assert in_engine == 1 and eng.engine.weight_version == "v2"
        eng.control(Resume()).result(timeout=10)
        out = await task
        assert out.finish_reason.type == "length" and len(out.new_token_ids) == 30
    finally:
        eng.shutdown()


async def test_abort_by_id_and_all(tiny_models) -> None:
    eng = engine(tiny_models)
    try:
        tasks = {rid: asyncio.ensure_future(run(eng, rid, rand_ids(10, 54), 400)) for rid in ("x", "y", "z")}
        await until(lambda: len(eng.engine.seqs) == 3)
        assert eng.control(Abort("x")).result(timeout=10) == 1
        assert (await tasks["x"]).finish_reason.type == "abort"
        assert eng.control(Abort("nope")).result(timeout=10) == 0
        assert eng.control(Abort(None)).result(timeout=10) == 2
        assert {(await tasks[r]).finish_reason.type for r in ("y", "z")} == {"abort"}
    finally:
        eng.shutdown()


async def test_draining_pause_lets_requests_in_flight_finish(tiny_models) -> None:
    """vLLM's /pause?mode=wait: the operation completes once the requests in flight have finished (all their tokens);
    a request that arrives meanwhile waits, through the pause, until the resume."""
    eng = engine(tiny_models)
    try:
        ids = rand_ids(10, 60)
        want = await run(eng, "ref", ids, 24)
        tasks = [asyncio.ensure_future(run(eng, f"w{i}", ids, 24)) for i in range(2)]
        await until(lambda: eng.engine.scheduler.running)
        done = eng.control(Pause("in_place", drain=True))
        late = asyncio.ensure_future(run(eng, "late", ids, 24))
        assert await asyncio.wrap_future(done) == 2
        assert all(t.done() for t in tasks) and eng.paused_mode == "in_place"
        for t in tasks:
            assert t.result().new_token_ids == want.new_token_ids and t.result().finish_reason.type == "length"
        await asyncio.sleep(0.3)
        assert not late.done()
        eng.control(Resume()).result(timeout=10)
        assert (await late).new_token_ids == want.new_token_ids and eng.paused_mode is None
    finally:
        eng.shutdown()
