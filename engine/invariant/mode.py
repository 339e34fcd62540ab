"""Batch-invariant mode: the switch, and the checks it makes on the running machine before it serves.

With the mode on, a request's values have the same float bits whatever else runs in its steps, wherever its
chunks start and end and whatever is cached: every matmul runs as calls of row counts checked at start to compute
a row in one order (row_plan.py), the MLP's SiLU avoids torch's CPU kernel whose scalar tail rounds unlike
its vector lanes (activation.py), attention reduces keys in fixed blocks from position 0 in batched matmuls of
one shape per entry (attention.py, its batch-count property checked at start), log-softmax runs in fixed tiles
of rows (engine/runner/logprobs.py) and the scorer never takes the log-sum-exp shortcut (engine/runner/scorer.py).

ModelRunner switches it on from EngineConfig.batch_invariant, once, after loading the model:
    set_batch_invariant(model, True, limits)            # linears (layers and LM head), MLP activation, checks
    backend = InvariantPagedAttention()                 # instead of TorchPagedAttention()
    RowScorer(..., batch_invariant=True)                # every scoring row through the full projection
    row_scores(logits, mode, invariant=True)            # the sampled token's logprob / top-k
The checks raise InvariantModeError (the engine does not start) when a property fails on this machine.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.config import CPU_SCORE_ROWS, EngineConfig
from engine.invariant import attention as invariant_attention
from engine.invariant.activation import check_silu
from engine.invariant.row_plan import RowPlan

# A process checks each shape once (tests and benchmarks build many engines of one model).
_plans: dict[tuple, RowPlan] = {}
_attention_checked: set[tuple] = set()


@dataclass(frozen=True)
class StepLimits:
    """The largest calls the engine makes: what the checks must cover."""

    max_tokens: int  # rows of a layer's matmul: the step's token budget
    max_head_rows: int  # rows of one LM-head call: a scoring block, or every sampling request of a step
    max_seqs: int  # requests in one step (decode tiles of attention)

    @staticmethod
    def of(config: EngineConfig) -> StepLimits:
        return StepLimits(max_tokens=config.max_num_batched_tokens, max_seqs=config.max_num_seqs,
                          max_head_rows=max(config.score_rows_per_block or CPU_SCORE_ROWS, config.max_num_seqs))


def set_batch_invariant(model: nn.Module, on: bool, limits: StepLimits | None = None) -> None:
    """Switch every Linear (fused q/k/v, o, gate/up, down, LM head) and MLP of the model; on: check this machine
    first (raises InvariantModeError), for the calls an engine of `limits` makes (default: EngineConfig's).
    (RMSNorm needs no switch: its mean is a row-wise reduction and its other operations round correctly, the
    same in any lane.)"""
    plans: dict[nn.Module, RowPlan] = {}
    if on:
        limits = limits or StepLimits.of(EngineConfig())
        check_attention(model, limits)
        if any(_is_mlp(m) and m.silu for m in model.modules()):
            check_silu(model.dtype, model.model.embed_tokens.weight.device)
        for name, m in model.named_modules():
            if _is_linear(m):
                rows = limits.max_head_rows if name.endswith("lm_head") else limits.max_tokens
                key = (m.in_features, m.out_features, m.bias is not None, m.weight.dtype, m.weight.device,
                       torch.get_num_threads(), rows)
                if key not in _plans:
                    _plans[key] = m.calibrate(rows, name)
                plans[m] = _plans[key]
    for m in model.modules():
        if _is_linear(m):
            m.row_plan = plans.get(m)
        elif _is_mlp(m):
            m.batch_invariant = on


def _is_linear(m: nn.Module) -> bool:
    # engine.layers.linear.Linear, told by the switch it carries: this package sits below layers/ and models/,
    # which import its kernels, so it names their classes by what they expose rather than importing them.
    return hasattr(m, "row_plan") and hasattr(m, "calibrate")


def _is_mlp(m: nn.Module) -> bool:
    # engine.models.llama.MLP (and every family's MLP built on it): the module whose activation has an invariant form.
    return hasattr(m, "batch_invariant") and hasattr(m, "silu")


def check_attention(model: nn.Module, limits: StepLimits) -> None:
    if not model.num_layers:
        return
    attn = model.model.layers[0].self_attn
    groups = attn.num_heads // attn.num_kv_heads
    device = model.model.embed_tokens.weight.device
    tiles = -(-limits.max_tokens * groups // invariant_attention.tile_rows(groups))
    entries = max(tiles, limits.max_seqs * model.num_kv_heads)
    key = (groups, model.head_dim, model.dtype, device, torch.get_num_threads(), entries)
    if key not in _attention_checked:
        invariant_attention.check(groups, model.head_dim, model.dtype, device, entries)
        _attention_checked.add(key)


def plans_of(model: nn.Module) -> dict[str, RowPlan]:
    """Each Linear's checked plan, by module name (for logs and tests)."""
    return {name: m.row_plan for name, m in model.named_modules() if _is_linear(m) and m.row_plan}
