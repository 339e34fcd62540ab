"""A running engine's runtime settings (a worker's Serve user_config): EngineConfig.with_runtime accepts
RUNTIME_FIELDS only, validated as at start, and AsyncEngine.reconfigure applies them between two steps, after
which the engine enforces the new limits and bounds and its answers stay what they were."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from engine.async_engine import AsyncEngine
from engine.config import RUNTIME_FIELDS, EngineConfig
from protocol.sampling import SamplingParams
from tests.helpers.engine import make_engine, rand_ids, scoring


def test_with_runtime_lays_changes_over_the_config() -> None:
    base = EngineConfig(max_top_logprobs=20, max_num_batched_tokens=512)
    cfg = base.with_runtime({"max_top_logprobs": 3, "max_num_batched_tokens": 64, "pause_timeout_s": 5.0})
    assert (cfg.max_top_logprobs, cfg.max_num_batched_tokens, cfg.pause_timeout_s) == (3, 64, 5.0)
    assert base.with_runtime(None) == base and cfg.kv_cache_bytes == base.kv_cache_bytes
    assert base.with_runtime({"long_prefill_token_threshold": None, "stuck_engine_timeout_s": 30}) == \
        replace(base, stuck_engine_timeout_s=30)


@pytest.mark.parametrize("changes, words", [
    ({"max_num_seqs": 8}, "`max_num_seqs` is not a runtime setting of the worker; these are: max_num_batched_tokens"),
    ({"kv_cache_bytes": 1}, "`kv_cache_bytes` is not a runtime setting"),
    ({"max_queued_requests": 0}, "max_queued_requests must be positive"),
    ({"max_prompt_chars_per_token": 0}, "max_prompt_chars_per_token must be positive"),
    ({"max_num_batched_tokens": 16.5}, "`max_num_batched_tokens` must be an integer, got 16.5"),
    ({"max_top_logprobs": "5"}, "`max_top_logprobs` must be an integer, got '5'"),
    ({"pause_timeout_s": True}, "`pause_timeout_s` must be a number"),
    ({"max_queued_tokens": None}, "`max_queued_tokens` must be an integer, got None")])
def test_bad_runtime_changes_are_refused_by_name(changes: dict, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        EngineConfig().with_runtime(changes)
    assert "max_num_seqs" not in RUNTIME_FIELDS and "max_top_logprobs" in RUNTIME_FIELDS


def test_batch_invariant_budget_may_fall_but_not_rise_in_place() -> None:
    base = EngineConfig(batch_invariant=True, max_num_batched_tokens=256)
    assert base.with_runtime({"max_num_batched_tokens": 128}).max_num_batched_tokens == 128
    with pytest.raises(ValueError, match="cannot rise above 256 in place with batch_invariant"):
        base.with_runtime({"max_num_batched_tokens": 512})


async def _collect(eng: AsyncEngine, rid: str, ids: list[int], p: SamplingParams) -> list:
    return [o async for o in eng.generate(rid, ids, p)]


async def test_reconfigure_applies_between_steps_and_answers_stay_exact(tiny_models) -> None:
    eng = AsyncEngine(engine=make_engine(tiny_models["llama"], max_num_batched_tokens=64, max_top_logprobs=5))
    try:
        ids = rand_ids(40, 3)
        (before,) = await _collect(eng, "a", ids, scoring(0, k=4))
        cfg = eng.engine.config.with_runtime({"max_top_logprobs": 3, "max_num_batched_tokens": 8,
                                              "long_prefill_token_threshold": 4, "max_queued_requests": 1,
                                              "pause_timeout_s": 7.0})
        await asyncio.wrap_future(eng.reconfigure(cfg))
        sched = eng.engine.scheduler
        assert (sched.max_num_batched_tokens, sched.chunk_cap) == (8, 4)
        assert (eng.admission.max_requests, eng._pause.timeout_s) == (1, 7.0)

        (refused,) = await _collect(eng, "b", ids, scoring(0, k=4))  # the engine's own guard, on the new limit
        assert refused.finish_reason.code == 400 and "max_top_logprobs" in refused.finish_reason.message
        outs = await _collect(eng, "c", ids, scoring(0, k=3))  # 39 rows in steps of 8 tokens now, not one of 64
        (after,) = [o for o in outs if o.finished]
        assert [row[1] for row in after.input_token_logprobs] == [row[1] for row in before.input_token_logprobs]
        for a, b in zip(after.input_token_logprobs, before.input_token_logprobs, strict=True):
            assert abs(a[0] - b[0]) < 1e-4
    finally:
        eng.shutdown()
