"""What rank 0 broadcasts to stage 0's ranks, one message per collective phase of a step (pickled over the gloo
group). Setup, Forward and Stop also go on to the later pipeline stages, each stage's rank i passing them to the
next's (pipeline.py); the head's messages (Score, Targets, Logits) stay on stage 0. Tensors here are CPU index
tensors; activations travel separately, on the device group."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass
class Setup:
    num_blocks: int  # KV blocks: every rank's cache has as many as rank 0's block tables address
    state_rows: int = 0  # a hybrid's state rows (running slots, then snapshots): as many as rank 0's StateSlots


@dataclass
class Forward:
    """The transformer over the step's new tokens: AttentionMetadata's inputs, before finalize()."""

    input_ids: torch.Tensor  # [T]
    positions: torch.Tensor  # [T]
    slot_mapping: torch.Tensor  # [T]
    starts: list[int]
    lens: list[int]
    context_slots: list[torch.Tensor]
    # (LoRA adapter slot, first row, end row) runs of the step's rows (engine/layers/lora.py's LoraStep)
    lora: list[tuple[int, int, int]] = field(default_factory=list)
    # A hybrid's linear layers: AttentionMetadata's state_slots, state_sources, state_saves (rank 0's rows; each
    # rank's rows hold its own heads of its own stage's layers)
    state_slots: list[int] = field(default_factory=list)
    state_sources: list[int] = field(default_factory=list)
    state_saves: list[list[tuple[int, int]]] = field(default_factory=list)


@dataclass
class Adapter:
    """A LoRA adapter written into a slot, or the slot cleared (path None), between steps as rank 0's LoraManager
    loads or evicts it. Each rank reads the PEFT folder itself (the ranks share a node: STRICT_PACK) and keeps its
    share: a path travels, not the weights."""

    slot: int
    name: str = ""
    path: str | None = None


@dataclass
class Score:
    """Scoring rows through the vocab-parallel log-softmax; the [rows, hidden] rows follow by broadcast."""

    targets: torch.Tensor  # [rows]
    ks: list[int]
    mode: str
    rows_per_block: int
    temps: torch.Tensor | None = None  # [rows] input_logprob_temperature per row; None: every row at 1
    token_ids: list[list[int] | None] | None = None  # per row, the ids whose values it also reports
    ranks: list[bool] | None = None  # per row, whether it reports its target's rank


@dataclass
class Targets:
    """Each row's target logit alone (the cached-row shortcut); the rows follow by broadcast."""

    targets: torch.Tensor  # [rows]


@dataclass
class Logits:
    """Whole-vocabulary logits of a few rows (the sampling rows), gathered; the rows follow by broadcast."""

    rows: int


@dataclass
class Stop:
    """The engine is closing: the other ranks leave their loop."""


Message = Setup | Forward | Adapter | Score | Targets | Logits | Stop
