"""Scoring rows: the compact, block-wise projection, plus a per-position log-sum-exp store so that a row whose
log-sum-exp is already known (a cached position scored before) costs one dot product instead of a vocab-wide
projection: logprob(t) = h . W[t] - logsumexp(h . W). Exact either way (float32).

Batch-invariant mode never takes the shortcut: its dot product and subtraction round unlike the tiled projection's
log-softmax, so a row's bits would follow whether its position was cached. Cached rows still come from the
hidden-state store, whose rows have the fresh rows' bits in that mode."""

from __future__ import annotations

import torch

from engine.logprobs import score_rows
from engine.models import CausalLM
from engine.outputs import TokenLogprob
from engine.parallel.driver import TensorParallel


class RowScorer:
    def __init__(self, model: CausalLM, mode: str, rows_per_block: int, num_slots: int, device: torch.device,
                 lse_store: bool, batch_invariant: bool = False, parallel: TensorParallel | None = None) -> None:
        """parallel: the model is split over ranks; its vocab-parallel head scores the rows (same results)."""
        self.model, self.mode, self.rows_per_block = model, mode, rows_per_block
        self.head = parallel or model
        self.score_rows = parallel.score_rows if parallel is not None else score_rows
        self.invariant = batch_invariant
        # NaN = unknown. Only raw_logprobs needs it: raw_logits rows are a dot product already.
        self.lse = (torch.full((num_slots,), float("nan"), dtype=torch.float32, device=device)
                    if lse_store and mode == "raw_logprobs" and not batch_invariant else None)

    def forget(self, slots: torch.Tensor) -> None:
        """Slots computed anew hold new content: their old log-sum-exp no longer applies."""
        if self.lse is not None:
            self.lse.index_fill_(0, slots, float("nan"))

    def score(self, hidden: torch.Tensor, targets: torch.Tensor, ks: list[int], slots: torch.Tensor,
              cached: torch.Tensor) -> tuple[list[TokenLogprob], list[list[TokenLogprob] | None]]:
        """hidden: [R, H] pre-norm rows; targets, slots: [R]; cached: [R] bool, rows at cached positions
        (only those may take the shortcut: a fresh row's slot may not be final yet)."""
        device = hidden.device
        need_k = torch.tensor([k > 0 for k in ks], device=device, dtype=torch.bool)
        values: list[TokenLogprob | None] = [None] * len(ks)
        tops: list[list[TokenLogprob] | None] = [None] * len(ks)
        if self.invariant:
            self._full(hidden, targets, ks, slots, torch.ones_like(cached), values, tops)
        elif self.mode == "raw_logits":
            self._full(hidden, targets, ks, slots, ~cached | need_k, values, tops)
            self._fast(hidden, targets, slots, cached & ~need_k, values)
        elif self.lse is not None:
            # Fresh rows first: they fill in the log-sum-exp that cached rows of the same positions, shared in
            # this very step by other requests, then read.
            self._full(hidden, targets, ks, slots, ~cached | need_k, values, tops)
            rest = cached & ~need_k
            known = rest & ~torch.isnan(self.lse[slots])
            self._full(hidden, targets, ks, slots, rest & ~known, values, tops)
            self._fast(hidden, targets, slots, known, values)
        else:
            self._full(hidden, targets, ks, slots, torch.ones_like(cached), values, tops)
        # Every row went through _full or _fast above, so no None is left in `values`; mypy cannot follow that.
        return values, tops  # type: ignore[return-value]

    def _full(self, hidden: torch.Tensor, targets: torch.Tensor, ks: list[int], slots: torch.Tensor,
              mask: torch.Tensor, values: list, tops: list) -> None:
        rows = mask.nonzero()[:, 0]
        if not len(rows):
            return
        sel = rows.tolist()
        v, t, lse = self.score_rows(hidden[rows], self.model.compute_logits, targets[rows], [ks[i] for i in sel],
                               self.mode, self.rows_per_block, self.invariant)
        for j, i in enumerate(sel):
            values[i], tops[i] = v[j], t[j]
        if self.lse is not None:
            self.lse.index_copy_(0, slots[rows], lse)

    def _fast(self, hidden: torch.Tensor, targets: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
              values: list) -> None:
        rows = mask.nonzero()[:, 0]
        if not len(rows):
            return
        picked = self.head.target_logits(hidden[rows], targets[rows])  # [F]
        if self.lse is not None:
            picked = picked - self.lse[slots[rows]]
        for i, val, tok in zip(rows.tolist(), picked.tolist(), targets[rows].tolist(), strict=True):
            values[i] = (val, tok)
