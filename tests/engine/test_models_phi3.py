"""Phi-3 beyond tests/engine/test_model_families.py: served up to original_max_position_embeddings, where
LongRoPE's short factors alone apply (engine/models/phi3.py)."""

from __future__ import annotations

import pytest

from engine.llm_engine import RequestError
from tests.helpers.engine import make_engine, rand_ids, scoring
from tests.helpers.families import family_path
from tests.helpers.tiny_families import PHI3_ORIGINAL_MAX


def test_longrope_served_up_to_the_original_length() -> None:
    path = family_path("phi3")
    eng = make_engine(path)
    assert eng.max_model_len == PHI3_ORIGINAL_MAX  # config max_position_embeddings is 512
    eng.generate([rand_ids(PHI3_ORIGINAL_MAX, seed=1)], scoring(0))
    with pytest.raises(RequestError, match="exceeds"):
        eng.generate([rand_ids(PHI3_ORIGINAL_MAX + 1, seed=1)], scoring(0))
    with pytest.raises(ValueError, match=f"max_model_len 200 exceeds the {PHI3_ORIGINAL_MAX} positions"):
        make_engine(path, max_model_len=200)
