"""Qwen3 dense (q/k norms, explicit head_dim, sliding layers by layer_types) against transformers; batch-invariant
mode on a Qwen3 without windows, and refused on one with them."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import hf_scores
from tests.engine_helpers import make_engine, rand_ids, scoring
from tests.family_checks import (
    ATOL,
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    family_path,
)


def test_window_changes_the_scores(tmp_path: Path) -> None:
    check_feature_matters(family_path("qwen3"), tmp_path, {"layer_types": ["full_attention"] * 2})


@pytest.mark.parametrize("family", ["qwen3", "qwen3-full"])
def test_scoring_any_chunking(family: str) -> None:
    check_scoring_any_chunking(family_path(family))


def test_mixed_batch() -> None:
    check_mixed_batch(family_path("qwen3"))


def test_prefix_cache_past_the_window() -> None:
    check_prefix_cache(family_path("qwen3"))


@pytest.mark.parametrize("family", ["qwen3", "qwen3-full"])
def test_greedy_equals_generate(family: str) -> None:
    check_greedy(family_path(family))


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
