"""The checks every model family passes against transformers' float32 forward and generate, on the tiny
checkpoints of tests/helpers/tiny_families.py: prompts longer than the sliding window, chunk budgets smaller than it,
mixed batches with top-k, prefix-cache hits past the window (hidden-state store on and off), greedy generation
(batched decode). Each returns the largest |engine - transformers| it saw, and asserts it is within ATOL."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

import torch

from tests.helpers.engine import greedy, make_engine, rand_ids, scoring
from tests.helpers.reference import hf_logits, hf_model, hf_scores
from tests.helpers.tiny_families import FAMILIES, WINDOW, build_family

ATOL = 1e-4


@cache
def family_path(family: str) -> Path:
    """The family's tiny checkpoint, built on first use in this process (seeded by its place in FAMILIES)."""
    root = Path(tempfile.mkdtemp(prefix=f"rayscore-{family}-"))
    atexit.register(shutil.rmtree, root, True)
    return build_family(root / family, family, seed=10 + FAMILIES.index(family))


def _rows_diff(got: list, ids: list[int], start: int, expected: list[float]) -> float:
    assert [t for _, t in got] == ids[start + 1:], "rows must align to input_ids[N+1:]"
    diff = max(abs(v - e) for (v, _), e in zip(got, expected, strict=True))
    assert diff <= ATOL, diff
    return diff


def _top_diff(rows: list, logprobs: torch.Tensor, positions: range, k: int) -> float:
    diff = 0.0
    for row, pos in zip(rows, positions, strict=True):
        v, i = torch.topk(logprobs[pos], k)
        assert [t for _, t in row] == i.tolist()
        diff = max(diff, max(abs(a - b) for (a, _), b in zip(row, v.tolist(), strict=True)))
    assert diff <= ATOL, diff
    return diff


def check_scoring_any_chunking(path: Path, budgets: tuple[int, ...] = (1, 3, 5, 16, 1000)) -> float:
    """One 37-token prompt (5 windows) scored from 0, 17 and its end, with step budgets below and above the
    window, alone in the engine."""
    worst = 0.0
    ids = rand_ids(37, seed=4)
    for budget in budgets:
        eng = make_engine(path, max_num_batched_tokens=budget)
        for start in (0, 17, len(ids) - 2):
            out = eng.generate([ids], scoring(start), check=True)[0]
            worst = max(worst, _rows_diff(out.input_token_logprobs, ids, start, hf_scores(path, ids, start)))
        assert eng.kv.pool.num_free == eng.kv.pool.num_blocks
    return worst


def check_mixed_batch(path: Path, budgets: tuple[int, ...] = (3, 16)) -> float:
    """Scoring (with top-k) and greedy requests of mixed lengths share every step."""
    worst = 0.0
    prompts = [rand_ids(n, seed=n) for n in (5, 29, 12, 41, 8, 20)]
    params = [scoring(0, k=3), greedy(6, k=2), scoring(6, k=0), scoring(30, k=5), greedy(4), scoring(3, k=1)]
    for budget in budgets:
        eng = make_engine(path, max_num_batched_tokens=budget, max_num_seqs=8)
        outs = eng.generate(prompts, params, check=True)
        for ids, p, out in zip(prompts, params, outs, strict=True):
            if p.max_tokens == 0:
                n = p.logprob_start_len
                worst = max(worst, _rows_diff(out.input_token_logprobs, ids, n, hf_scores(path, ids, n)))
                if p.top_logprobs_num:
                    lp = torch.log_softmax(hf_logits(path, ids), -1)
                    worst = max(worst, _top_diff(out.input_top_logprobs, lp, range(n, len(ids) - 1),
                                                 p.top_logprobs_num))
            else:
                assert out.new_token_ids == eng.generate([ids], p)[0].new_token_ids
    return worst


