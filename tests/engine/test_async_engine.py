"""The streaming API the worker uses: deltas, no replay, abort on abandon, errors as answers."""

from __future__ import annotations

import asyncio
import json
import shutil

import pytest

from engine.async_engine import AsyncEngine
from protocol.outputs import merge_outputs
from protocol.sampling import SamplingParams
from tests.helpers.engine import greedy, make_engine, rand_ids, scoring


@pytest.fixture(scope="module")
def aengine(tiny_models):
    eng = AsyncEngine(engine=make_engine(tiny_models["llama"], max_num_batched_tokens=8))
    yield eng
    eng.shutdown()


async def _collect(eng: AsyncEngine, rid: str, ids: list[int], p: SamplingParams):
    return [o async for o in eng.generate(rid, ids, p)]


async def test_stream_deltas_concatenate_without_repeat(aengine) -> None:
    ids = rand_ids(20, 1)
    outs = await _collect(aengine, "g1", ids, greedy(9, k=2))
    assert [o.finished for o in outs] == [False] * (len(outs) - 1) + [True]
    assert all(len(o.new_token_ids) == 1 for o in outs)  # one new token per delta, none replayed
    whole = merge_outputs(outs)
    again = merge_outputs(await _collect(aengine, "g2", ids, greedy(9, k=2)))
    assert whole.new_token_ids == again.new_token_ids and len(whole.output_token_logprobs) == 9


async def test_scoring_streams_one_output(aengine) -> None:
    outs = await _collect(aengine, "s1", rand_ids(30, 2), scoring(0))
    assert len(outs) == 1 and outs[0].finished and len(outs[0].input_token_logprobs) == 29


async def test_concurrent_streams(aengine) -> None:
    jobs = [_collect(aengine, f"c{i}", rand_ids(10 + i, i), greedy(5) if i % 2 else scoring(1)) for i in range(8)]
    results = await asyncio.gather(*jobs)
    assert all(r[-1].finished for r in results)
    assert aengine.stats().running == 0


async def test_abandoned_stream_aborts_and_frees(aengine) -> None:
    gen = aengine.generate("ab", rand_ids(10, 3), greedy(400, logprobs=False))
    first = await gen.__anext__()
    assert not first.finished
    await gen.aclose()
    for _ in range(100):
        st = aengine.stats()
        if st.running == 0 and st.waiting == 0:
            break
        await asyncio.sleep(0.02)
    assert st.kv_blocks_free == st.kv_blocks_total


async def test_bad_request_is_an_error_answer(aengine) -> None:
    outs = await _collect(aengine, "bad", [1, 2, 10_000], scoring(0))
    assert len(outs) == 1 and outs[0].finish_reason.type == "error" and outs[0].finish_reason.code == 400
    assert "10000" in outs[0].finish_reason.message


def test_unsupported_architecture_is_named(tiny_models, tmp_path) -> None:
    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["GPTNeoXForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="GPTNeoXForCausalLM"):
        make_engine(folder)


def test_missing_weight_is_named(tiny_models, tmp_path) -> None:
    from safetensors.torch import load_file, save_file

    folder = tmp_path / "m"
    shutil.copytree(tiny_models["llama"], folder)
    weights = load_file(folder / "model.safetensors")
    del weights["model.layers.1.mlp.up_proj.weight"]
    save_file(weights, folder / "model.safetensors")
    with pytest.raises(ValueError, match="model.layers.1.mlp.up_proj.weight"):
        make_engine(folder)
