"""Every family of tests/helpers/tiny_families.py through the engine's paths against transformers
(tests/helpers/families.py), and each family feature shown to matter: with it turned off in config.json,
transformers' own rows move."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers.families import (
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    family_path,
)
from tests.helpers.tiny_families import FAMILIES, PHI3_ORIGINAL_MAX

LOCAL_ROPE = {"rope_type": "default", "rope_theta": 10000.0}
PHI3_FLAT_SHORT = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
                   "original_max_position_embeddings": PHI3_ORIGINAL_MAX, "short_factor": [1.0] * 4,
                   "long_factor": [1.1, 2.0, 4.0, 8.0]}
# (family, config patch that turns one of its features off)
FEATURES: list[tuple[str, dict[str, Any]]] = [
    ("qwen2-window", {"layer_types": ["full_attention"] * 2}),
    ("qwen3", {"layer_types": ["full_attention"] * 2}),
    ("qwen3-moe-window", {"use_sliding_window": False}),
    ("mistral", {"sliding_window": None}),
    ("gemma2", {"attn_logit_softcapping": None}),
    ("gemma2", {"final_logit_softcapping": None}),
    ("gemma2", {"layer_types": ["full_attention"] * 3}),
    ("gemma3", {"layer_types": ["full_attention"] * 3}),
    ("gemma3", {"rope_parameters": {"sliding_attention": LOCAL_ROPE, "full_attention": LOCAL_ROPE}}),
    ("phi3", {"sliding_window": None}),
    ("phi3", {"rope_parameters": PHI3_FLAT_SHORT}),
]


@pytest.mark.parametrize(("family", "patch"), FEATURES, ids=[f"{f}-{next(iter(p))}" for f, p in FEATURES])
def test_feature_changes_the_scores(tmp_path: Path, family: str, patch: dict[str, Any]) -> None:
    check_feature_matters(family_path(family), tmp_path, patch)


@pytest.mark.parametrize("family", FAMILIES)
def test_scoring_any_chunking(family: str) -> None:
    check_scoring_any_chunking(family_path(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_mixed_batch(family: str) -> None:
    check_mixed_batch(family_path(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_prefix_cache_past_the_window(family: str) -> None:
    check_prefix_cache(family_path(family))


@pytest.mark.parametrize("family", FAMILIES)
def test_greedy_equals_generate(family: str) -> None:
    check_greedy(family_path(family))
