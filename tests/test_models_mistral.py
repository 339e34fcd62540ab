"""Mistral (sliding_window on every layer, explicit head_dim) against transformers."""

from __future__ import annotations

from pathlib import Path

from tests.family_checks import (
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    family_models,  # noqa: F401 (fixture)
)


def test_window_changes_the_scores(family_models: dict[str, Path], tmp_path: Path) -> None:
    check_feature_matters(family_models["mistral"], tmp_path, {"sliding_window": None})


def test_scoring_any_chunking(family_models: dict[str, Path]) -> None:
    check_scoring_any_chunking(family_models["mistral"])


def test_mixed_batch(family_models: dict[str, Path]) -> None:
    check_mixed_batch(family_models["mistral"])


def test_prefix_cache_past_the_window(family_models: dict[str, Path]) -> None:
    check_prefix_cache(family_models["mistral"])


def test_greedy_equals_generate(family_models: dict[str, Path]) -> None:
    check_greedy(family_models["mistral"])
