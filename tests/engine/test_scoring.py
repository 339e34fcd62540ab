"""Scoring equals transformers' single full forward, whatever the chunking, batching or company."""

from __future__ import annotations

import pytest
import torch

from protocol.sampling import SamplingParams
from tests.helpers.engine import assert_rows, greedy, make_engine, rand_ids, scoring
from tests.helpers.reference import hf_logits, hf_scores

FAMILIES = ["llama", "llama-tied-llama3", "qwen2"]
ATOL = 1e-4


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("budget", [1, 3, 16, 64, 1000])
def test_scoring_alone_any_chunking(tiny_models, family: str, budget: int) -> None:
    path = tiny_models[family]
    eng = make_engine(path, max_num_batched_tokens=budget)
    ids = rand_ids(37, seed=budget)
    for start in (0, 17, len(ids) - 2):
        out = eng.generate([ids], scoring(start), check=True)[0]
        assert_rows(out.input_token_logprobs, ids, start, hf_scores(path, ids, start))
        assert out.new_token_ids == [] and out.completion_tokens == 0
        assert out.finish_reason.type == "length" and out.finished
        assert out.output_token_logprobs is None and out.output_top_logprobs is None
        assert out.input_top_logprobs is None
        assert out.prompt_tokens == len(ids)
        assert out.arrival_time and out.scheduled_time and out.finished_time
        assert out.arrival_time <= out.scheduled_time <= out.finished_time
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("budget", [3, 16, 1000])
def test_mixed_batch_each_gets_its_own_answer(tiny_models, family: str, budget: int) -> None:
    """Scoring requests of mixed lengths, N and k, and greedy generations share every step."""
    path = tiny_models[family]
    eng = make_engine(path, max_num_batched_tokens=budget, max_num_seqs=8)
    prompts = [rand_ids(n, seed=n) for n in (5, 29, 12, 41, 8, 20)]
    params = [scoring(0, k=3), greedy(6, k=2), scoring(6, k=0), scoring(39, k=5), greedy(4), scoring(3, k=1)]
    batched = eng.generate(prompts, params, check=True)
    for ids, p, out in zip(prompts, params, batched, strict=True):
        alone = eng.generate([ids], p)[0]
        if p.max_tokens == 0:
            assert_rows(out.input_token_logprobs, ids, p.logprob_start_len,
                        hf_scores(path, ids, p.logprob_start_len))
            if p.top_logprobs_num:
                lp = torch.log_softmax(hf_logits(path, ids), -1)
                for row, pos in zip(out.input_top_logprobs, range(p.logprob_start_len, len(ids) - 1), strict=True):
                    assert len(row) == p.top_logprobs_num  # each request its own k
                    v, i = torch.topk(lp[pos], p.top_logprobs_num)
                    assert [t for _, t in row] == i.tolist()
                    assert max(abs(a - b) for (a, _), b in zip(row, v.tolist(), strict=True)) <= ATOL
            else:
                assert out.input_top_logprobs is None
        else:
            assert out.new_token_ids == alone.new_token_ids
            assert out.input_token_logprobs is None
        assert out.new_token_ids == alone.new_token_ids
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks


def test_raw_logits_mode(tiny_models) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path, logprobs_mode="raw_logits", max_num_batched_tokens=7)
    ids = rand_ids(23, seed=5)
    out = eng.generate([ids], scoring(2, k=4), check=True)[0]
    logits = hf_logits(path, ids)
    exp = logits[torch.arange(2, 22), torch.tensor(ids[3:])].tolist()
    assert_rows(out.input_token_logprobs, ids, 2, exp)
    for row, pos in zip(out.input_top_logprobs, range(2, 22), strict=True):
        v, i = torch.topk(logits[pos], 4)
        assert [t for _, t in row] == i.tolist()
        assert max(abs(a - b) for (a, _), b in zip(row, v.tolist(), strict=True)) <= ATOL


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_matches_transformers_generate(tiny_models, family: str) -> None:
    from tests.helpers.reference import hf_model

    path = tiny_models[family]
    ref = hf_model(str(path))
    eng = make_engine(path, max_num_batched_tokens=5)
    prompts = [rand_ids(n, seed=100 + n) for n in (3, 11, 26)]
    batched = eng.generate(prompts, greedy(12, k=3), check=True)
    for ids, out in zip(prompts, batched, strict=True):
        with torch.inference_mode():
            g = ref.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False, min_new_tokens=12,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=1)
        assert out.new_token_ids == g.sequences[0, len(ids):].tolist()
        alone = eng.generate([ids], greedy(12, k=3))[0]
        assert alone.new_token_ids == out.new_token_ids
        for (v, t), step_logits, top in zip(out.output_token_logprobs, g.logits, out.output_top_logprobs, strict=True):
            lp = torch.log_softmax(step_logits[0].float(), -1)
            assert abs(v - lp[t].item()) <= ATOL
            assert [i for _, i in top] == torch.topk(lp, 3).indices.tolist()
        assert out.finish_reason.type == "length" and out.completion_tokens == 12


