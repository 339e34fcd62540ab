"""Scoring rows: the compact, block-wise projection, plus a per-position log-sum-exp store so that a row whose
log-sum-exp is already known (a cached position scored before) costs one dot product instead of a vocab-wide
projection: logprob(t) = h . W[t] - logsumexp(h . W). Exact either way (float32).

The store holds the log-sum-exp of the raw logits (temperature 1): a row at another input_logprob_temperature, or one
that asks for top-k or token-id values, needs the whole row and never takes the shortcut, and its log-sum-exp (of
logits / T) is never stored.

Batch-invariant mode never takes the shortcut: its dot product and subtraction round unlike the tiled projection's
log-softmax, so a row's bits would follow whether its position was cached. Cached rows still come from the
hidden-state store, whose rows have the fresh rows' bits in that mode."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.models.llama import LlamaForCausalLM
from engine.outputs import TokenLogprob
from engine.parallel.driver import TensorParallel
from engine.runner.logprobs import score_rows


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
        # A rank is counted over the whole row, as a top-k is.
        whole = [k > 0 or t != 1.0 or ids is not None or r for k, t, ids, r in zip(req.ks, req.temps, req.token_ids,
                                                                                  ranks, strict=True)]
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
        got = self.score_rows(hidden[rows], self.model.compute_logits, req.targets[rows], [req.ks[i] for i in sel],
                              self.mode, self.rows_per_block, self.invariant,
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
        rows = mask.nonzero()[:, 0]
        if not len(rows):
            return
        picked = self.head.target_logits(hidden[rows], req.targets[rows])  # [F]
        if self.lse is not None:
            picked = picked - self.lse[req.slots[rows]]
        for i, val, tok in zip(rows.tolist(), picked.tolist(), req.targets[rows].tolist(), strict=True):
            out.values[i] = (val, tok)
