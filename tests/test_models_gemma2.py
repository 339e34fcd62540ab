"""Gemma 2 (attention and final soft-caps, query_pre_attn_scalar, alternating sliding layers, (1 + w) norms, four
per layer, scaled embeddings, GeGLU, tied embeddings) against transformers' float32 eager forward."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.family_checks import (
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    family_path,
)


@pytest.mark.parametrize("patch", [{"attn_logit_softcapping": None}, {"final_logit_softcapping": None},
                                   {"layer_types": ["full_attention"] * 3}], ids=["attn-cap", "final-cap", "window"])
def test_each_feature_changes_the_scores(tmp_path: Path, patch: dict) -> None:
    check_feature_matters(family_path("gemma2"), tmp_path, patch)


def test_scoring_any_chunking() -> None:
    check_scoring_any_chunking(family_path("gemma2"))


def test_mixed_batch() -> None:
    check_mixed_batch(family_path("gemma2"))


def test_prefix_cache_past_the_window() -> None:
    """Includes cached rows that take the log-sum-exp shortcut: their one-token logit is capped too."""
    check_prefix_cache(family_path("gemma2"))


def test_greedy_equals_generate() -> None:
    check_greedy(family_path("gemma2"))


def test_batch_invariant_mode_refused_naming_the_fields() -> None:
    from tests.engine_helpers import make_engine

    with pytest.raises(ValueError, match="batch_invariant") as err:
        make_engine(family_path("gemma2"), batch_invariant=True)
    for field in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "gelu_pytorch_tanh"):
        assert field in str(err.value)
