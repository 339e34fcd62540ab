"""Gemma 2 beyond tests/engine/test_model_families.py: batch-invariant mode refused, naming every feature it lacks."""

from __future__ import annotations

import pytest

from tests.helpers.engine import make_engine
from tests.helpers.families import family_path


def test_batch_invariant_mode_refused_naming_the_fields() -> None:
    with pytest.raises(ValueError, match="batch_invariant is not available for Gemma2ForCausalLM") as err:
        make_engine(family_path("gemma2"), batch_invariant=True)
    for field in ("attn_logit_softcapping", "final_logit_softcapping", "sliding_window", "gelu_pytorch_tanh"):
        assert field in str(err.value)
