"""Pipeline parallelism at engine level, without Ray: the ranks of pipeline_parallel_size stages spawned on one gloo
group (tests/helpers/tp.py). Every row equals transformers' float32 forward and the same engine on one device within
1e-4: chunked prefill, scoring with top-k, greedy and seeded sampling in one batch, prefix-cache hits through rank
0's hidden-state store, at PP 2 (one rank per stage) and TP 2 x PP 2 (dense Llama), and Qwen3-MoE and DeepSeek-V3
at TP 2 x PP 2 with an uneven cut (3 layers: 1 + 2). Qwen3.5-MoE (a hybrid) and gpt-oss at TP 2 x PP 2:
tests/engine/test_parallel_families.py and test_tensor_parallel_moe.py. Every case runs with pipeline_overlap (the
default): two steps in flight with disjoint requests, checked by rank 0's own count of steps in flight; preemption,
chunked prefill, prefix hits across steps in flight and a request aborted in flight keep every other row exact."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.config import EngineConfig
from engine.loading.loader import load_model
from engine.parallel.local import run_local
from engine.parallel.pipeline import cut_stage, stage_layers
from engine.runner.lora import LoraManager
from protocol.outputs import RequestOutput, merge_outputs
from protocol.sampling import SamplingParams
from tests.engine.test_tensor_parallel import ATOL, CFG, _check_scoring
from tests.helpers.engine import greedy, make_engine, rand_ids, scoring
from tests.helpers.families import family_path
from tests.helpers.reference import hf_logits
from tests.helpers.tiny_deepseek_v3 import build_deepseek_v3
from tests.helpers.tp import run_split


def _batches() -> list[tuple[list[list[int]], list[SamplingParams]]]:
    a, b, c = rand_ids(37, 1), rand_ids(9, 2), rand_ids(21, 3)
    shared = a[:24] + rand_ids(10, 4)  # a's first 6 blocks, cached when it is sent
    sampled = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.9, seed=7, return_logprob=True)
    return [([a, b, c, b], [scoring(0, k=3), greedy(8, k=2), scoring(5), sampled]),
            ([a], [scoring(2)]),  # every row from rank 0's store, most by the log-sum-exp shortcut
            ([shared], [scoring(1, k=2)])]


def _check_greedy(path: Path, ids: list[int], out, alone) -> None:
    """Each generated token is transformers' argmax over the prompt and the tokens before it, with its logprob."""
    assert out.new_token_ids == alone.new_token_ids
    lp = torch.log_softmax(hf_logits(path, ids + out.new_token_ids), dim=-1)
    for j, (v, t) in enumerate(out.output_token_logprobs):
        row = lp[len(ids) - 1 + j]
        assert t == int(row.argmax()) and abs(v - row[t].item()) <= ATOL


def _check(path: Path, size: int, stages: int) -> None:
    batches = _batches()
    split = run_split(size, dict(model=str(path), pipeline_parallel_size=stages, **CFG), batches)
    one = make_engine(path, **CFG)
    alone = [one.generate(prompts, params) for prompts, params in batches]
    (s_a, g_b, s_c, s_b), (warm_a,), (s_shared,) = split.outputs
    (a, b, c, _), _ = batches[0]
    shared = batches[2][0][0]
    assert s_b.new_token_ids == alone[0][3].new_token_ids  # rank 0's generator over the last stage's rows
    _check_scoring(path, a, 0, 3, s_a, alone[0][0])
    _check_greedy(path, b, g_b, alone[0][1])
    _check_scoring(path, c, 5, 0, s_c, alone[0][2])
    _check_scoring(path, a, 2, 0, warm_a, alone[1][0])
    _check_scoring(path, shared, 1, 2, s_shared, alone[2][0])
    assert warm_a.cached_tokens > 0 and s_shared.cached_tokens >= 24
    assert split.stats.prefix_cache_hit_tokens > 0 and split.stats.hidden_store_rows > 0
    assert split.follower_steps == [split.forwards] * (size - 1) and split.forwards > 0
    assert split.peak_in_flight == 2  # the 4 requests of the first batch went as two steps in flight at once


@pytest.mark.parametrize(("size", "stages"), [(2, 2), (4, 2)])
def test_dense_stages_equal_transformers_and_one_device(tiny_models, size: int, stages: int) -> None:
    """PP 2: one rank per stage (each stage's group a single rank). TP 2 x PP 2: stage 1's ranks all-reduce on their
    own group, each receiving from the stage 0 rank of its index."""
    _check(tiny_models["llama"], size, stages)


@pytest.mark.parametrize("family", ["qwen3-moe", "dsv3"])
def test_moe_stages_equal_transformers(tmp_path: Path, family: str) -> None:
    """TP 2 x PP 2, each 3 layers cut 1 + 2, each stage's 2 ranks splitting its own layers. Qwen3-MoE: sparse,
    dense, sparse layers (both kinds cross the cut), experts split by width. DeepSeek-V3: a dense layer then two MoE
    ones; MLA's heads split (q through its low rank: q_b_proj by head), each rank caching the whole latent (one
    vector per token and layer) of its stage's layers."""
    path = family_path(family) if family != "dsv3" else build_deepseek_v3(tmp_path / "dsv3", "dsv3")
    _check(path, 4, 2)


def _crowd() -> tuple[list[list[int]], list[SamplingParams]]:
    """Six requests at once for a cache of 16 blocks of 4 (they want ~27): preemptions while steps are in flight;
    prompts longer than a request's 4-token first share of the 16-token step: chunked prefill; two scoring prompts
    sharing 4 blocks: the second matches blocks the first registered in the step in flight before its own."""
    shared = rand_ids(16, 11)
    prompts = [rand_ids(13, 20), rand_ids(7, 21), shared + rand_ids(5, 22), shared + rand_ids(9, 23),
               rand_ids(11, 24), rand_ids(5, 25)]
    return prompts, [greedy(10, k=2), greedy(12), scoring(0, k=2), scoring(3), greedy(8), scoring(1)]


