"""Qwen3-MoE beyond tests/engine/test_model_families.py: the block's batched dispatch against transformers'
Qwen3MoeSparseMoeBlock alone (with and without norm_topk_prob), the base block's shared expert and its sigmoid gate
against Qwen2MoeSparseMoeBlock, sparse layers where decoder_sparse_step and mlp_only_layers put them,
batch-invariant mode refused."""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen3MoeConfig
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

from engine.layers.moe import SparseMoeBlock
from engine.loading.loader import load_model
from engine.models.llama import MLP
from tests.helpers.engine import make_engine
from tests.helpers.families import family_path


@pytest.mark.parametrize("norm", [True, False])
def test_block_equals_transformers(norm: bool) -> None:
    cfg = Qwen3MoeConfig(hidden_size=32, moe_intermediate_size=16, num_experts=6, num_experts_per_tok=3,
                         norm_topk_prob=norm)
    torch.manual_seed(0)
    ref = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
    ours = SparseMoeBlock(cfg)
    with torch.no_grad():
        ours.gate.weight.copy_(ref.gate.weight)
        width = cfg.moe_intermediate_size
        for e, expert in enumerate(ours.experts):
            expert.gate_proj.weight.copy_(ref.experts.gate_up_proj[e, :width])
            expert.up_proj.weight.copy_(ref.experts.gate_up_proj[e, width:])
            expert.down_proj.weight.copy_(ref.experts.down_proj[e])
    ours.fuse()
    x = torch.randn(57, 32)
    with torch.inference_mode():
        want = ref(x[None])[0]
        got = ours(x)
    hit = torch.topk(torch.softmax(x @ ref.gate.weight.T, -1), 3).indices.unique()
    assert len(hit) == 6  # every expert has rows: the dispatch's grouping is exercised
    assert (got - want).abs().max().item() <= 1e-5


def test_shared_expert_with_gate_equals_transformers() -> None:
    """The shared expert (a dense MLP) scaled by sigmoid(shared_expert_gate(x)), added to the routed sum."""
    cfg = Qwen2MoeConfig(hidden_size=32, moe_intermediate_size=16, shared_expert_intermediate_size=24, num_experts=5,
                         num_experts_per_tok=2, norm_topk_prob=False)
    torch.manual_seed(1)
    ref = Qwen2MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.3)
    ours = SparseMoeBlock(cfg, stacked=True, norm_topk_prob=False, shared_expert=MLP(cfg, 24), shared_gate=True)
    ours.load_state_dict(ref.state_dict(), strict=True, assign=True)  # the same names as ours
    ours.fuse()
    x = torch.randn(23, 32)
    with torch.inference_mode():
        want = ref(x[None])[0]
        got = ours(x)
    assert (got - want).abs().max().item() <= 1e-5


def test_layers_sparse_where_the_config_says() -> None:
    model, _ = load_model(family_path("qwen3-moe"), "float32", torch.device("cpu"))
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in model.model.layers] == [True, False, True]
    model, _ = load_model(family_path("qwen3-moe-window"), "float32", torch.device("cpu"))
    assert [isinstance(layer.mlp, SparseMoeBlock) for layer in model.model.layers] == [False, True, False]
    assert {layer.self_attn.sliding_window for layer in model.model.layers} == {7}


def test_batch_invariant_mode_refused() -> None:
    with pytest.raises(ValueError, match=r"batch_invariant .*mixture-of-experts.*num_experts"):
        make_engine(family_path("qwen3-moe"), batch_invariant=True)
