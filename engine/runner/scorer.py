"""Scoring rows: the compact, block-wise projection, plus a per-position log-sum-exp store so that a row whose
log-sum-exp is already known (a cached position scored before) costs one dot product instead of a vocab-wide
projection: logprob(t) = h . W[t] - logsumexp(h . W). Exact either way (float32).

The store holds the log-sum-exp of the raw logits (temperature 1): a row at another input_logprob_temperature, or one
that asks for top-k, needs the whole row and never takes the shortcut, and its log-sum-exp (of logits / T) is never
stored. A row asking for token ids (its own candidates: on-policy distillation) takes it: each candidate costs one
more dot product, value(t) = h . W[t] - logsumexp, so a warm teacher row needs no vocabulary-wide projection.

Batch-invariant mode never takes the shortcut: its dot product and subtraction round unlike the tiled projection's
log-softmax, so a row's bits would follow whether its position was cached. Cached rows still come from the
hidden-state store, whose rows have the fresh rows' bits in that mode."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial

import torch

from engine.models.llama import LlamaForCausalLM
from engine.parallel.driver import TensorParallel
from engine.runner.logit_buffer import float_logits
from engine.runner.logprobs import score_rows
from protocol.outputs import TokenLogprob

# (row, token) pairs per chunk of the shortcut, per row of the full path's block (see RowScorer._fast).
FAST_PAIRS_PER_ROW = 16


@dataclass
class RowRequest:
    """What the step's scoring rows ask, one entry per row (ScorePlan's)."""

    targets: torch.Tensor  # [R] the token each row scores
    ks: list[int]  # top-k width per row
    slots: torch.Tensor  # [R] KV slot of each row's position
    cached: torch.Tensor  # [R] bool: the position was computed before this step
    temps: list[float]  # input_logprob_temperature per row (1.0 = none)
    token_ids: list[list[int] | None]  # the token ids each row reports, None = none
    ranks: list[bool] = field(default_factory=list)  # whether each row reports its target's rank ([]: none does)


@dataclass
class RowResult:
    values: list[TokenLogprob]
    tops: list[list[TokenLogprob] | None]
    token_ids: list[list[TokenLogprob] | None]
    ranks: list[int | None] = field(default_factory=list)


class RowScorer:
    def __init__(self, model: LlamaForCausalLM, mode: str, rows_per_block: int, num_slots: int, device: torch.device,
                 lse_store: bool, batch_invariant: bool = False, parallel: TensorParallel | None = None) -> None:
        """parallel: the model is split over ranks; its vocab-parallel head scores the rows (same results)."""
        self.model, self.mode, self.rows_per_block = model, mode, rows_per_block
        self.head = parallel or model
        self.score_rows = parallel.score_rows if parallel is not None else score_rows
        self.invariant = batch_invariant
        # NaN = unknown. Only raw_logprobs needs it: raw_logits rows are a dot product already.
        self.lse = (torch.full((num_slots,), float("nan"), dtype=torch.float32, device=device)
                    if lse_store and mode == "raw_logprobs" and not batch_invariant else None)

    def forget(self, slots: torch.Tensor | None = None) -> None:
        """Slots computed anew hold new content: their old log-sum-exp no longer applies (None: every slot, as
        after a weight update)."""
        if self.lse is not None:
            if slots is None:
                self.lse.fill_(float("nan"))
            else:
                self.lse.index_fill_(0, slots, float("nan"))

    def score(self, hidden: torch.Tensor, req: RowRequest) -> RowResult:
        """hidden: [R, H] pre-norm rows. Only rows at cached positions may take the shortcut (a fresh row's slot
        may not be final yet), and only those that need no more than their own value at temperature 1."""
        device = hidden.device
        ranks = req.ranks or [False] * len(req.ks)
        # A rank is counted over the whole row, as a top-k is; token ids are single logits, as the target is.
        whole = [k > 0 or t != 1.0 or r for k, t, r in zip(req.ks, req.temps, ranks, strict=True)]
        need_whole = torch.tensor(whole, device=device, dtype=torch.bool)
        n = len(req.ks)
        out = RowResult([None] * n, [None] * n, [None] * n, [None] * n)  # type: ignore[list-item]  # all filled below
        cached = req.cached
        if self.invariant:
            self._full(hidden, req, torch.ones_like(cached), out)
        elif self.mode == "raw_logits":
            self._full(hidden, req, ~cached | need_whole, out)
            self._fast(hidden, req, cached & ~need_whole, out)
        elif self.lse is not None:
            # Fresh rows first: they fill in the log-sum-exp that cached rows of the same positions, shared in
            # this very step by other requests, then read.
            self._full(hidden, req, ~cached | need_whole, out)
            rest = cached & ~need_whole
            known = rest & ~torch.isnan(self.lse[req.slots])
            self._full(hidden, req, rest & ~known, out)
            self._fast(hidden, req, known, out)
        else:
            self._full(hidden, req, torch.ones_like(cached), out)
        return out

    def _full(self, hidden: torch.Tensor, req: RowRequest, mask: torch.Tensor, out: RowResult) -> None:
        rows = mask.nonzero()[:, 0]
        if not len(rows):
            return
        sel = rows.tolist()
        temps = [req.temps[i] for i in sel]
        scaled = any(t != 1.0 for t in temps)  # the default path builds no temperature tensor
        ids = [req.token_ids[i] for i in sel]
        ranks = [req.ranks[i] for i in sel] if req.ranks else []
        # float_logits: the block's float32 logits with no model-dtype copy (the bound of score_chunks.py).
        got = self.score_rows(hidden[rows], partial(float_logits, self.model), req.targets[rows],
                              [req.ks[i] for i in sel], self.mode, self.rows_per_block, self.invariant,
                              torch.tensor(temps, device=hidden.device) if scaled else None,
                              ids if any(i is not None for i in ids) else None, ranks if any(ranks) else None)
        for j, i in enumerate(sel):
            out.values[i], out.tops[i], out.token_ids[i] = got.values[j], got.tops[j], got.token_ids[j]
            out.ranks[i] = got.ranks[j] if got.ranks else None
        if self.lse is not None:
            if scaled:  # the log-sum-exp of logits / T is not the one the shortcut subtracts
                keep = torch.tensor([t == 1.0 for t in temps], device=hidden.device)
                rows, got.lse = rows[keep], got.lse[keep]
            self.lse.index_copy_(0, req.slots[rows], got.lse)

    def _fast(self, hidden: torch.Tensor, req: RowRequest, mask: torch.Tensor, out: RowResult) -> None:
        """Each row's target, and its token ids if it asks any, as (row, token) pairs: one logit each, minus the
        row's stored log-sum-exp. Pairs go in chunks of FAST_PAIRS_PER_ROW x rows_per_block, whose [pairs, hidden]
        buffers stay within the full path's [rows_per_block, vocab] (every served vocabulary is >= 16 x hidden)."""
        rows = mask.nonzero()[:, 0].tolist()
        if not rows:
            return
        pairs = [(i, int(req.targets[i])) for i in rows]
        for i in rows:
            if req.token_ids[i] is not None:
                out.token_ids[i] = []
                pairs.extend((i, t) for t in req.token_ids[i] or ())
        step = FAST_PAIRS_PER_ROW * self.rows_per_block
        for lo in range(0, len(pairs), step):
            chunk = pairs[lo:lo + step]
            idx = torch.tensor([i for i, _ in chunk], device=hidden.device)
            toks = torch.tensor([t for _, t in chunk], device=hidden.device)
            vals = self.head.target_logits(hidden[idx], toks)  # [pairs]
            if self.lse is not None:
                vals = vals - self.lse[req.slots[idx]]
            for n, ((i, tok), val) in enumerate(zip(chunk, vals.tolist(), strict=True)):
                if lo + n < len(rows):  # the first len(rows) pairs are the targets
                    out.values[i] = (val, tok)
                else:
                    out.token_ids[i].append((val, tok))  # type: ignore[union-attr]  # set to [] above
