"""The row scorer on an in-process engine (what each Ray Data actor runs): shared contexts, all-or-nothing rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from offline.dataset_scorer import DatasetScorer, RowInput
from offline.plan import Windows, plan_windows
from tests.helpers.engine import make_engine
from tests.helpers.reference import hf_scores


@pytest.fixture(scope="module")
def engine(tiny_models: dict[str, Path]):
    return make_engine(tiny_models["llama"], enable_prefix_cache=True)


def test_continuations_of_one_context_share_it(engine) -> None:
    before = engine.stats().prefix_cache_hit_tokens
    ctx = "The quick brown fox jumps over the lazy dog. " * 3
    rows = [RowInput(f"id={i}", context=ctx, continuation=c) for i, c in enumerate([" yes", " no", " maybe"])]
    scorer = DatasetScorer(engine, None)
    results = scorer.score(rows)
    assert all(r.error is None and r.num_scored for r in results)
    # The context's full blocks (block_size 4; the last may hold continuation tokens) are computed once and
    # found by the two later continuations.
    full_blocks = len(scorer.tokenize(ctx)) // 4 - 1
    assert engine.stats().prefix_cache_hit_tokens - before >= 2 * 4 * full_blocks


def test_a_row_rejected_in_a_later_window_leaves_nothing_behind(engine, tiny_models: dict[str, Path]) -> None:
    good = list(range(2, 40))
    bad = list(range(2, 40))
    bad[30] = 10_000  # out of the vocabulary: the first two windows are queued, the third is rejected by the engine
    scorer = DatasetScorer(engine, Windows(16, 8))
    results = scorer.score([RowInput("id=0", ids=good), RowInput("id=1", ids=bad), RowInput("id=2", ids=good[:9])])
    assert results[1].error is not None and results[1].error.startswith("row id=1: Token id 10000 is out of range")
    assert results[1].token_logprobs is None
    assert results[0].num_scored == 37 and results[0].error is None
    assert max(abs(a - b) for a, b in zip(results[2].token_logprobs or [], hf_scores(tiny_models["llama"],
                                                                                    good[:9], 0), strict=True)) < 1e-4
    stats = engine.stats()
    assert stats.running == 0 and stats.waiting == 0 and stats.kv_blocks_used == 0


@pytest.mark.parametrize("row,message", [
    (RowInput("id=1", text=42), "the text must be a string, got int"),
    (RowInput("id=2", ids=["a", "b"]), "the ids must be a list of integers"),
    (RowInput("id=3", ids=[5, 6, 7], start=-1), "the start must be a non-negative integer, got -1"),
    (RowInput("id=4", text="a b c", start="x"), "the start must be a non-negative integer, got 'x'"),
    (RowInput("", context="The quick", continuation=3.5), "the continuation must be a string, got float"),
    (RowInput("", context="The quick", continuation=None), "the continuation is empty"),
])
def test_values_of_the_wrong_type_are_that_rows_error(engine, row: RowInput, message: str) -> None:
    good = RowInput("id=0", ids=[5, 6, 7, 8], start=1.0)  # a whole float start (CSV, pandas) is accepted
    results = DatasetScorer(engine, None).score([row, good])
    assert results[0].error is not None and message in results[0].error
    assert results[1].error is None and results[1].num_scored == 2


def test_temperature_option_scores_logits_over_t(engine, tiny_models: dict[str, Path]) -> None:
    """rayscore-batch --input-logprob-temperature: every value and top-k entry is log_softmax(logits / T)."""
    import torch

    from offline.cli import _parser, make_job
    from tests.helpers.reference import hf_logits

    ids = [5 + (7 * i) % 300 for i in range(30)]
    row = RowInput("id=0", ids=ids)
    cold = DatasetScorer(engine, None, top_k=3, temperature=0.7).score([row])[0]
    warm = DatasetScorer(engine, None, top_k=3, temperature=0.7).score([row])[0]
    lp = torch.log_softmax(hf_logits(tiny_models["llama"], ids) / 0.7, -1)
    want = lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])].tolist()
    for got in (cold, warm):
        assert max(abs(a - b) for a, b in zip(got.token_logprobs, want, strict=True)) <= 1e-4
        assert [t for _, t in got.top_logprobs[4]] == torch.topk(lp[4], 3).indices.tolist()
    t1 = DatasetScorer(engine, None).score([row])[0]  # the T = 1 values after the cache was warmed at 0.7
    assert t1.token_logprobs == pytest.approx(hf_scores(tiny_models["llama"], ids, 0), abs=1e-4)
    args = _parser().parse_args(["in.jsonl", "out", "--input-logprob-temperature", "0.7"])
    assert make_job(args).temperature == 0.7
    with pytest.raises(ValueError, match="input_logprob_temperature 0.0 must be finite and at least"):
        make_job(_parser().parse_args(["in.jsonl", "out", "--input-logprob-temperature", "0"]))


def test_per_token_candidate_ids_across_windows_and_pairs(engine, tiny_models: dict[str, Path]) -> None:
    """One candidate list per scored token (on-policy distillation), split across windows and on an lm-eval pair,
    each value equal to transformers'; a flat list applies to every token; a wrong count names both numbers."""
    import torch

    from tests.helpers.reference import hf_logits

    path = tiny_models["llama"]
    ids = list(range(2, 40))
    start = 3
    cands = [[(7 * p) % 300, (11 * p) % 300 + 1][: 1 + p % 2] for p in range(len(ids) - start - 1)]
    scorer = DatasetScorer(engine, Windows(16, 8))
    rows = [RowInput("id=0", ids=ids, start=start, token_ids=cands),
            RowInput("id=1", ids=ids[:12], start=0, token_ids=json.dumps([5, 9])),  # CSV: JSON text
            RowInput("id=2", ids=ids, start=start, token_ids=cands[:-1])]
    results = scorer.score(rows)
    # Windowed: each token is scored once, in its window, on that window's context: the reference is transformers
    # on the window's ids.
    got = results[0].token_ids_logprobs
    assert [[t for _, t in row] for row in got] == cands
    j = 0
    for begin, end, local in plan_windows(len(ids), start, Windows(16, 8)):
        wlp = torch.log_softmax(hf_logits(path, ids[begin:end]), -1)
        for q in range(local, end - begin - 1):
            assert all(abs(v - float(wlp[q, t])) <= 1e-4 for v, t in got[j])
            assert abs(results[0].token_logprobs[j] - float(wlp[q, ids[begin + q + 1]])) <= 1e-4
            j += 1
    assert j == len(cands)
    flat = results[1].token_ids_logprobs
    lp12 = torch.log_softmax(hf_logits(path, ids[:12]), -1)
    assert len(flat) == 11 and all(abs(v - float(lp12[p, t])) <= 1e-4 for p, row in enumerate(flat) for v, t in row)
    assert results[2].error == f"row id=2: The token ids have {len(cands) - 1} lists, one per scored token, but " \
                               f"{len(cands)} tokens are scored."
