"""Qwen3-VL-MoE beyond tests/engine/test_models_vision.py (which holds it to transformers like the other
vision-language families): sparse layers where decoder_sparse_step and mlp_only_layers put them, the router's
top-k weights renormalised whatever the config says, the hub's transposed expert stacks loading to the same rows, and
a weight update reaching the experts (and Qwen3-MoE's, which share the block)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from engine.layers.moe import SparseMoeBlock
from engine.loading.loader import load_model
from engine.loading.weight_update import apply_weights, stage_weights
from tests.engine.test_models_vision import ATOL, _diff, _prompt, vlm_path
from tests.helpers.engine import assert_rows, make_engine, rand_ids, scoring
from tests.helpers.families import family_path
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_vision import build_tiny_vlm
from tests.helpers.vision_reference import vl_scores

FAMILY = "qwen3_vl_moe"


def test_sparse_layers_and_router() -> None:
    model, _ = load_model(vlm_path(FAMILY), "float32", torch.device("cpu"))
    mlps = [layer.mlp for layer in model.model.layers]
    assert [isinstance(m, SparseMoeBlock) for m in mlps] == [True, False, True]  # mlp_only_layers=[1]
    assert all(m.norm_topk_prob and m.num_experts == 6 and m.top_k == 2 for m in (mlps[0], mlps[2]))
    # The stacks stay parameters (what a weight update copies into), in transformers' layout.
    names = dict(model.named_parameters())
    assert names["model.layers.0.mlp.gate_up"].shape == (6, 48, 64)
    assert names["model.layers.2.mlp.down"].shape == (6, 64, 24)


def test_renormalised_top_k_matters() -> None:
    """Without the renormalisation transformers' Qwen3-VL-MoE router always applies, the rows move past 1e-4:
    the equality in test_models_vision.py would catch a router that read a missing norm_topk_prob as off."""
    path = vlm_path(FAMILY)
    ids, images = _prompt(FAMILY, ((150, 100),), [7])
    eng = make_engine(path, max_num_batched_tokens=1000)
    want = vl_scores(path, ids, images, 0)
    assert _diff(eng.generate([ids], scoring(0), images=[images])[0].input_token_logprobs, ids, 0, want) <= ATOL
    for layer in eng.model.model.layers:
        if isinstance(layer.mlp, SparseMoeBlock):
            layer.mlp.norm_topk_prob = False
    assert _diff(eng.generate([ids], scoring(0), images=[images])[0].input_token_logprobs, ids, 0, want) > 1e-2


def _transposed_copy(src: Path, dst: Path) -> Path:
    """src with its expert stacks stored as the hub's Qwen3-VL-MoE checkpoints hold them: [E, hidden, 2 x width]
    and [E, width, hidden]."""
    shutil.copytree(src, dst)
    weights = load_file(str(dst / "model.safetensors"))
    for name in weights:
        if name.endswith(("mlp.experts.gate_up_proj", "mlp.experts.down_proj")):
            weights[name] = weights[name].transpose(1, 2).contiguous()
    save_file(weights, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_hub_layout_loads_to_the_same_rows(tmp_path: Path) -> None:
    path = vlm_path(FAMILY)
    hub = _transposed_copy(path, tmp_path / "hub")
    ids, images = _prompt(FAMILY, ((100, 130),), [4], seed=3)
    want = vl_scores(path, ids, images, 0)  # transformers on its own layout
    out = make_engine(hub, max_num_batched_tokens=9).generate([ids], scoring(0), check=True, images=[images])[0]
    assert _diff(out.input_token_logprobs, ids, 0, want) <= ATOL
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(hub, ids, images, 0)) <= ATOL  # and on the hub's


def test_weight_update_reaches_the_experts(tmp_path: Path) -> None:
    """Another seed's checkpoint of the same config: after the update every row is the new checkpoint's."""
    path = vlm_path(FAMILY)
    new = build_tiny_vlm(tmp_path / "new", FAMILY, seed=99)
    assert json.loads((new / "config.json").read_text()) == json.loads((path / "config.json").read_text())
    ids, images = _prompt(FAMILY, ((150, 100),), [7])
    eng = make_engine(path, max_num_batched_tokens=1000)
    apply_weights(eng, stage_weights(eng, str(new)), "v2")
    out = eng.generate([ids], scoring(0), images=[images])[0]
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(new, ids, images, 0)) <= ATOL


def test_tied_embeddings(tmp_path: Path) -> None:
    path = build_tiny_vlm(tmp_path / "tied", FAMILY, seed=5, tie=True)
    ids, images = _prompt(FAMILY, ((150, 100),), [7])
    out = make_engine(path, max_num_batched_tokens=8).generate([ids], scoring(0), images=[images])[0]
    assert _diff(out.input_token_logprobs, ids, 0, vl_scores(path, ids, images, 0)) <= ATOL


def test_weight_update_reaches_qwen3_moe_experts(tmp_path: Path) -> None:
    """The text family's experts, stacked by fuse(), are parameters too: an update that changes only the experts
    serves the new rows (they were plain tensors, which the update's copy by parameter name passed over)."""
    src = family_path("qwen3-moe")
    new = tmp_path / "new"
    shutil.copytree(src, new)
    weights = load_file(str(new / "model.safetensors"))
    for name in weights:
        if ".mlp.experts." in name:
            weights[name] = weights[name].flip(0).contiguous()
    save_file(weights, str(new / "model.safetensors"), metadata={"format": "pt"})
    ids = rand_ids(30, seed=4)
    eng = make_engine(src, max_num_batched_tokens=1000)
    apply_weights(eng, stage_weights(eng, str(new)), "v2")
    out = eng.generate([ids], scoring(0), check=True)[0]
    assert_rows(out.input_token_logprobs, ids, 0, hf_scores(new, ids, 0))
    assert max(abs(a - b) for a, b in zip(hf_scores(new, ids, 0), hf_scores(src, ids, 0), strict=True)) > 1e-2
