"""Mistral (sliding_window on every layer, explicit head_dim) against transformers."""

from __future__ import annotations

from pathlib import Path

from tests.family_checks import (
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    family_path,
)


def test_window_changes_the_scores(tmp_path: Path) -> None:
    check_feature_matters(family_path("mistral"), tmp_path, {"sliding_window": None})


def test_scoring_any_chunking() -> None:
    check_scoring_any_chunking(family_path("mistral"))


def test_mixed_batch() -> None:
    check_mixed_batch(family_path("mistral"))


def test_prefix_cache_past_the_window() -> None:
    check_prefix_cache(family_path("mistral"))


def test_greedy_equals_generate() -> None:
    check_greedy(family_path("mistral"))
