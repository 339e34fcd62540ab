"""LoRA adapters and classifier heads with tensor parallelism, at engine level without Ray (ranks spawned on one gloo
group, tests/helpers/tp.py): every rank keeps its share of each adapter, and rows of the base model and of two
adapters in one step equal transformers (+ PEFT) within 1e-4; an adapter loaded at run time, evicted and reloaded
into another adapter's slot stays exact on every rank; a classifier's pooled scores equal transformers' cold and from
rank 0's hidden-state store. The share itself is checked without processes: each rank's delta, put together as the
split puts the base output together, is the whole linear's delta (KV heads split and replicated, Phi-3's fused
checkpoint)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from engine.config import EngineConfig
from engine.loading.loader import load_model
from engine.loading.lora import read_adapter
from engine.parallel.shard import RowParallelLinear, shard_model
from engine.runner.lora import AdapterSlots
from protocol.sampling import AdapterRef, PoolingParams, SamplingParams
from tests.helpers.engine import rand_ids, scoring
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_adapters import build_adapter, peft_scores
from tests.helpers.tiny_classifiers import build_classifier, reference_scores
from tests.helpers.tiny_families import build_family
from tests.helpers.tp import run_split

ATOL = 1e-4
# 64 tokens a step: each batch below runs in one step, whatever its adapters.
CFG = dict(max_num_batched_tokens=64, num_kv_blocks=128, block_size=4, score_rows_per_block=8,
           enable_prefix_cache=True)


def _with(name: str | None) -> SamplingParams:
    p = scoring(0)
    p.adapter = None if name is None else AdapterRef(name)
    return p


def _close(got: list, want: list[float]) -> float:
    return max(abs(v - w) for (v, _), w in zip(got, want, strict=True))


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_base_and_two_adapters_in_one_split_step(tiny_models: dict[str, Path], tmp_path: Path, family: str) -> None:
    """max_loras 2: loading c at run time evicts b, then b is reloaded into a's slot; b adapts q/v/down only, so a
    follower that kept a's k/o/gate/up in that slot would move b's rows."""
    base = tiny_models[family]  # 4 query heads, 2 KV heads: split over 2 ranks
    adapters = {"a": build_adapter(tmp_path / "a", base, rank=4, seed=1),
                "b": build_adapter(tmp_path / "b", base, rank=8, seed=2, targets=["q_proj", "v_proj", "down_proj"],
                                   rslora=True),
                "c": build_adapter(tmp_path / "c", base, rank=2, seed=3, targets=["k_proj", "o_proj", "up_proj"])}
    cfg = dict(model=str(base), max_loras=2, lora_adapters={"a": str(adapters["a"]), "b": str(adapters["b"])}, **CFG)
    first = [rand_ids(n, seed=n) for n in (9, 13, 7, 11, 6)]
    second = [rand_ids(n, seed=20 + n) for n in (10, 8, 12)]
    names = [[None, "a", "b", "a", None], ["c", None, "b"]]
    batches = [(first, [_with(n) for n in names[0]]), (second, [_with(n) for n in names[1]])]
    split = run_split(2, cfg, batches, loads=[{}, {"c": str(adapters["c"])}])
    for prompts, batch_names, outs in zip((first, second), names, split.outputs, strict=True):
        for ids, name, out in zip(prompts, batch_names, outs, strict=True):
            want = hf_scores(base, ids, 0) if name is None else peft_scores(base, adapters[name], ids, 0)
            assert _close(out.input_token_logprobs, want) <= ATOL, (name, _close(out.input_token_logprobs, want))
    # Each batch in one step on every rank; an adapter moves its rows (one left unapplied would fail above).
    assert split.forwards == 2 and split.follower_steps == [2]
    assert _close(split.outputs[0][1].input_token_logprobs, hf_scores(base, first[1], 0)) > 1e-2


def test_adapters_configured_with_ranks_refused_in_batch_invariant_mode() -> None:
    assert EngineConfig(lora_adapters={"a": "/adapters/a"}, tensor_parallel_size=2).lora_adapters
    with pytest.raises(ValueError, match="lora_adapters are served with batch_invariant off only"):
        EngineConfig(lora_adapters={"a": "/adapters/a"}, batch_invariant=True)


@pytest.mark.parametrize("labels", [1, 3])
def test_split_classifier_equals_transformers(tmp_path: Path, labels: int) -> None:
    family = "llama" if labels == 1 else "qwen2"
    path = build_classifier(tmp_path / family, family, labels, seed=labels)
    prompts = [rand_ids(n, seed=n) for n in (1, 7, 16, 23)]
    classify = SamplingParams(max_tokens=0, pooling=PoolingParams())
    split = run_split(2, dict(model=str(path), **CFG), [(prompts, [classify] * 4), (prompts[2:3], [classify])])
    cold, (warm,) = split.outputs
    for ids, out in zip(prompts, cold, strict=True):
        want = reference_scores(path, ids)
        assert out.pooled is not None and len(out.pooled) == labels
        assert max(abs(a - b) for a, b in zip(out.pooled, want, strict=True)) <= ATOL, (out.pooled, want)
    # 16 tokens, four whole blocks: served from the prefix cache and rank 0's store, no forward on any rank.
    assert warm.cached_tokens == 16 and warm.pooled == pytest.approx(cold[2].pooled, abs=1e-6)
    assert split.forwards == 1 and split.follower_steps == [1]


def _deltas(model: torch.nn.Module, layer: int, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each target Linear's adapter delta on x (slot 0 on every row): a rank's own, before any all-reduce."""
    out = {}
    for name, (linear, _, _) in model.lora_targets(layer).items():
        assert linear.lora is not None
        linear.lora.step.segments = [(0, 0, x.shape[0])]
        cols = linear.shard.in_cols if linear.shard is not None and linear.shard.in_cols else None
        xin = x[:, :linear.in_features] if cols is None else x[:, cols[0]:cols[1]]
        out[name] = linear.lora.add(torch.zeros(x.shape[0], linear.out_features), xin)
    return out