def check_prefix_cache(path: Path) -> float:
    """Contexts of 22 tokens (three windows) shared by three endings each: cold, then warm. Warm rows read
    blocks past the window from the cache, and (store on) their hidden states from the store."""
    worst = 0.0
    cases: list[tuple[list[int], int]] = []
    for c in range(2):
        ctx = rand_ids(22, seed=300 + c)
        for e in range(3):
            ids = ctx + rand_ids(6, seed=400 + 10 * c + e)
            cases.append((ids, 21 if e else 0))
    ks = [2 if i % 2 == 0 else 0 for i in range(len(cases))]
    for cfg in (dict(), dict(hidden_state_store=False), dict(num_kv_blocks=14)):
        eng = make_engine(path, max_num_batched_tokens=16, enable_prefix_cache=True, **cfg)  # type: ignore[arg-type]
        for round_ in range(2):
            outs = eng.generate([ids for ids, _ in cases],
                                [scoring(n, k=k) for (_, n), k in zip(cases, ks, strict=True)], check=True)
            for (ids, n), out, k in zip(cases, outs, ks, strict=True):
                worst = max(worst, _rows_diff(out.input_token_logprobs, ids, n, hf_scores(path, ids, n)))
                if k:
                    lp = torch.log_softmax(hf_logits(path, ids), -1)
                    worst = max(worst, _top_diff(out.input_top_logprobs, lp, range(n, len(ids) - 1), k))
            if round_ == 1 and "num_kv_blocks" not in cfg:
                assert sum(o.cached_tokens for o in outs) > WINDOW, cfg  # hits reach past the window
        assert eng.stats().prefix_cache_hit_tokens > 0
        assert eng.kv.pool.num_free == eng.kv.pool.num_blocks
    return worst


def check_greedy(path: Path, new_tokens: int = 12) -> float:
    """Three prompts decoded together (the batched decode call) past the window; tokens equal transformers'
    generate, logprobs within ATOL of its per-step logits, top-3 ids equal."""
    worst = 0.0
    ref = hf_model(str(path))
    eng = make_engine(path, max_num_batched_tokens=5)
    prompts = [rand_ids(n, seed=100 + n) for n in (3, 11, 26)]
    outs = eng.generate(prompts, greedy(new_tokens, k=3), check=True)
    for ids, out in zip(prompts, outs, strict=True):
        with torch.inference_mode():
            g = hf_generate(ref, ids, new_tokens)
        assert out.new_token_ids == g.sequences[0, len(ids):].tolist()
        for (v, t), step, top in zip(out.output_token_logprobs, g.logits, out.output_top_logprobs, strict=True):
            lp = torch.log_softmax(step[0].float(), -1)
            worst = max(worst, abs(v - lp[t].item()))
            assert [i for _, i in top] == torch.topk(lp, 3).indices.tolist()
    assert worst <= ATOL, worst
    return worst


def hf_generate(ref: Any, ids: list[int], new_tokens: int) -> Any:
    """transformers' greedy generate of exactly new_tokens, as the engine's ignore_eos: an EOS id no row can produce
    (the vocabulary size), since min_new_tokens would instead mask the real EOS out of the logits, and these random
    models often rank it first."""
    return ref.generate(torch.tensor([ids]), max_new_tokens=new_tokens, do_sample=False, output_logits=True,
                        return_dict_in_generate=True, pad_token_id=1, eos_token_id=ref.config.vocab_size)


def check_feature_matters(path: Path, tmp: Path, patch: dict[str, Any], min_diff: float = 1e-2) -> None:
    """The same weights with `patch` applied to config.json (a feature turned off) score the test prompt at least
    min_diff apart in transformers: the checks above would fail if the engine ignored that feature."""
    other = tmp / f"{path.name}-off"
    shutil.copytree(path, other)
    cfg = json.loads((other / "config.json").read_text())
    cfg.update(patch)
    (other / "config.json").write_text(json.dumps(cfg))
    ids = rand_ids(37, seed=4)
    a, b = hf_scores(path, ids, 0), hf_scores(other, ids, 0)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) >= min_diff, patch