def test_scoring_and_generation_in_same_steps_equal_alone(tiny_models) -> None:
    path = tiny_models["qwen2"]
    eng = make_engine(path, max_num_batched_tokens=16)
    a, b = rand_ids(30, 1), rand_ids(9, 2)
    alone_s = eng.generate([a], scoring(0, k=2))[0]
    alone_g = eng.generate([b], greedy(8, k=2))[0]
    s, g = eng.generate([a, b], [scoring(0, k=2), greedy(8, k=2)], check=True)
    assert [t for _, t in s.input_token_logprobs] == [t for _, t in alone_s.input_token_logprobs]
    assert [v for v, _ in s.input_token_logprobs] == pytest.approx([v for v, _ in alone_s.input_token_logprobs],
                                                                   abs=ATOL)
    assert_rows(s.input_token_logprobs, a, 0, hf_scores(path, a, 0))
    assert g.new_token_ids == alone_g.new_token_ids
    assert [v for v, _ in g.output_token_logprobs] == pytest.approx([v for v, _ in alone_g.output_token_logprobs],
                                                                    abs=ATOL)


def test_preemption_small_cache_same_answers(tiny_models) -> None:
    """A KV cache too small to hold all requests at once: newest is preempted and recomputed; answers hold."""
    path = tiny_models["llama"]
    prompts = [rand_ids(n, seed=200 + n) for n in (30, 22, 35, 18)]
    params = [scoring(0, k=2), greedy(10), scoring(5), greedy(14, k=1)]
    roomy = make_engine(path, max_num_batched_tokens=64)
    expected = roomy.generate(prompts, params)
    tight = make_engine(path, num_kv_blocks=12, block_size=4, max_num_batched_tokens=16)  # 48 tokens of KV
    got = tight.generate(prompts, params, check=True)
    assert tight.stats().preemptions > 0  # the test exercises preemption
    for e, g in zip(expected, got, strict=True):
        assert g.new_token_ids == e.new_token_ids
        if e.input_token_logprobs is not None:
            assert [t for _, t in g.input_token_logprobs] == [t for _, t in e.input_token_logprobs]
            assert [v for v, _ in g.input_token_logprobs] == pytest.approx([v for v, _ in e.input_token_logprobs],
                                                                           abs=ATOL)
    assert tight.kv.pool.num_free == tight.kv.pool.num_blocks
    tight.check_integrity()


def test_abort_frees_everything(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"], max_num_batched_tokens=8)
    eng.add_request("a", rand_ids(40, 3), scoring(0))
    eng.add_request("b", rand_ids(10, 4), greedy(50))
    eng.add_request("c", rand_ids(10, 5), greedy(50))
    for _ in range(3):
        eng.step()
        eng.check_integrity()
    assert eng.kv.pool.num_used > 0
    for rid in ("a", "b", "c"):
        out = eng.abort_request(rid)
        assert out is not None and out.finished and out.finish_reason.type == "abort"
        eng.check_integrity()
    assert not eng.has_unfinished()
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks
    assert eng.abort_request("a") is None


def test_seed_gives_same_tokens_whatever_the_batch(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"])
    ids = rand_ids(12, 9)
    p = SamplingParams(max_tokens=10, temperature=0.9, top_p=0.95, top_k=50, seed=1234, ignore_eos=True)
    alone = eng.generate([ids], p)[0].new_token_ids
    others = [rand_ids(n, n) for n in (5, 17, 30)]
    noisy = eng.generate([*others, ids], [SamplingParams(max_tokens=8, temperature=1.0, ignore_eos=True)] * 3 + [p])
    assert noisy[-1].new_token_ids == alone
    other_seed = eng.generate([ids], SamplingParams(max_tokens=10, temperature=0.9, seed=99, ignore_eos=True))[0]
    assert other_seed.new_token_ids != alone  # 10 tokens over a 320 vocab: a collision would be astonishing


def test_stop_conditions(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"])
    ids = rand_ids(10, 11)
    free = eng.generate([ids], greedy(12, logprobs=False))[0]
    assert free.output_token_logprobs is None
    third = free.new_token_ids[2]
    out = eng.generate([ids], SamplingParams(max_tokens=12, temperature=0, stop_token_ids=[third]))[0]
    assert out.new_token_ids == free.new_token_ids[:3]
    assert out.finish_reason.type == "stop" and out.finish_reason.matched == third
    # Stop strings are the text side's (ingress/output/detokenizer.py, tests/ingress): the engine ignores them.
    s = eng.generate([ids], SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=["a", "e", " "]))[0]
    assert s.new_token_ids == free.new_token_ids
    assert s.finish_reason.type == "length"


def test_eos_stops_unless_ignored(tiny_models) -> None:
    eng = make_engine(tiny_models["llama"])
    ids = rand_ids(10, 12)
    free = eng.generate([ids], greedy(6, logprobs=False))[0]
    eng.eos_ids = {free.new_token_ids[1]}
    out = eng.generate([ids], SamplingParams(max_tokens=6, temperature=0))[0]
    assert out.new_token_ids == free.new_token_ids[:2] and out.finish_reason.type == "stop"
    ignored = eng.generate([ids], greedy(6, logprobs=False))[0]
    assert ignored.new_token_ids == free.new_token_ids


def test_rejects_bad_requests(tiny_models) -> None:
    from engine.llm_engine import RequestError

    eng = make_engine(tiny_models["llama"])
    for ids, p, msg in [
        ([1, 2, 999], scoring(0), "Token id 999 is out of range for the vocabulary size 320."),
        ([1, 2], scoring(1), "logprob_start_len(1) exceeds the last scorable source position for input_ids length(2)."),
        ([1, 2], SamplingParams(max_tokens=0), "The max_tokens 0 must be a positive integer."),
        ([1] * 500, greedy(100), "The prompt length 500 plus max_tokens 100 exceeds the model's context length 512."),
    ]:
        with pytest.raises(RequestError) as e:
            eng.add_request("x", ids, p)
        assert str(e.value) == msg
    assert not eng.has_unfinished()