@pytest.mark.parametrize(("family", "size"), [("llama", 2), ("llama", 4), ("phi3", 2)])
def test_each_rank_keeps_its_share_of_an_adapter(tiny_models: dict[str, Path], tmp_path: Path, family: str,
                                                 size: int) -> None:
    """llama over 4 ranks: 2 KV heads, each replicated on 2 ranks; Phi-3: PEFT adapts its fused qkv_proj as one
    module, whose rows of a rank are three ranges."""
    base = tiny_models["llama"] if family == "llama" else build_family(tmp_path / family, family)
    targets = ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"] if family == "phi3" else None
    adapter = read_adapter("a", build_adapter(tmp_path / "a", base, rank=4, seed=5, targets=targets), 16,
                           torch.float32)
    whole, _ = load_model(base, "float32", torch.device("cpu"))
    AdapterSlots(whole, 1, 16, torch.device("cpu")).write(0, adapter)
    torch.manual_seed(0)
    width = max(linear.in_features for linear, _, _ in whole.lora_targets(0).values())
    x = torch.randn(5, width)
    want = _deltas(whole, 0, x)
    sums = {name: torch.zeros_like(delta) for name, delta in want.items()}
    covered = {name: torch.zeros(delta.shape[1], dtype=torch.bool) for name, delta in want.items()}
    for rank in range(size):
        model, _ = load_model(base, "float32", torch.device("cpu"))
        shard_model(model, SimpleNamespace(rank=rank, size=size))  # type: ignore[arg-type]
        AdapterSlots(model, 1, 16, torch.device("cpu")).write(0, adapter)
        for name, delta in _deltas(model, 0, x).items():
            linear = model.lora_targets(0)[name][0]
            if isinstance(linear, RowParallelLinear):  # partial sums: the all-reduce adds them
                sums[name] += delta
                continue
            at = 0  # this rank's rows of the whole output (a replicated KV head's on several ranks)
            for lo, hi in linear.shard.out_rows:
                assert torch.allclose(delta[:, at:at + hi - lo], want[name][:, lo:hi], atol=1e-5), (name, rank)
                covered[name][lo:hi] = True
                at += hi - lo
            assert at == delta.shape[1]
    for name, delta in want.items():
        assert delta.abs().max() > 1e-3, name
        if isinstance(model.lora_targets(0)[name][0], RowParallelLinear):
            assert torch.allclose(sums[name], delta, atol=1e-5), name
        else:
            assert bool(covered[name].all()), name
