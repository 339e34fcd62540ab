"""The 2026 teachers split over ranks (engine/parallel/shard.py, pipeline.py) on real gloo ranks, without Ray
(tests/helpers/tp.py): Qwen3.5-MoE at tensor_parallel_size 2 x pipeline_parallel_size 2 (3 layers cut 1 + 2: each
stage's two ranks split their own layers), Qwen3.5 dense and DeepSeek-V3 at TP 2. (Qwen3-MoE and DeepSeek-V3 at
TP 2 x PP 2: tests/engine/test_pipeline_parallel.py; gpt-oss: test_tensor_parallel_moe.py.) Each run: a 29-token
prompt prefilled in chunks of the 16-token budget and scored with top-k, beside a greedy generation, then a prompt
sharing the first one's first 24 tokens (a prefix-cache hit: rank 0's hidden-state store; Qwen3.5 resumes its
linear layers from the state snapshot every 8 tokens, which each rank keeps of its own heads and layers). Rows equal
transformers' float32 forward without cache and the same engine on one device within 1e-4; greedy tokens are the
argmax of transformers' full forwards (not its cached generate: transformers #46190 for Qwen3.5)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from engine.loading.loader import load_model
from engine.parallel.pipeline import stage_costs
from engine.parallel.shard import refusals
from tests.engine.test_pipeline_parallel import _check_greedy
from tests.engine.test_tensor_parallel import CFG, _check_scoring
from tests.helpers.engine import greedy, make_engine, rand_ids, scoring
from tests.helpers.tiny_deepseek_v3 import build_deepseek_v3
from tests.helpers.tiny_qwen3_5 import qwen3_5_path
from tests.helpers.tp import run_split


def _path(family: str, tmp_path: Path) -> Path:
    if family.startswith("dsv3"):
        return build_deepseek_v3(tmp_path / family, family)
    return qwen3_5_path(family)


# (family, ranks, stages), with the branches each covers:
CASES = [
    # Gated DeltaNet (key heads 2 -> 1 per rank, their value heads 4 -> 2) and gated attention (each head's output
    # gate with it); experts and the sigmoid-gated shared expert; stage 0 holds one linear layer and no KV (the
    # blocks sized by stage 1's costs), every rank the state rows and snapshots of its own layers' heads
    ("qwen3_5-moe", 4, 2),
    # Qwen3.5 dense: the linear and gated layers split beside a dense MLP, one stage
    ("qwen3_5", 2, 1),
    # MLA with q_proj straight from the hidden state (split by head), rotate-half rotary, one stage
    ("dsv3-plain-q", 2, 1),
]


@pytest.mark.parametrize(("family", "size", "stages"), CASES, ids=[f"{f}-tp{n // p}-pp{p}" for f, n, p in CASES])
def test_split_family_equals_transformers_and_one_device(tmp_path: Path, family: str, size: int, stages: int) -> None:
    path = _path(family, tmp_path)
    cfg = dict(CFG, hybrid_state_interval=8)  # a snapshot every 2 blocks (a hybrid's prefix hit resumes there)
    a, b = rand_ids(29, 1), rand_ids(9, 2)
    shared = a[:24] + rand_ids(6, 4)
    batches = [([a, b], [scoring(0, k=3), greedy(5)]), ([shared], [scoring(1, k=2)])]
    split = run_split(size, dict(model=str(path), pipeline_parallel_size=stages, **cfg), batches)
    one = make_engine(path, **cfg)
    alone = [one.generate(prompts, params) for prompts, params in batches]
    (s_a, g_b), (s_shared,) = split.outputs
    _check_scoring(path, a, 0, 3, s_a, alone[0][0])
    _check_greedy(path, b, g_b, alone[0][1])
    _check_scoring(path, shared, 1, 2, s_shared, alone[1][0])
    assert s_shared.cached_tokens == 24 and split.stats.prefix_cache_hit_tokens >= 24
    assert split.follower_steps == [split.forwards] * (size - 1) and split.forwards > 0


def test_heads_that_do_not_split_are_refused_naming_the_field(tmp_path: Path) -> None:
    hybrid, _ = load_model(qwen3_5_path("qwen3_5"), "float32", torch.device("cpu"))  # 2 key heads, 4 value heads
    assert refusals(hybrid, 2) == []
    assert "linear_num_key_heads 2 is not divisible by tensor_parallel_size 4" in refusals(hybrid, 4)
    mla, _ = load_model(build_deepseek_v3(tmp_path / "dsv3", "dsv3"), "float32", torch.device("cpu"))
    assert "num_attention_heads 4 is not divisible by tensor_parallel_size 3" in refusals(mla, 3)


def test_stage_costs_of_a_hybrid_follow_its_layer_kinds() -> None:
    """Layers linear | full, linear: stage 0 caches nothing per token, each stage one linear layer's state."""
    model, _ = load_model(qwen3_5_path("qwen3_5"), "float32", torch.device("cpu"))
    (kv0, state0), (kv1, state1) = stage_costs(model, 2)
    assert kv0 == 0 and kv1 == model.kv_bytes_per_token() > 0
    assert state0 == state1 == model.state_bytes_per_slot() // 2 > 0
    assert len(model.model.layers) == 3  # the model itself is left whole
