"""Runs one scheduled step: lays the chunks out flat, runs the model, projects only the rows it needs.
Knows nothing of HTTP, Ray or text.

A step is five verbs in two halves. launch: prepare (the flat batch and a plan of which rows score and which sample)
and run_stage (the transformer over the new tokens, through this rank's pipeline stage). finish: collect (the last
stage's hidden states, into the store), score (the scoring rows) and sample (one row per generating request whose
context is complete). With pipeline overlap the engine launches the next step before it finishes this one."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.config import EngineConfig
from engine.core.scheduler import SchedulerOutput
from engine.invariant.mode import StepLimits, set_batch_invariant
from engine.layers.attention import AttentionBackend, VarlenPagedAttention
from engine.layers.varlen import varlen_attention_reference
from engine.models.llama import LlamaForCausalLM
from engine.parallel.driver import TensorParallel
from engine.runner.attention_choice import choose_attention
from engine.runner.decode_graphs import DecodeGraphs
from engine.runner.logprobs import row_scores, target_ranks, token_id_rows, top_k_rows
from engine.runner.lora import LoraManager
from engine.runner.sampler import sample
from engine.runner.score_chunks import score_chunk_rows
from engine.runner.scorer import RowRequest, RowScorer
from engine.runner.step_plan import ChunkResult, ScorePlan, StepPlan, StepPlanner
from engine.runner.vision import VisionEncoder

log = logging.getLogger(__name__)


@dataclass
class Launched:
    """A step launched and not yet finished: its schedule, its plan, and this rank's stage output."""

    sched: SchedulerOutput
    plan: StepPlan
    hidden: torch.Tensor | None  # [T, hidden] through stage 0 (None: no new token)


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, config: EngineConfig, device: torch.device, num_blocks: int,
                 parallel: TensorParallel | None = None, lora: LoraManager | None = None,
                 max_model_len: int | None = None, state_rows: int = 0) -> None:
        """parallel: rank 0's handle on the other ranks when the model is split (model is then this rank's
        shard); it announces each forward and runs the vocab-parallel LM head. max_model_len: the longest
        context (sizes the decode graphs' block table; default: the model's max_position_embeddings). state_rows: a
        hybrid's state rows, running slots and prefix-cache snapshots (engine/core/state_slots.py)."""
        self.model = model
        self.parallel = parallel
        self.lora = lora
        self.forwards = 0  # transformer forwards run (steps not served wholly from the cache)
        self.config = config
        self.device = device
        self.block_size = config.block_size
        self.invariant = config.batch_invariant
        blockers = model.batch_invariant_blockers() if self.invariant else []
        if blockers:  # refused at start rather than served with bits that follow the batch
            raise ValueError(f"batch_invariant is not available for {type(model).__name__}: the mode does not cover "
                             f"{'; '.join(blockers)}")
        set_batch_invariant(model, self.invariant, StepLimits.of(config))
        self.backend: AttentionBackend = choose_attention(config, model, device)
        num_slots = num_blocks * self.block_size
        # The varlen backend gets one block past the pool's: the decode graphs' padding rows write and read it.
        varlen = isinstance(self.backend, VarlenPagedAttention)
        slots = num_slots + (self.block_size if varlen else 0)
        # Only a hybrid takes state rows (a family's own make_kv_caches may not know the argument).
        self.kv_caches = (model.make_kv_caches(slots, device, state_slots=state_rows) if model.hybrid
                          else model.make_kv_caches(slots, device))
        # The last layer's hidden state (before the row-wise final norm) of every computed position, by KV slot,
        # so a scoring row in a cached block needs only the LM head. hidden/(2 x layers x kv_heads x head_dim)
        # of the KV cache's size: 5% for SmolLM2, 6% for an 8B Llama.
        store = config.hidden_state_store and config.enable_prefix_cache
        self.hidden_store = (torch.zeros(num_slots, model.hidden_size, dtype=model.dtype, device=device)
                             if store else None)
        # After the KV cache and the store: the chunk size on CUDA follows the memory they leave.
        self.planner = StepPlanner(device, self.block_size, model.dtype, varlen, self.hidden_store is not None,
                                   config.max_num_seqs, context_slots=parallel is not None, mrope=model.multimodal)
        self.vision = VisionEncoder(model, device) if model.multimodal else None
        self.score_rows = score_chunk_rows(config, int(model.config.vocab_size), device)
        self.scorer = RowScorer(model, config.value_mode, self.score_rows, num_slots, device,
                                lse_store=store, batch_invariant=self.invariant, parallel=parallel)
        self.graphs: DecodeGraphs | None = None
        if (varlen and self.backend.kernel is not varlen_attention_reference and config.cuda_graphs
                and parallel is None and device.type == "cuda" and not model.multimodal and not model.hybrid):
            self.graphs = self.decode_graphs(num_blocks, max_model_len, capture=True)

    def decode_graphs(self, num_blocks: int, max_model_len: int | None, capture: bool) -> DecodeGraphs | None:
        """Decode graphs over this runner's model and caches (capture=False: the padded eager path, for tests);
        None, said in the log, when the model cannot be captured (e.g. a host sync in one of its layers)."""
        assert isinstance(self.backend, VarlenPagedAttention)
        max_len = max_model_len or int(self.model.config.max_position_embeddings)
        try:
            return DecodeGraphs(
                lambda ids, pos, meta: self.model(ids, pos, self.kv_caches, meta, self.backend), self.backend,
                self.model.hidden_size, self.model.dtype, self.device, self.config.max_num_seqs,
                -(-max_len // self.block_size), scratch_block=num_blocks, capture=capture)
        except Exception as e:  # noqa: BLE001  # any capture failure: run eagerly, as without graphs
            log.info("decode CUDA graphs off: capture failed (%s: %s)", type(e).__name__, e)
            return None

    @staticmethod
    def bytes_per_block(model: LlamaForCausalLM, block_size: int) -> int:
        return block_size * model.kv_bytes_per_token()

    @torch.inference_mode()
    def launch(self, sched: SchedulerOutput) -> Launched:
        """The step's first half: its plan, and the transformer through this rank's stage; with pipeline stages the
        later stages then run it while this rank goes on (finish takes it back)."""
        plan = self.prepare(sched)
        return Launched(sched, plan, self.run_stage(plan))

    @torch.inference_mode()
    def finish(self, step: Launched, generators: dict[str, torch.Generator]) -> list[ChunkResult]:
        """The step's second half, in launch order: the last stage's hidden states (into the store), then the scoring,
        sampling and pooled rows."""
        hidden = self.collect(step.plan, step.hidden)  # [T + stored rows, hidden]
        results = [ChunkResult([], []) for _ in step.sched.chunks]
        self.score(hidden, step.plan.scores, results)
        self.sample(hidden, step.plan.sample_rows, step.sched, results, generators)
        self.pool(hidden, step.plan.pool_rows, results)
        return results

    def prepare(self, sched: SchedulerOutput) -> StepPlan:
        """Lay the chunks out flat in batch order; plan which rows score and which sample (step_plan.py)."""
        return self.planner.prepare(sched)

    # --- forward ----------------------------------------------------------------------------------
    def run_stage(self, plan: StepPlan) -> torch.Tensor | None:
        """This rank's layers over the step's new tokens ([T, hidden]; None when the step has none), handed on to
        the next pipeline stage when there is one."""
        hidden = None
        if plan.input_ids is not None:
            assert plan.positions is not None
            msg = None
            if self.parallel is not None:
                msg = self.parallel.announce_forward(plan.input_ids, plan.positions, plan.meta, plan.lora_rows)
            self.forwards += 1
            if self.lora is not None:
                self.lora.set_step(plan.lora_rows)
            # A captured graph holds no adapter: a step with adapter rows runs eagerly.
            if self.graphs is not None and not plan.lora_rows and self.graphs.fits(plan.meta):
                hidden = self.graphs.run(plan.input_ids, plan.positions, plan.meta)  # [T, H]
            elif self.vision is not None:  # a vision-language model: its image rows, when the step has any
                hidden = self.model(plan.input_ids, plan.positions, self.kv_caches, plan.meta, self.backend,
                                    vision=self.vision.rows(plan.image_chunks))
            else:
                hidden = self.model(plan.input_ids, plan.positions, self.kv_caches, plan.meta, self.backend)
            if self.parallel is not None and msg is not None:  # pipeline stages: on to the next one
                self.parallel.launch_forward(msg, hidden)
        return hidden

    def collect(self, plan: StepPlan, hidden: torch.Tensor | None) -> torch.Tensor:
        """The last layer's hidden states of the new tokens, then those the scoring rows read from the store:
        [T + stored rows, hidden]: the last stage's (rank 0's own run_stage output with one stage), kept in the store
        for later scoring rows. Steps are collected in launch order, so a stored row a step reads was written by
        every earlier step first."""
        if hidden is not None:
            if self.parallel is not None:
                hidden = self.parallel.collect_forward(hidden, hidden.shape[0])
            if self.hidden_store is not None:
                self.hidden_store.index_copy_(0, plan.meta.slot_mapping, hidden)
                self.scorer.forget(plan.meta.slot_mapping)
        else:  # every request in the step is served from the cache: no transformer layer runs
            hidden = torch.empty(0, self.model.hidden_size, device=self.device, dtype=self.model.dtype)
        if plan.scores.stored:
            assert self.hidden_store is not None
            hidden = torch.cat([hidden, self.hidden_store[torch.cat(plan.scores.stored)]])
        return hidden

    # --- score and sample -------------------------------------------------------------------------
    def score(self, hidden: torch.Tensor, plan: ScorePlan, results: list[ChunkResult]) -> None:
        if not plan.rows:
            return
        got = self.scorer.score(hidden[torch.tensor(plan.rows, device=self.device)], RowRequest(
            torch.tensor(plan.targets, device=self.device), plan.top_k, torch.cat(plan.slots),
            torch.tensor(plan.cached, device=self.device), plan.temps, plan.token_ids, plan.ranks))
        at = 0
        for result, count in zip(results, plan.counts, strict=True):
            result.score_logprobs = got.values[at:at + count]
            result.score_top = got.tops[at:at + count]
            result.score_token_ids = got.token_ids[at:at + count]
            result.score_ranks = got.ranks[at:at + count]
            at += count

    def pool(self, hidden: torch.Tensor, rows: list[tuple[int | None, int, int]], results: list[ChunkResult]) -> None:
        """Each classify request's raw scores, from its pooled row: of this step's forward, or (computed in an
        earlier step or by another request whose blocks it shares) of the hidden-state store."""
        if not rows:
            return
        picked = []
        for fresh, slot, _ in rows:
            if fresh is None:
                assert self.hidden_store is not None, "pooled position cached without a hidden-state store"
                picked.append(self.hidden_store[slot])
            else:
                picked.append(hidden[fresh])
        scores = self.model.classify(torch.stack(picked)).tolist()  # [P, num_labels]
        for (_, _, ci), row in zip(rows, scores, strict=True):
            results[ci].pooled = row

    def sample(self, hidden: torch.Tensor, rows: list[tuple[int, int]], sched: SchedulerOutput,
               results: list[ChunkResult], generators: dict[str, torch.Generator]) -> None:
        """rows: (row in hidden, chunk index) of each chunk whose last row samples."""
        if not rows:
            return
        seqs = [sched.chunks[ci].seq for _, ci in rows]
        # [B, V] with B <= max_num_seqs: bounded like the scoring blocks.
        head = self.parallel or self.model  # split: the sampler's filters need whole rows, gathered
        logits = head.compute_logits(hidden[torch.tensor([r for r, _ in rows], device=self.device)]).float()
        tokens = sample(logits, [s.params for s in seqs], [generators[s.request_id] for s in seqs])
        want = [s.params.return_logprob for s in seqs]
        if any(want) and self.config.logprobs_mode == "processed_logprobs":
            # vLLM's processed logprobs: of the logits the sampler draws from, after the request's temperature (a
            # greedy request's are the raw ones). Top-k / top-p filters are not applied (the ingress refuses them).
            temps = [p.temperature if p.temperature > 0 else 1.0 for p in (s.params for s in seqs)]
            if any(t != 1.0 for t in temps):
                logits = logits / torch.tensor(temps, device=logits.device)[:, None]
        values = row_scores(logits, self.config.value_mode, self.invariant) if any(want) else None
        sampled_values = values.gather(1, tokens[:, None])[:, 0] if values is not None else None
        picked = sampled_values.tolist() if sampled_values is not None else None
        tops = top_k_rows(values, [s.params.top_logprobs_num if s.params.return_logprob else 0 for s in seqs]) \
            if values is not None else [None] * len(seqs)
        asked = [s.params.output_token_ids for s in seqs]
        cands = token_id_rows(values, asked) if values is not None and any(a is not None for a in asked) \
            else [None] * len(seqs)
        ranked = [w and s.params.return_output_ranks for w, s in zip(want, seqs, strict=True)]
        ranks = target_ranks(values, sampled_values, ranked) if values is not None else [None] * len(seqs)
        for j, ((_, ci), tok) in enumerate(zip(rows, tokens.tolist(), strict=True)):
            results[ci].sampled = tok
            if want[j] and picked is not None:
                results[ci].sampled_logprob = (picked[j], tok)
                results[ci].sampled_top = tops[j]
                results[ci].sampled_token_ids = cands[j]
                results[ci].sampled_rank = ranks[j]
