"""Config fields the engine does not implement are refused when the model loads, naming the field: never served
approximately."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from engine.loading.loader import load_model
from tests.helpers.families import family_path


def _patched(family: str, tmp: Path, patch: dict[str, Any]) -> Path:
    folder = tmp / family
    shutil.copytree(family_path(family), folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(patch)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


@pytest.mark.parametrize(("family", "patch", "field"), [
    ("mistral", {"rope_parameters": {"rope_type": "ntk-by-parts", "rope_theta": 10000.0}}, "rope_parameters"),
    # In transformers' table, but its frequencies belong to another family's layout.
    ("qwen3", {"rope_parameters": {"rope_type": "proportional", "rope_theta": 10000.0}}, "rope_parameters"),
    ("qwen3", {"layer_types": ["chunked_attention", "full_attention"]}, r"layer_types\[0\]"),
    ("gemma3", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
])
def test_unimplemented_field_refused_at_load(tmp_path: Path, family: str, patch: dict[str, Any],
                                             field: str) -> None:
    with pytest.raises(ValueError, match=field):
        load_model(_patched(family, tmp_path, patch), "float32", torch.device("cpu"))


def test_dynamic_rope_capped_at_max_position_embeddings(tmp_path: Path) -> None:
    """transformers recomputes "dynamic" frequencies past max_position_embeddings (512 here) from the forward's
    length; the engine serves up to it and refuses a larger max_model_len at start."""
    from tests.helpers.engine import make_engine

    path = _patched("qwen3", tmp_path, {"rope_parameters": {"rope_type": "dynamic", "factor": 2.0,
                                                            "rope_theta": 10000.0}})
    assert make_engine(path).max_model_len == 512
    with pytest.raises(ValueError, match="max_model_len 1024 exceeds the 512 positions"):
        make_engine(path, max_model_len=1024)


def test_llama_unknown_rope_type_refused_naming_the_field(tmp_path: Path) -> None:
    from tests.helpers.tiny_models import build_tiny_model

    folder = build_tiny_model(tmp_path / "llama", "llama")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["rope_parameters"] = {"rope_type": "ntk-by-parts", "rope_theta": 10000.0}
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="rope_parameters"):
        load_model(folder, "float32", torch.device("cpu"))
