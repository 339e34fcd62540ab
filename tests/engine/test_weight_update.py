"""Weight updates in the engine: staged while the old weights serve, applied only when no request is in the
engine, every cache emptied; a bad checkpoint changes nothing. Values against transformers on each checkpoint."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from engine.async_engine import AsyncEngine
from engine.loading.weight_update import WeightUpdateError, apply_weights, stage_weights
from protocol.outputs import merge_outputs
from tests.helpers.engine import assert_rows, greedy, make_engine, rand_ids, scoring
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_models import build_tiny_model


@pytest.fixture(scope="module")
def second(tiny_models, tmp_path_factory) -> Path:
    """Same config and shapes as tiny_models["llama"], other values."""
    return build_tiny_model(tmp_path_factory.mktemp("v2") / "llama", "llama", seed=5)


def test_update_serves_new_weights_and_forgets_the_cache(tiny_models, second) -> None:
    old = tiny_models["llama"]
    eng = make_engine(old, enable_prefix_cache=True)
    ids = rand_ids(40, seed=1)
    for _ in range(2):  # cold, then warm: the cache and both stores hold old-weights state
        out = eng.generate([ids], scoring(0), check=True)[0]
        assert_rows(out.input_token_logprobs, ids, 0, hf_scores(old, ids, 0))
    assert out.cached_tokens > 0 and eng.weight_version == "default"
    apply_weights(eng, stage_weights(eng, str(second)), "v2")
    assert eng.weight_version == "v2"
    new = eng.generate([ids], scoring(0), check=True)[0]
    assert new.cached_tokens == 0  # the prompt cached before the update is computed anew
    assert_rows(new.input_token_logprobs, ids, 0, hf_scores(second, ids, 0))
    warm = eng.generate([ids], scoring(0), check=True)[0]
    assert warm.cached_tokens > 0
    assert_rows(warm.input_token_logprobs, ids, 0, hf_scores(second, ids, 0))


def test_bad_checkpoints_change_nothing(tiny_models, tmp_path) -> None:
    old = tiny_models["llama"]
    eng = make_engine(old, enable_prefix_cache=True)
    with pytest.raises(WeightUpdateError, match="is not a checkpoint folder"):
        stage_weights(eng, str(tmp_path / "nowhere"))
    with pytest.raises(WeightUpdateError, match="another config than the served model"):
        stage_weights(eng, str(tiny_models["qwen2"]))
    bad = tmp_path / "bad"
    shutil.copytree(old, bad)
    state = load_file(bad / "model.safetensors")
    state["model.layers.0.mlp.down_proj.weight"] = state["model.layers.0.mlp.down_proj.weight"][:, :64].clone()
    save_file(state, bad / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(WeightUpdateError, match="down_proj.weight has shape"):
        stage_weights(eng, str(bad))
    ids = rand_ids(30, seed=2)
    out = eng.generate([ids], scoring(0), check=True)[0]
    assert_rows(out.input_token_logprobs, ids, 0, hf_scores(old, ids, 0))
    assert eng.weight_version == "default"


async def test_in_flight_requests_finish_on_the_weights_they_started_with(tiny_models, second) -> None:
    """A generation in flight when the update arrives finishes on the old weights; a scoring request sent after
    it waits and runs on the new ones; with abort_all the one in flight is aborted instead."""
    old = tiny_models["llama"]
    ids = rand_ids(24, seed=3)
    eng = make_engine(old, enable_prefix_cache=True, max_num_batched_tokens=8)
    # The whole answer on the old weights, before the engine thread starts: only that thread may step it.
    reference = eng.generate([ids], greedy(40))[0]
    aeng = AsyncEngine(engine=eng)
    try:

        async def collect(rid: str, p) -> object:  # noqa: ANN001
            return merge_outputs([o async for o in aeng.generate(rid, ids, p)])

        gen = asyncio.create_task(collect("gen", greedy(40)))
        while "gen" not in aeng.engine.seqs or aeng.engine.seqs["gen"].num_output_tokens < 2:
            await asyncio.sleep(0.005)
        staged = stage_weights(aeng.engine, str(second))
        update = aeng.run_exclusive(lambda eng: apply_weights(eng, staged, "v2"))
        score = asyncio.create_task(collect("score", scoring(0)))
        old_answer = await gen
        assert (await asyncio.wrap_future(update))[1] == 1  # one request was in the engine
        assert old_answer.new_token_ids == reference.new_token_ids
        assert [v for v, _ in old_answer.output_token_logprobs] == pytest.approx(
            [v for v, _ in reference.output_token_logprobs], abs=1e-5)
        assert_rows((await score).input_token_logprobs, ids, 0, hf_scores(second, ids, 0))

        back = stage_weights(aeng.engine, str(old))
        gen = asyncio.create_task(collect("gen2", greedy(200)))
        while "gen2" not in aeng.engine.seqs:
            await asyncio.sleep(0.005)
        update = aeng.run_exclusive(lambda eng: apply_weights(eng, back, "default"), abort_all=True)
        aborted = await gen
        assert aborted.finish_reason.type == "abort" and aborted.completion_tokens < 200
        assert (await asyncio.wrap_future(update))[1] == 1
        out = await collect("score2", scoring(0))
        assert_rows(out.input_token_logprobs, ids, 0, hf_scores(old, ids, 0))
    finally:
        aeng.shutdown()
