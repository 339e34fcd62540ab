"""Mixture-of-experts blocks split over ranks (engine/parallel/shard.py's shard_moe), on real gloo ranks:

- the whole Qwen3-MoE engine at tensor_parallel_size 2, experts split by width (the default) and whole experts
  per rank (expert_parallel), and gpt-oss's (biased experts, sinks) at TP 2 x PP 2: scoring rows (top-k), a
  prefix-cache hit and greedy generation equal transformers' float32 forward and the same engine on one device
  within 1e-4;
- each block layout alone against transformers' own block at 2 ranks, both splits: Qwen3-MoE's router without
  renormalisation, Qwen3-VL-MoE's stacked experts (its engine is refused at tensor_parallel_size > 1 for its image
  rows, engine/loading/sharded.py, so its block is checked here), Qwen2-MoE's shared expert with its sigmoid gate
  (its partial sum reduced with the routed one);
- the widths that do not split are refused naming their config field, and a shared expert that is no dense MLP."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import Qwen2MoeConfig, Qwen3MoeConfig, Qwen3VLMoeTextConfig
from transformers.models.qwen2_moe.modeling_qwen2_moe import Qwen2MoeSparseMoeBlock
from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock
from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextSparseMoeBlock

from engine.layers.moe import SparseMoeBlock
from engine.loading.loader import load_model
from engine.models.llama import MLP
from engine.parallel.group import TPGroup, free_port
from engine.parallel.local import rank_context
from engine.parallel.shard import refusals
from tests.engine.test_tensor_parallel import CFG, _check_greedy, _check_scoring
from tests.helpers.engine import greedy, make_engine, rand_ids, scoring
from tests.helpers.families import family_path
from tests.helpers.tiny_gpt_oss import gpt_oss_path
from tests.helpers.tp import run_split

_SIZES: dict[str, Any] = dict(hidden_size=32, moe_intermediate_size=16, num_experts=4, num_experts_per_tok=2)


@pytest.mark.parametrize(("family", "expert_parallel", "stages"), [("qwen3-moe", False, 1), ("qwen3-moe", True, 1),
                                                                   ("gpt-oss", False, 2)])
def test_moe_engine_at_two_ranks(family: str, expert_parallel: bool, stages: int) -> None:
    """Qwen3-MoE: layers 0 and 2 sparse, 1 dense, both MLP kinds split in one model. gpt-oss at TP 2 x PP 2 (3
    layers cut 1 + 2, sliding and full layers on both stages): biased experts (each rank's gate/up bias rows, the
    down bias added once) and sinks split with their heads; then a prompt sharing 24 tokens (a prefix-cache hit)."""
    path = family_path(family) if family == "qwen3-moe" else gpt_oss_path()
    ids = rand_ids(29, 21)
    shared = ids[:24] + rand_ids(6, 22)
    params = [scoring(0, k=3), greedy(5)]
    batches = [([ids, ids[:9]], params), ([shared], [scoring(1, k=2)])]
    cfg = dict(model=str(path), expert_parallel=expert_parallel, pipeline_parallel_size=stages, **CFG)
    split = run_split(2 * stages, cfg, batches)
    (scored, generated), (warm,) = split.outputs
    one = make_engine(path, **CFG)
    alone = one.generate([ids, ids[:9]], params)
    _check_scoring(path, ids, 0, 3, scored, alone[0])
    _check_greedy(path, ids[:9], 5, generated, alone[1])
    _check_scoring(path, shared, 1, 2, warm, one.generate([shared], [scoring(1, k=2)])[0])
    assert warm.cached_tokens == 24


def _blocks() -> dict[str, tuple[torch.nn.Module, SparseMoeBlock]]:
    """transformers' block and ours (same parameter names), seeded: the same weights on every rank."""
    torch.manual_seed(5)
    q3 = Qwen3MoeConfig(**_SIZES, norm_topk_prob=False)
    vl = Qwen3VLMoeTextConfig(**_SIZES)
    q2 = Qwen2MoeConfig(**_SIZES, shared_expert_intermediate_size=24, norm_topk_prob=True)
    pairs = {"qwen3-moe": (Qwen3MoeSparseMoeBlock(q3), SparseMoeBlock(q3, stacked=True, norm_topk_prob=False)),
             "qwen3-vl-moe": (Qwen3VLMoeTextSparseMoeBlock(vl), SparseMoeBlock(vl, stacked=True)),
             "qwen2-moe": (Qwen2MoeSparseMoeBlock(q2), SparseMoeBlock(q2, stacked=True, shared_expert=MLP(q2, 24),
                                                                     shared_gate=True))}
    for ref, ours in pairs.values():
        with torch.no_grad():
            for p in ref.parameters():
                p.normal_(0, 0.3)
        ours.load_state_dict(ref.state_dict(), strict=True, assign=True)
        ours.fuse()
    return pairs


def _block_rank(rank: int, address: str, out: Any) -> None:
    from engine.parallel.shard import shard_moe

    torch.set_num_threads(1)
    group = TPGroup(rank, 2, torch.device("cpu"), address, timeout_s=60)
    try:
        diffs = {}
        x = torch.randn(37, 32, generator=torch.Generator().manual_seed(3))
        for expert_parallel in (False, True):
            for name, (ref, ours) in _blocks().items():
                shard_moe(ours, rank, 2, group, expert_parallel)
                with torch.inference_mode():
                    routed = len(ours.route(x)[1].unique())  # every expert has rows: each rank computes some
                    diffs[name, expert_parallel] = ((ours(x) - ref(x[None])[0]).abs().max().item(), routed)
        out.put((rank, diffs))
    except BaseException as exc:  # noqa: BLE001 - the parent reports it
        out.put((rank, repr(exc)))
    finally:
        group.close()


def test_each_block_layout_split_over_two_gloo_ranks() -> None:
    ctx = rank_context()
    out = ctx.Queue()
    address = f"127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_block_rank, args=(r, address, out), daemon=True) for r in range(2)]
    for p in procs:
        p.start()
    got = dict(out.get(timeout=180) for _ in procs)
    for p in procs:
        p.join(timeout=30)
    for rank in (0, 1):
        assert isinstance(got[rank], dict), got[rank]
        assert len(got[rank]) == 6
        for key, (diff, routed) in got[rank].items():
            assert diff <= 1e-5 and routed == 4, (rank, key, diff, routed)


def test_widths_that_do_not_split_are_refused(tmp_path: Path) -> None:
    model, _ = load_model(family_path("qwen3-moe"), "float32", torch.device("cpu"))  # 4 experts of width 32
    assert refusals(model, 2) == [] and refusals(model, 2, expert_parallel=True) == []
    assert "moe_intermediate_size 32 is not divisible by tensor_parallel_size 3" in refusals(model, 3)
    assert "num_experts 4 is not divisible by tensor_parallel_size 3" in refusals(model, 3, expert_parallel=True)
    # A shared expert of a kind the split does not know would be summed once per rank: refused.
    model.model.layers[0].mlp.shared_expert = torch.nn.Linear(64, 64)
    assert "Linear shared experts are not split across ranks" in refusals(model, 2)
