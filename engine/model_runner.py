"""Runs one scheduled step: lays the chunks out flat, runs the model, projects only the rows it needs.
Knows nothing of HTTP, Ray or text."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.attention import AttentionMetadata, TorchPagedAttention
from engine.config import EngineConfig
from engine.logprobs import row_scores, top_k_rows
from engine.outputs import TokenLogprob
from engine.sampler import sample
from engine.scheduler import SchedulerOutput
from engine.scorer import RowScorer


@dataclass
class ChunkResult:
    # Scoring rows produced in this chunk, in position order (empty when none).
    score_logprobs: list[TokenLogprob]
    score_top: list[list[TokenLogprob] | None]
    # The token sampled from the chunk's last row, when the chunk completes a generating request's context.
    sampled: int | None = None
    sampled_logprob: TokenLogprob | None = None
    sampled_top: list[TokenLogprob] | None = None


class ModelRunner:
    def __init__(self, model: torch.nn.Module, config: EngineConfig, device: torch.device,
                 num_blocks: int) -> None:
        self.model = model
        self.config = config
        self.device = device
        self.block_size = config.block_size
        self.backend = TorchPagedAttention()
        layers = len(model.model.layers)
        dtype = model.model.embed_tokens.weight.dtype
        shape = (num_blocks * self.block_size, model.num_kv_heads, model.head_dim)
        # One [slots, Hkv, D] tensor per layer for K and for V; slot = block * block_size + offset.
        self.kv_caches = [(torch.zeros(shape, dtype=dtype, device=device),
                           torch.zeros(shape, dtype=dtype, device=device)) for _ in range(layers)]
        self._offsets = torch.arange(self.block_size, device=device)
        # The last layer's hidden state (before the row-wise final norm) of every computed position, by KV slot,
        # so a scoring row in a cached block needs only the LM head. hidden/(2 x layers x kv_heads x head_dim)
        # of the KV cache's size: 5% for SmolLM2, 6% for an 8B Llama.
        hidden = model.config.hidden_size
        store = config.hidden_state_store and config.enable_prefix_cache
        self.hidden_store = (torch.zeros(num_blocks * self.block_size, hidden, dtype=dtype, device=device)
                             if store else None)
        self.scorer = RowScorer(model.model.norm, model.lm_head, config.logprobs_mode, config.score_rows_per_block,
                                num_blocks * self.block_size, device, lse_store=store)

    @staticmethod
    def bytes_per_block(model: torch.nn.Module, block_size: int) -> int:
        elem = model.model.embed_tokens.weight.element_size()
        return 2 * len(model.model.layers) * block_size * model.num_kv_heads * model.head_dim * elem

    @torch.inference_mode()
    def execute(self, sched: SchedulerOutput, generators: dict[str, torch.Generator]) -> list[ChunkResult]:
        ids: list[int] = []
        positions: list[torch.Tensor] = []
        new_slots: list[torch.Tensor] = []
        meta = AttentionMetadata(slot_mapping=torch.empty(0), starts=[], lens=[], context_slots=[])
        score_idx: list[int] = []
        score_tgt: list[int] = []
        score_k: list[int] = []
        score_count: list[int] = []
        score_slot: list[int] = []
        score_cached: list[bool] = []
        sample_idx: list[int] = []
        sample_chunk: list[int] = []
        stored_slots: list[int] = []  # scoring rows read from the hidden-state store
        total = sched.num_tokens
        offset = 0
        for ci, chunk in enumerate(sched.chunks):
            seq, start, n = chunk.seq, chunk.start, chunk.num_tokens
            table = torch.tensor(seq.block_table, device=self.device, dtype=torch.long)
            slots = (table[:, None] * self.block_size + self._offsets[None, :]).flatten()
            if n > 0:
                ids.extend(seq.token_ids[start:start + n])
                positions.append(torch.arange(start, start + n, device=self.device))
                new_slots.append(slots[start:start + n])
                meta.starts.append(start)
                meta.lens.append(n)
                meta.context_slots.append(slots[:start + n])
            count = 0
            if seq.input_token_logprobs is not None:
                # Row p scores token p+1; rows already produced (before a preemption) are not redone.
                lo = seq.next_score_position
                hi = min(seq.last_score_position, start + n - 1)
                for p in range(lo, hi + 1):
                    slot = seq.block_table[p // self.block_size] * self.block_size + p % self.block_size
                    score_slot.append(slot)
                    score_cached.append(p < start)
                    if p < start:  # a cached position: its hidden state is in the store
                        assert self.hidden_store is not None, "cached scoring row without a hidden store"
                        score_idx.append(total + len(stored_slots))
                        stored_slots.append(slot)
                    else:
                        score_idx.append(offset + p - start)
                    score_tgt.append(seq.token_ids[p + 1])
                    score_k.append(seq.params.top_logprobs_num)
                count = max(0, hi - lo + 1)
            score_count.append(count)
            if seq.generates and n > 0 and start + n == seq.num_tokens:
                sample_idx.append(offset + n - 1)
                sample_chunk.append(ci)
            offset += n
        if total > 0:
            meta.slot_mapping = torch.cat(new_slots)
            meta.finalize(self.device, self.model.model.embed_tokens.weight.dtype)
            hidden = self.model(torch.tensor(ids, device=self.device), torch.cat(positions),
                                self.kv_caches, meta, self.backend)  # [T, hidden]
            if self.hidden_store is not None:
                self.hidden_store.index_copy_(0, meta.slot_mapping, hidden)
                self.scorer.forget(meta.slot_mapping)
        else:  # every request in the step is served from the cache: no transformer layer runs
            hidden = torch.empty(0, self.model.config.hidden_size, device=self.device,
                                 dtype=self.model.model.embed_tokens.weight.dtype)
        if stored_slots:
            assert self.hidden_store is not None
            hidden = torch.cat([hidden, self.hidden_store[torch.tensor(stored_slots, device=self.device)]])

        results = [ChunkResult([], []) for _ in sched.chunks]
        if score_idx:
            values, tops = self.scorer.score(hidden[torch.tensor(score_idx, device=self.device)],
                                             torch.tensor(score_tgt, device=self.device), score_k,
                                             torch.tensor(score_slot, device=self.device),
                                             torch.tensor(score_cached, device=self.device))
            at = 0
            for ci, count in enumerate(score_count):
                results[ci].score_logprobs = values[at:at + count]
                results[ci].score_top = tops[at:at + count]
                at += count
        if sample_idx:
            self._sample(hidden[torch.tensor(sample_idx, device=self.device)], sample_chunk, sched, results,
                         generators)
        return results

    def _sample(self, rows: torch.Tensor, chunk_ids: list[int], sched: SchedulerOutput,
                results: list[ChunkResult], generators: dict[str, torch.Generator]) -> None:
        seqs = [sched.chunks[ci].seq for ci in chunk_ids]
        # [B, V] with B <= max_num_seqs: bounded like the scoring blocks.
        logits = self.model.lm_head(self.model.model.norm(rows)).float()
        tokens = sample(logits, [s.params for s in seqs], [generators[s.request_id] for s in seqs])
        want = [s.params.return_logprob for s in seqs]
        values = row_scores(logits, self.config.logprobs_mode) if any(want) else None
        picked = values.gather(1, tokens[:, None])[:, 0].tolist() if values is not None else None
        tops = top_k_rows(values, [s.params.top_logprobs_num if s.params.return_logprob else 0 for s in seqs]) \
            if values is not None else [None] * len(seqs)
        for j, (ci, tok) in enumerate(zip(chunk_ids, tokens.tolist(), strict=True)):
            results[ci].sampled = tok
            if want[j] and picked is not None:
                results[ci].sampled_logprob = (picked[j], tok)
                results[ci].sampled_top = tops[j]
