"""Qwen3 beyond tests/engine/test_model_families.py: batch-invariant mode on a Qwen3 without windows (q/k norms are
RMSNorms, which the mode covers), refused on one with them."""

from __future__ import annotations

import pytest

from tests.helpers.engine import make_engine, rand_ids, scoring
from tests.helpers.families import ATOL, family_path
from tests.helpers.reference import hf_scores


def test_batch_invariant_mode_without_windows() -> None:
    """q/k norms are RMSNorms (row-wise, invariant): the mode covers Qwen3 without sliding layers. A request's
    rows have the same bits alone and beside others, and stay within ATOL of transformers."""
    path = family_path("qwen3-full")
    eng = make_engine(path, batch_invariant=True, max_num_batched_tokens=16)
    ids = rand_ids(37, seed=4)
    alone = eng.generate([ids], scoring(0))[0].input_token_logprobs
    others = [rand_ids(n, seed=n) for n in (9, 23)]
    mixed = eng.generate([others[0], ids, others[1]], [scoring(0)] * 3, check=True)[1].input_token_logprobs
    assert mixed == alone
    exp = hf_scores(path, ids, 0)
    assert max(abs(v - e) for (v, _), e in zip(alone, exp, strict=True)) <= ATOL


def test_batch_invariant_mode_refuses_windows() -> None:
    with pytest.raises(ValueError, match=r"batch_invariant .*Qwen3ForCausalLM.*sliding_window"):
        make_engine(family_path("qwen3"), batch_invariant=True)
