"""DeepSeek-V3 (tests/helpers/tiny_deepseek_v3.py's two variants) against transformers' float32 uncached forward:
the shared family checks (any chunking and start, mixed batches with top-k, prefix hits and shared prefixes with
the hidden-state store on and off, batched greedy equal to generate) on the torch path and on the varlen path; the
MoE block alone against transformers' DeepseekV3MoE; the latent cache's layout and size; each feature shown to move
transformers' rows; the refusals."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE as HFDeepseekV3MoE

from engine.layers.attention import VarlenPagedAttention
from engine.layers.mla import MultiHeadLatentAttention
from engine.loading.loader import load_model
from engine.loading.lora import LoraError
from engine.models.deepseek_v3 import DeepseekV3MoE
from engine.parallel.shard import refusals
from protocol.sampling import AdapterRef, SamplingParams
from tests.helpers import engine as engine_helpers
from tests.helpers.engine import assert_rows, make_engine, rand_ids
from tests.helpers.families import (
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
)
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_adapters import build_adapter, peft_scores
from tests.helpers.tiny_deepseek_v3 import VARIANTS, config, dsv3_path

VARIANT_NAMES = list(VARIANTS)


# dsv3: q_lora_rank set, interleaved rotary, YaRN; dsv3-plain-q: q_proj, rotate-half rotary, default RoPE, raw top-k.
# The costlier checks run on one variant each: the MLA and MoE code they cross is the same.
@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_scoring_any_chunking(variant: str) -> None:
    check_scoring_any_chunking(dsv3_path(variant), budgets=(3, 1000))


def test_mixed_batch() -> None:
    check_mixed_batch(dsv3_path("dsv3-plain-q"))


def test_prefix_cache_and_shared_prefix() -> None:
    check_prefix_cache(dsv3_path("dsv3"))


def test_greedy_equals_generate() -> None:
    check_greedy(dsv3_path("dsv3"))


def test_varlen_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The latent through the one-call-per-layer varlen backend (the reference kernel on CPU): chunked prefill
    reading cached blocks, then batched decode."""
    monkeypatch.setitem(engine_helpers.DEFAULTS, "attention_backend", "varlen")
    assert isinstance(make_engine(dsv3_path("dsv3")).runner.backend, VarlenPagedAttention)
    check_scoring_any_chunking(dsv3_path("dsv3"), budgets=(3,))
    check_greedy(dsv3_path("dsv3"), new_tokens=6)


def test_latent_cache_layout() -> None:
    """One [slots, 1, kv_lora_rank + qk_rope_head_dim] tensor per layer, K and V the same tensor; its bytes per
    token against the per-head K/V an MHA cache of the same heads would hold."""
    model, cfg = load_model(dsv3_path("dsv3"), "float32", torch.device("cpu"))
    assert all(isinstance(layer.self_attn, MultiHeadLatentAttention) for layer in model.model.layers)
    caches = model.make_kv_caches(12, torch.device("cpu"))
    assert len(caches) == 3 and all(k is v and k.shape == (12, 1, 32 + 8) for k, v in caches)
    assert model.kv_bytes_per_token() == 3 * (32 + 8) * 4
    mha = 3 * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * 4
    assert mha / model.kv_bytes_per_token() == 3.6


@pytest.mark.parametrize("variant", VARIANT_NAMES)
def test_moe_block_equals_transformers(variant: str) -> None:
    """Group-limited sigmoid routing with the correction bias, norm_topk_prob on (dsv3) and off, the routed scale,
    the shared expert."""
    cfg = config(variant)
    torch.manual_seed(0)
    ref = HFDeepseekV3MoE(cfg)
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_(0, 0.5)
        ref.gate.e_score_correction_bias.normal_(0, 0.1)
    ours = DeepseekV3MoE(cfg)
    w = cfg.moe_intermediate_size
    with torch.no_grad():
        ours.gate.weight.copy_(ref.gate.weight)
        ours.gate.e_score_correction_bias.copy_(ref.gate.e_score_correction_bias)
        for e, expert in enumerate(ours.experts):
            expert.gate_proj.weight.copy_(ref.experts.gate_up_proj[e, :w])
            expert.up_proj.weight.copy_(ref.experts.gate_up_proj[e, w:])
            expert.down_proj.weight.copy_(ref.experts.down_proj[e])
        for name in ("gate_proj", "up_proj", "down_proj"):
            getattr(ours.shared_expert, name).weight.copy_(getattr(ref.shared_experts, name).weight)
    ours.fuse()
    x = torch.randn(97, cfg.hidden_size)
    with torch.inference_mode():
        want = ref(x[None])[0]
        got = ours(x)
        _, ids = ours.route(x)
    per_group = cfg.n_routed_experts // cfg.n_group
    assert (ids // per_group == ids[:, :1] // per_group).all()  # topk_group 1: one group per token
    assert len(ids.unique()) == cfg.n_routed_experts  # every expert and both groups are used
    assert (got - want).abs().max().item() <= 1e-5


def test_correction_bias_matters(tmp_path: Path) -> None:
    """With e_score_correction_bias zeroed in the checkpoint, transformers' rows move (it steers the choice)."""
    other = tmp_path / "no-bias"
    shutil.copytree(dsv3_path("dsv3"), other)
    state = load_file(str(other / "model.safetensors"))
    state = {k: torch.zeros_like(v) if k.endswith("e_score_correction_bias") else v for k, v in state.items()}
    save_file(state, str(other / "model.safetensors"), metadata={"format": "pt"})
    ids = rand_ids(37, seed=4)
    a, b = hf_scores(dsv3_path("dsv3"), ids, 0), hf_scores(other, ids, 0)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) >= 1e-2


