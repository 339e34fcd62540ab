"""vLLM's prompt-logprob ranks (return_input_ranks) and its processed_logprobs mode.

A rank is how many vocabulary entries have a value >= the scored token's own (vLLM's count: 1 = most likely), taken
over the row at the request's input temperature; it must hold cold, warm (a cached row that would otherwise take the
log-sum-exp shortcut) and through the vocab-parallel head. processed_logprobs: generated tokens' logprobs are
log_softmax(logits / T) of the logits the token was drawn from."""

from __future__ import annotations

import torch

from protocol.sampling import SamplingParams
from tests.helpers.engine import make_engine, rand_ids
from tests.helpers.reference import hf_logits
from tests.helpers.tp import run_split

ATOL = 1e-4


def ranked(start: int, temp: float | None = None, k: int = 0) -> SamplingParams:
    return SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=start, top_logprobs_num=k,
                          input_logprob_temperature=temp, return_input_ranks=True)


def want_ranks(path, ids: list[int], start: int, temp: float) -> list[int]:  # noqa: ANN001
    lp = torch.log_softmax(hf_logits(path, ids) / temp, dim=-1)
    pos = torch.arange(start, len(ids) - 1)
    own = lp[pos, torch.tensor(ids[start + 1:])]
    return (lp[pos] >= own[:, None]).sum(dim=1).tolist()


def test_ranks_cold_warm_and_at_a_temperature(tiny_models) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path, enable_prefix_cache=True, max_num_batched_tokens=16)
    ids = rand_ids(33, seed=21)
    cases = [ranked(0), ranked(3, 0.7, k=5), ranked(0, k=2)]
    for _ in range(2):  # cold, then warm: every row cached, a T = 1 row without top-k would take the shortcut
        outs = eng.generate([ids] * len(cases), cases, check=True)
        for p, out in zip(cases, outs, strict=True):
            assert out.input_token_ranks == want_ranks(path, ids, p.logprob_start_len, p.score_temperature)
            assert all(r >= 1 for r in out.input_token_ranks)
    # Not asked: None, and a request that asks nothing else still has none.
    (plain,) = eng.generate([ids], [SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0)])
    assert plain.input_token_ranks is None


def test_rank_of_a_token_inside_its_top_k_is_its_place(tiny_models) -> None:
    path = tiny_models["llama"]
    eng = make_engine(path)
    ids = rand_ids(20, seed=5)
    (out,) = eng.generate([ids], [ranked(0, k=50)])
    for (_, t), top, rank in zip(out.input_token_logprobs, out.input_top_logprobs, out.input_token_ranks,
                                 strict=True):
        place = [i for _, i in top].index(t) + 1 if t in [i for _, i in top] else None
        if place is not None:
            assert rank == place
        else:
            assert rank > 50


def test_ranks_through_the_vocab_parallel_head(tiny_models) -> None:
    path = tiny_models["llama"]
    ids = rand_ids(25, seed=9)
    cfg = dict(max_num_batched_tokens=16, num_kv_blocks=128, block_size=4, score_rows_per_block=8,
               enable_prefix_cache=True)
    split = run_split(2, dict(model=str(path), **cfg), [([ids], [ranked(0, 0.7, k=3)]), ([ids], [ranked(1)])])
    (first,), (second,) = split.outputs
    assert first.input_token_ranks == want_ranks(path, ids, 0, 0.7)
    assert second.input_token_ranks == want_ranks(path, ids, 1, 1.0)


def test_processed_logprobs_mode_scales_generated_tokens(tiny_models) -> None:
    """Greedy decoding is the same token at any temperature only when T = 0; here T = 0.5 with a seed, and the
    logprob of each drawn token is checked against transformers' logits / T over the generated context."""
    path = tiny_models["llama"]
    eng = make_engine(path, logprobs_mode="processed_logprobs")
    prompt = rand_ids(9, seed=2)
    p = SamplingParams(max_tokens=4, temperature=0.5, seed=7, return_logprob=True, top_logprobs_num=3)
    (out,) = eng.generate([prompt], [p])
    full = prompt + [t for _, t in out.output_token_logprobs]
    lp = torch.log_softmax(hf_logits(path, full) / 0.5, dim=-1)
    for j, ((v, t), top) in enumerate(zip(out.output_token_logprobs, out.output_top_logprobs, strict=True)):
        row = lp[len(prompt) - 1 + j]
        assert abs(v - row[t].item()) <= ATOL
        assert [i for _, i in top] == torch.topk(row, 3).indices.tolist()
    # raw_logprobs: the same draw's values are at T = 1.
    (raw,) = make_engine(path).generate([prompt], [p])
    assert [t for _, t in raw.output_token_logprobs] == [t for _, t in out.output_token_logprobs]
    lp1 = torch.log_softmax(hf_logits(path, full), dim=-1)
    assert abs(raw.output_token_logprobs[0][0] - lp1[len(prompt) - 1, full[len(prompt)]].item()) <= ATOL
