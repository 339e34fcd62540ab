"""Gemma 3 text (q/k norms, local and global RoPE parameters, five-to-one style sliding pattern by layer_types)
against transformers."""

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

LOCAL = {"rope_type": "default", "rope_theta": 10000.0}


@pytest.mark.parametrize("patch", [{"layer_types": ["full_attention"] * 3},
                                   {"rope_parameters": {"sliding_attention": LOCAL, "full_attention": LOCAL}}],
                         ids=["window", "global-rope"])
def test_each_feature_changes_the_scores(tmp_path: Path, patch: dict) -> None:
    check_feature_matters(family_path("gemma3"), tmp_path, patch)


def test_scoring_any_chunking() -> None:
    check_scoring_any_chunking(family_path("gemma3"))


def test_mixed_batch() -> None:
    check_mixed_batch(family_path("gemma3"))


def test_prefix_cache_past_the_window() -> None:
    check_prefix_cache(family_path("gemma3"))


def test_greedy_equals_generate() -> None:
    check_greedy(family_path("gemma3"))