def _abort_in_flight(prompts: list[list[int]], eng: Any) -> tuple[str, dict[str, list[RequestOutput]]]:
    """Rank 0: four greedy requests; after the first step() one step is still in flight: abort a request in it, and
    send a scoring request under the same id at once. Every stream, the engine's integrity checked each step."""
    streams: dict[str, list[RequestOutput]] = {}
    for i, ids in enumerate(prompts):
        eng.add_request(f"r{i}", ids, greedy(6))
        streams[f"r{i}"] = []
    for out in eng.step():
        streams[out.request_id].append(out)
    rid = next(s.request_id for s in eng.seqs.values() if s.in_flight)
    final = eng.abort_request(rid)
    assert final is not None and final.finished
    eng.add_request(rid, prompts[0], scoring(0))
    streams[rid] = []
    while eng.has_unfinished():
        for out in eng.step():
            streams[out.request_id].append(out)
        eng.check_integrity()
    return rid, streams


def _crowd_then_abort(crowd: tuple[list[list[int]], list[SamplingParams]], prompts: list[list[int]], eng: Any
                      ) -> tuple[list[RequestOutput], Any, int, str, dict[str, list[RequestOutput]]]:
    outs = eng.generate(*crowd, check=True)
    stats, peak = eng.stats(), eng.peak_in_flight
    return (outs, stats, peak, *_abort_in_flight(prompts, eng))


def test_overlap_stays_exact_under_preemption_chunking_prefix_hits_and_an_abort(tiny_models) -> None:
    """PP 2 with two steps in flight (one engine, to spawn its ranks once). The crowd: greedy tokens and every row
    equal transformers and one device, while the scheduler preempted only requests not in flight and a prefix hit
    was served from a step in flight. Then a request aborted in flight: its step comes back after its blocks were
    freed, its rows are dropped; the id's new request (its generator and output state new) and the others are
    exact."""
    path = tiny_models["llama"]
    crowd, prompts = _crowd(), [rand_ids(9, 30 + i) for i in range(4)]
    cfg = dict(CFG, num_kv_blocks=16)
    split = EngineConfig(model=str(path), pipeline_parallel_size=2, **cfg)
    (outs, stats, peak, rid, streams), _ = run_local(2, split, partial(_crowd_then_abort, crowd, prompts),
                                                     timeout_s=240)
    one = make_engine(path, **cfg)
    for ids, params, out, alone in zip(*crowd, outs, one.generate(*crowd), strict=True):
        if params.max_tokens:
            _check_greedy(path, ids, out, alone)
        else:
            _check_scoring(path, ids, params.logprob_start_len, params.top_logprobs_num, out, alone)
    assert peak == 2
    # req 3 matched the first block of req 2, whose first chunk went in the step still in flight when req 3's
    # step was scheduled (each step takes 3 of the 6).
    assert stats.preemptions > 0 and stats.prefix_cache_hit_tokens >= 4
    alone = one.generate(prompts, greedy(6))
    for i, ids in enumerate(prompts):
        out = merge_outputs(streams[f"r{i}"])
        assert out.finished
        if f"r{i}" == rid:  # the new request under the aborted one's id
            _check_scoring(path, prompts[0], 0, 0, out, one.generate([prompts[0]], scoring(0))[0])
        else:
            _check_greedy(path, ids, out, alone[i])


def test_stage_cut() -> None:
    assert stage_layers(2, 2) == [(0, 1), (1, 2)]
    assert stage_layers(7, 3) == [(0, 2), (2, 4), (4, 7)]  # the remainder on the last stages: stage 0 has the head
    with pytest.raises(ValueError, match="num_hidden_layers 2 is fewer than pipeline_parallel_size 3"):
        stage_layers(2, 3)


def test_a_later_stage_holds_its_layers_only() -> None:
    model, _ = load_model(family_path("qwen3-moe"), "float32", torch.device("cpu"))
    whole = model.kv_bytes_per_token()
    kept = model.model.layers[1:]
    cut_stage(model, 1, 2)
    assert list(model.model.layers) == list(kept)
    assert model.model.embed_tokens.weight.numel() == 0 and model.lm_head.weight.numel() == 0
    assert model.kv_bytes_per_token() * 3 == whole * 2
    assert len(model.make_kv_caches(8, torch.device("cpu"))) == 2


def test_what_stages_do_not_cover_is_refused_naming_the_field(tiny_models) -> None:
    with pytest.raises(ValueError, match="pipeline_parallel_size must be positive"):
        EngineConfig(pipeline_parallel_size=0)
    with pytest.raises(ValueError, match="batch_invariant is not available with pipeline_parallel_size > 1"):
        EngineConfig(batch_invariant=True, pipeline_parallel_size=2)
    with pytest.raises(ValueError, match="lora_adapters are not served with pipeline_parallel_size > 1"):
        EngineConfig(lora_adapters={"a": "/adapters/a"}, pipeline_parallel_size=2)
    model, _ = load_model(tiny_models["llama"], "float32", torch.device("cpu"))
    cfg: Any = EngineConfig(model=str(tiny_models["llama"]), pipeline_parallel_size=2)
    with pytest.raises(Exception, match="LoRA adapters are not served with pipeline_parallel_size 2"):
        LoraManager(model, cfg, torch.device("cpu")).register("a", "/adapters/a")
