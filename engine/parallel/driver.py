"""The sharded model's collective phases, run the same way on every rank: rank 0 calls the public methods, which
first broadcast what the phase needs (messages.py) and then run it; the other ranks (follower.py) receive the
message and run the same phase. The scorer and the sampler see `compute_logits` / `target_logits` / `score_rows`
with the single-device signatures (engine/runner/scorer.py, engine/runner/logprobs.py), so the model runner's plan
is unchanged."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import torch

from engine.layers.attention import AttentionMetadata
from engine.models.llama import LlamaForCausalLM
from engine.parallel import vocab
from engine.parallel.group import TPGroup
from engine.parallel.messages import Adapter, Forward, Logits, Message, Score, Setup, Stop, Targets
from engine.parallel.pipeline import Pipeline
from engine.parallel.shard import vocab_range
from engine.runner.logit_buffer import float_logits
from engine.runner.logprobs import ScoredRows


class TensorParallel:
    def __init__(self, model: LlamaForCausalLM, group: TPGroup) -> None:
        self.model, self.group = model, group
        lo, hi = vocab_range(model.config.vocab_size, group.rank, group.size)
        self.shard = vocab.VocabShard(group, lo, hi, model.config.vocab_size)
        self.pipeline = Pipeline(group, model.hidden_size, model.dtype)

    def send(self, msg: Message) -> None:
        assert self.group.is_driver, "only rank 0 sends"
        self.group.broadcast_object(msg)

    # --- rank 0's calls -----------------------------------------------------------------------------
    def start(self, num_blocks: int, state_rows: int = 0) -> None:
        msg = Setup(num_blocks, state_rows)
        self.send(msg)
        self.pipeline.pass_on(msg)

    def stop(self) -> None:
        msg = Stop()
        self.send(msg)
        self.pipeline.pass_on(msg)
        self.pipeline.flush()

    def announce_forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata,
                         lora: list[tuple[int, int, int]] | None = None) -> Forward:
        """Before rank 0's own forward: stage 0's other ranks run theirs over the same tokens (their heads, their
        cache, their share of each adapter on the same rows: lora, LoraStep's segments). Rank 0 then hands the
        message and its hidden states to the next stage (launch_forward) and later takes the last stage's back
        (collect_forward)."""
        cpu = torch.device("cpu")
        msg = Forward(input_ids.to(cpu), positions.to(cpu), meta.slot_mapping.to(cpu), list(meta.starts),
                      list(meta.lens), [s.to(cpu) for s in meta.context_slots], list(lora or []),
                      list(meta.state_slots), list(meta.state_sources), [list(s) for s in meta.state_saves])
        self.send(msg)
        return msg

    def launch_forward(self, msg: Forward, hidden: torch.Tensor) -> None:
        """Stage 0's [T, hidden] on to the later stages (which run their layers on it), not waiting: rank 0 may
        launch the next step at once. Nothing with one stage."""
        self.pipeline.pass_on(msg, hidden)

    def collect_forward(self, hidden: torch.Tensor, tokens: int) -> torch.Tensor:
        """The last stage's [T, hidden] of the oldest step launched (stage 0's own `hidden` with one stage)."""
        return hidden if self.group.stages == 1 else self.pipeline.collect(tokens)

    def load_adapter(self, slot: int, name: str, path: str) -> None:
        """The other ranks read the adapter at `path` and write their share of it into `slot`."""
        self.send(Adapter(slot, name, path))

    def clear_adapter(self, slot: int) -> None:
        self.send(Adapter(slot))

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, V] raw logits of the whole vocabulary (float32): the sampling rows."""
        self.send(Logits(hidden.shape[0]))
        return self.run_logits(hidden)

    def target_logits(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        self.send(Targets(targets.cpu()))
        return self.run_targets(hidden, targets)

    def score_rows(self, hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor],
                   targets: torch.Tensor, ks: list[int], mode: str, rows_per_block: int, invariant: bool = False,
                   temps: torch.Tensor | None = None, token_ids: list[list[int] | None] | None = None,
                   ranks: list[bool] | None = None) -> ScoredRows:
        """logprobs.score_rows' signature (compute_logits is the model's; the split head replaces it)."""
        assert not invariant, "batch-invariant mode is refused with tensor_parallel_size > 1 (EngineConfig)"
        self.send(Score(targets.cpu(), list(ks), mode, rows_per_block, temps.cpu() if temps is not None else None,
                        token_ids, ranks))
        return self.run_score(hidden, targets, ks, mode, rows_per_block, temps, token_ids, ranks)

    # --- every rank: the phases -----------------------------------------------------------------------
    def share(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rank 0's rows (the scored positions, some from its hidden-state store) into every rank's buffer."""
        return self.group.broadcast(hidden.contiguous())

    def run_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        local = self.model.compute_logits(self.share(hidden)).float()  # [R, V_r]
        return self.shard.gather_logits(local)

    def run_targets(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        mine, idx = self.shard.owned(targets)
        picked = self.model.target_logits(self.share(hidden), idx)  # [R]: this rank's head rows, local ids
        return self.group.all_reduce(torch.where(mine, picked, torch.zeros_like(picked)))

    def run_score(self, hidden: torch.Tensor, targets: torch.Tensor, ks: list[int], mode: str, rows_per_block: int,
                  temps: torch.Tensor | None = None, token_ids: list[list[int] | None] | None = None,
                  ranks: list[bool] | None = None) -> ScoredRows:
        return vocab.score_rows(self.shard, self.share(hidden), partial(float_logits, self.model), targets, ks, mode,
                                rows_per_block, temps, token_ids, ranks)
