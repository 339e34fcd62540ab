"""Phi-3 (fused qkv_proj / gate_up_proj in the checkpoint, partial rotary, LongRoPE, sliding_window) against
transformers; served up to original_max_position_embeddings, where LongRoPE's short factors alone apply."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.llm_engine import RequestError
from tests.engine_helpers import make_engine, rand_ids, scoring
from tests.family_checks import (
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    family_path,
)
from tests.tiny_families import PHI3_ORIGINAL_MAX

ROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": [1.1, 2.0, 4.0, 8.0],
        "original_max_position_embeddings": PHI3_ORIGINAL_MAX}


@pytest.mark.parametrize("patch", [{"sliding_window": None},
                                   {"rope_parameters": {**ROPE, "partial_rotary_factor": 0.5,
                                                        "short_factor": [1.0, 1.0, 1.0, 1.0]}}],
                         ids=["window", "short-factors"])
def test_each_feature_changes_the_scores(tmp_path: Path, patch: dict) -> None:
    check_feature_matters(family_path("phi3"), tmp_path, patch)


def test_scoring_any_chunking() -> None:
    check_scoring_any_chunking(family_path("phi3"))


def test_mixed_batch() -> None:
    check_mixed_batch(family_path("phi3"))


def test_prefix_cache_past_the_window() -> None:
    check_prefix_cache(family_path("phi3"))


def test_greedy_equals_generate() -> None:
    check_greedy(family_path("phi3"))


def test_longrope_served_up_to_the_original_length() -> None:
    path = family_path("phi3")
    eng = make_engine(path)
    assert eng.max_model_len == PHI3_ORIGINAL_MAX  # config max_position_embeddings is 512
    eng.generate([rand_ids(PHI3_ORIGINAL_MAX, seed=1)], scoring(0))
    with pytest.raises(RequestError, match="exceeds"):
        eng.generate([rand_ids(PHI3_ORIGINAL_MAX + 1, seed=1)], scoring(0))
    with pytest.raises(ValueError, match=f"max_model_len 200 exceeds the {PHI3_ORIGINAL_MAX} positions"):
        make_engine(path, max_model_len=200)
