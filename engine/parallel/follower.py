"""World ranks 1..N-1 of a split worker: load the model, keep this rank's shard and KV cache (its stage's layers,
its heads), then run what world rank 0 sends until it says stop. No scheduler, no block tables, no store: rank 0
decides everything. Stage 0's ranks take rank 0's broadcasts, the head's phases (Score, Targets, Logits) included;
a later stage's rank takes Setup, Forward and Stop from the previous stage's rank of its index, and each stage
passes them on (pipeline.py), so a stage simply runs whichever step reaches it next."""

from __future__ import annotations

import torch

from engine.config import EngineConfig
from engine.layers.attention import AttentionMetadata, TorchPagedAttention
from engine.loading.lora import read_adapter
from engine.loading.sharded import load_sharded
from engine.models.llama import LlamaForCausalLM
from engine.parallel.driver import TensorParallel
from engine.parallel.group import TPGroup
from engine.parallel.messages import Adapter, Forward, Logits, Score, Setup, Stop, Targets
from engine.runner.lora import AdapterSlots


class Follower:
    def __init__(self, config: EngineConfig, group: TPGroup) -> None:
        if config.num_threads:
            torch.set_num_threads(config.num_threads)
        self.group, self.device, self.block_size = group, group.device, config.block_size
        self.model: LlamaForCausalLM = load_sharded(config, group)[0]
        self.tp = TensorParallel(self.model, group)
        self.pipeline = self.tp.pipeline
        self.backend = TorchPagedAttention()
        self.adapters = AdapterSlots(self.model, config.max_loras, config.max_lora_rank, self.device)
        self.kv_caches: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.steps = 0

    @torch.inference_mode()
    def run(self) -> None:
        """Until rank 0 sends Stop (or the group breaks, which raises: the worker's health check sees it)."""
        while True:
            before = None
            if self.pipeline.first:
                msg = self.group.broadcast_object()
            else:
                msg, before = self.pipeline.receive()
            if isinstance(msg, Stop):
                self.pipeline.pass_on(msg)
                self.pipeline.flush()
                return
            self.handle(msg, before)

    def handle(self, msg: Setup | Forward | Adapter | Score | Targets | Logits,
               before: torch.Tensor | None = None) -> None:
        """before: a later stage's input, the previous stage's hidden states of a Forward."""
        hidden_size, dtype, dev = self.model.hidden_size, self.model.dtype, self.device
        if isinstance(msg, Setup):
            slots = msg.num_blocks * self.block_size
            self.kv_caches = (self.model.make_kv_caches(slots, dev, state_slots=msg.state_rows) if self.model.hybrid
                              else self.model.make_kv_caches(slots, dev))
            self.pipeline.pass_on(msg)
        elif isinstance(msg, Forward):
            meta = AttentionMetadata(msg.slot_mapping.to(dev), msg.starts, msg.lens,
                                     [s.to(dev) for s in msg.context_slots], state_slots=msg.state_slots,
                                     state_sources=msg.state_sources, state_saves=msg.state_saves)
            meta.finalize(dev, dtype)
            self.adapters.step.set(msg.lora, dtype, dev)  # the grouped form's indices too, never a stale step's
            hidden = self.model(msg.input_ids.to(dev), msg.positions.to(dev), self.kv_caches, meta, self.backend,
                                hidden=before)
            self.pipeline.pass_on(msg, hidden)
            self.steps += 1
        elif isinstance(msg, Adapter):
            if msg.path is None:
                self.adapters.clear(msg.slot)
            else:  # rank 0 read and checked it; a rank that cannot read it raises, which breaks the group
                self.adapters.write(msg.slot, read_adapter(msg.name, msg.path, self.adapters.max_rank, dtype))
        elif isinstance(msg, Score):
            rows = torch.empty(len(msg.targets), hidden_size, dtype=dtype, device=dev)
            temps = msg.temps.to(dev) if msg.temps is not None else None
            self.tp.run_score(rows, msg.targets.to(dev), msg.ks, msg.mode, msg.rows_per_block, temps, msg.token_ids,
                              msg.ranks)
        elif isinstance(msg, Targets):
            rows = torch.empty(len(msg.targets), hidden_size, dtype=dtype, device=dev)
            self.tp.run_targets(rows, msg.targets.to(dev))
        elif isinstance(msg, Logits):
            self.tp.run_logits(torch.empty(msg.rows, hidden_size, dtype=dtype, device=dev))
