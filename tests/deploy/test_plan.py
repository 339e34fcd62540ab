"""`python -m deploy.plan` (deploy/sizing.py's arithmetic): the parameter count of each family's config against the
matrices of transformers' own model built from it (on the meta device: no memory), so each attention kind (grouped,
MLA, hybrid linear attention with a gated full attention) and MLP kind (dense, routed experts, shared experts with
or without a gate) is counted as the model has it; then the public configs of Qwen3-235B-A22B and DeepSeek-V3
(tests/data/configs/): their published sizes, and the answers docs/design/tensor-parallel.md quotes for 80 GB
cards."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config, GptOssConfig, Qwen3MoeConfig
from transformers.models.qwen3_5_moe.configuration_qwen3_5_moe import Qwen3_5MoeTextConfig

from deploy.plan import main, read_config, recommend, splits
from deploy.sizing import model_size

CONFIGS = Path(__file__).parents[1] / "data" / "configs"
SMALL = dict(vocab_size=1000, hidden_size=256, num_attention_heads=8, num_key_value_heads=2, num_hidden_layers=4)


def _families() -> dict[str, object]:
    return {
        "qwen3-moe": Qwen3MoeConfig(**SMALL, head_dim=32, intermediate_size=512, moe_intermediate_size=96,
                                    num_experts=8, num_experts_per_tok=2, mlp_only_layers=[1],
                                    tie_word_embeddings=False),
        "deepseek-v3": DeepseekV3Config(**SMALL, intermediate_size=512, moe_intermediate_size=96, n_routed_experts=8,
                                        num_experts_per_tok=2, n_group=2, topk_group=1, n_shared_experts=1,
                                        first_k_dense_replace=1, kv_lora_rank=64, q_lora_rank=96,
                                        qk_rope_head_dim=16, qk_nope_head_dim=32, v_head_dim=32),
        "qwen3.5-moe": Qwen3_5MoeTextConfig(**SMALL, head_dim=32, moe_intermediate_size=96,
                                            shared_expert_intermediate_size=128, num_experts=8, num_experts_per_tok=2,
                                            linear_num_key_heads=4, linear_num_value_heads=8, linear_key_head_dim=32,
                                            linear_value_head_dim=32,
                                            layer_types=["linear_attention"] * 3 + ["full_attention"]),
        "gpt-oss": GptOssConfig(**SMALL, head_dim=32, intermediate_size=96, num_local_experts=8,
                                num_experts_per_tok=2, layer_types=["sliding_attention", "full_attention"] * 2),
    }


@pytest.mark.parametrize("family", list(_families()))
def test_parameters_are_the_models_matrices(family: str) -> None:
    cfg = _families()[family]
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    # Matrices only: norms, biases, sinks and per-head scalars are left out of the count (< 0.01 % at scale).
    want = sum(p.numel() for n, p in model.named_parameters() if p.dim() >= 2 and not n.endswith("bias"))
    assert model_size(cfg.to_dict()).params == want


def test_published_sizes() -> None:
    qwen = model_size(read_config(CONFIGS / "qwen3-235b-a22b.json"))
    assert round(qwen.params / 1e9) == 235
    ds = model_size(read_config(CONFIGS / "deepseek-v3.json"))
    assert round(ds.params / 1e9) == 671  # the 14B of the multi-token-prediction layer are not served
    assert 1245 * 2**30 < ds.weight_total < 1255 * 2**30  # served: the fp8 weights dequantized to bfloat16
    stored = model_size(read_config(CONFIGS / "deepseek-v3.json"), "stored")
    assert 620 * 2**30 < stored.weight_total < 630 * 2**30  # fp8 experts and attention, bfloat16 embedding and head
    # MLA caches its latent (512 + 64 values) per layer, whole on every rank: TP does not shrink it, PP does.
    assert ds.rank_kv_per_token(8, 1, 0) == ds.rank_kv_per_token(1, 1, 0) == 61 * 576 * 2
    # Qwen3-235B-A22B: 4 KV heads of 128; past 4 ranks each rank keeps one (replicated).
    assert qwen.rank_kv_per_token(4, 1, 0) == qwen.rank_kv_per_token(8, 1, 0) == 94 * 2 * 128 * 2


@pytest.mark.parametrize(("name", "dtype", "split"), [("qwen3-235b-a22b", "served", (8, 1)),
                                                       ("deepseek-v3", "served", (8, 4)),
                                                       ("deepseek-v3", "stored", (8, 2))])
def test_answers_on_80_gib_cards(name: str, dtype: str, split: tuple[int, int]) -> None:
    size = model_size(read_config(CONFIGS / f"{name}.json"), dtype)
    found = splits(size, 80, 0.92, 6, 256, 8, 64)
    best = recommend(found, 32768)
    assert best is not None and (best.tp, best.pp) == split


def test_the_command_prints_the_table(capsys: pytest.CaptureFixture[str]) -> None:
    main([str(CONFIGS / "deepseek-v3.json"), "--gpu-mem", "80", "--dtype", "stored"])
    out = capsys.readouterr().out
    assert "fp8 weights" in out and "| 8 | 2 | 16 |" in out
    assert "Recommended: tensor_parallel_size 8 x pipeline_parallel_size 2 (16 GPUs, 2 node(s) of 8)" in out