YARN_NO_MSCALE = {**VARIANTS["dsv3"]["rope_parameters"], "mscale_all_dim": 0.0}
# (config patch turning one feature off, the least move of transformers' rows it must make). The softmax scale's
# mscale^2 moves them less (the tiny model's scores are small), still 40x the 1e-4 the engine is held to.
FEATURES: list[tuple[dict[str, Any], float]] = [
    ({"rope_interleave": False}, 1e-2),
    ({"rope_parameters": YARN_NO_MSCALE}, 4e-3),
    ({"topk_group": 2}, 1e-2),
    ({"routed_scaling_factor": 1.0}, 1e-2),
    ({"norm_topk_prob": False}, 1e-2),
]


@pytest.mark.parametrize(("patch", "min_diff"), FEATURES,
                         ids=[f"{next(iter(p))}-{i}" for i, (p, _) in enumerate(FEATURES)])
def test_feature_changes_the_scores(tmp_path: Path, patch: dict[str, Any], min_diff: float) -> None:
    check_feature_matters(dsv3_path("dsv3"), tmp_path, patch, min_diff)


def test_router_stays_float32_in_bfloat16() -> None:
    model, _ = load_model(dsv3_path("dsv3"), "bfloat16", torch.device("cpu"))
    moe = model.model.layers[1].mlp
    assert moe.gate.weight.dtype == moe.gate.e_score_correction_bias.dtype == torch.float32
    assert model.model.layers[1].self_attn.kv_b_proj.weight.dtype == torch.bfloat16


def test_refusals() -> None:
    path = dsv3_path("dsv3")
    with pytest.raises(ValueError, match=r"batch_invariant .*latent attention \(kv_lora_rank\)"):
        make_engine(path, batch_invariant=True)
    model, _ = load_model(path, "float32", torch.device("cpu"))
    # MLA splits its heads (tests/engine/test_parallel_families.py): only a head count that does not divide refuses.
    assert refusals(model, 2) == []
    assert "num_attention_heads 4 is not divisible by tensor_parallel_size 3" in refusals(model, 3)


# MLA's projections that stay linears (PEFT's "gate_proj" would also take the shared experts of the MoE layers, which
# are not targets: the dense layer's MLP targets are Llama's code).
LORA_TARGETS = ["q_a_proj", "q_b_proj", "kv_a_proj_with_mqa", "o_proj"]


def test_lora_adapter_equals_peft(tmp_path: Path) -> None:
    base = dsv3_path("dsv3")
    adapter = build_adapter(tmp_path / "ad", base, rank=4, seed=3, targets=LORA_TARGETS)
    engine = make_engine(base, lora_adapters={"ad": str(adapter)})
    ids = rand_ids(15, seed=6)
    got = engine.generate([ids, ids], [_with_adapter("ad"), _with_adapter(None)], check=True)
    assert_rows(got[0].input_token_logprobs, ids, 0, peft_scores(base, adapter, ids, 0))
    assert_rows(got[1].input_token_logprobs, ids, 0, hf_scores(base, ids, 0))
    kv_b = build_adapter(tmp_path / "kv", base, rank=4, seed=3, targets=["kv_b_proj"])
    with pytest.raises(LoraError, match="kv_b_proj"):  # refused at start: absorbed, not a linear
        make_engine(base, lora_adapters={"kv": str(kv_b)})


def _with_adapter(name: str | None) -> SamplingParams:
    return SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=0,
                          adapter=AdapterRef(name) if name else None)
