"""The LM head split by vocabulary (Megatron's vocab-parallel cross-entropy, as inference): every rank projects the
same rows onto its range [lo, hi) of the vocabulary and the ranks combine small per-row values, never the logits:

    log p(t) = z_t - (m + log sum_r sum_{v in r} exp(z_v - m)),   m = max_r max_{v in r} z_v

one all-reduce of the row maxima, one of the sums of exponentials, one of the target logit (only its owner adds a
non-zero), and an all-gather of each rank's local top-k (value, id) candidates, merged by one top-k: O(rows x
(3 + N x 2k)) values per row block instead of O(rows x V). Every rank runs these functions in the same order;
the results are the same on all of them (rank 0 uses them).

Exact: the max and the target are exact under any reduction order; the sum of exponentials is a float32 sum in
another order than torch's log_softmax (differences of a few ulps of the log-sum-exp)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from engine.parallel.group import TPGroup
from engine.runner.logit_buffer import count_at_least, owned_float32, sum_exp
from engine.runner.logprobs import ScoredRows


class VocabShard:
    """This rank's range of the vocabulary and the collectives that combine ranks' rows."""

    def __init__(self, group: TPGroup, lo: int, hi: int, vocab: int) -> None:
        self.group, self.lo, self.hi, self.vocab = group, lo, hi, vocab
        self.width = -(-vocab // group.size)  # every rank's range padded to this for the gathers

    def owned(self, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(mask of targets in this range, their local index, clamped where not owned)."""
        local = targets - self.lo
        mine = (local >= 0) & (local < self.hi - self.lo)
        return mine, local.clamp(0, self.hi - self.lo - 1)

    def target_values(self, local_logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """[R, V_r] float32, [R] global ids -> [R] each row's target logit (summed from its one owner: exact)."""
        mine, idx = self.owned(targets)
        picked = local_logits.gather(1, idx[:, None])[:, 0]
        return self.group.all_reduce(torch.where(mine, picked, torch.zeros_like(picked)))

    def log_sum_exp(self, local_logits: torch.Tensor) -> torch.Tensor:
        """[R, V_r] float32 -> [R] log-sum-exp over the whole vocabulary."""
        m = self.group.all_reduce(local_logits.amax(dim=1), op="max")
        s = self.group.all_reduce(sum_exp(local_logits, m))  # by column slices: no [R, V_r] temporaries
        return m + s.log()

    def top_k(self, local_values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """[R, V_r] -> ([R, k] values, [R, k] global ids) of the whole vocabulary: each rank's local top-k,
        padded with -inf to k (a range narrower than k), gathered and merged by one more top-k. The whole top-k is
        among the candidates: each of its members is in its own rank's local top-k."""
        rows = local_values.shape[0]
        kl = min(k, local_values.shape[1])
        vals = local_values.new_full((rows, k), float("-inf"))
        ids = torch.full((rows, k), -1, dtype=torch.long, device=local_values.device)
        v, i = torch.topk(local_values, kl, dim=1)
        vals[:, :kl], ids[:, :kl] = v, i + self.lo
        all_v = torch.cat(self.group.all_gather(vals), dim=1)  # [R, N k]
        all_i = torch.cat(self.group.all_gather(ids), dim=1)
        top_v, at = torch.topk(all_v, min(k, self.vocab), dim=1)
        return top_v, all_i.gather(1, at)

    def gather_logits(self, local_logits: torch.Tensor) -> torch.Tensor:
        """[R, V_r] -> [R, V] on every rank (the sampling rows: the sampler's filters need the whole row)."""
        rows, n = local_logits.shape[0], self.hi - self.lo
        padded = local_logits.new_zeros(rows, self.width)
        padded[:, :n] = local_logits
        parts = self.group.all_gather(padded)
        return torch.cat(parts, dim=1)[:, :self.vocab]


def score_block(shard: VocabShard, local_logits: torch.Tensor, targets: torch.Tensor, kmax: int, mode: str
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One block of scoring rows. local_logits: [R, V_r] float32 raw logits of this rank's range.
    Returns ([R] values of the targets in `mode`, [R] log-sum-exp, [R, k] top values, [R, k] top ids or None)."""
    lse = shard.log_sum_exp(local_logits)
    picked = shard.target_values(local_logits, targets)
    shift = lse if mode == "raw_logprobs" else torch.zeros_like(lse)
    top_v = top_i = None
    if kmax > 0:
        # log-softmax subtracts one value per row: the top-k of the logits is the top-k of the logprobs.
        top_v, top_i = shard.top_k(local_logits, kmax)
        top_v = top_v - shift[:, None]
    return picked - shift, lse, top_v, top_i


def token_id_values(shard: VocabShard, local_logits: torch.Tensor, ids: list[list[int] | None]) -> torch.Tensor:
    """[R, V_r] float32 -> [R, W] the rows' logits at their asked ids (padded to the longest list W), each summed
    from its one owner (exact), as target_values does for one id per row."""
    width = max((len(i) for i in ids if i), default=0)
    index = torch.tensor([(i or []) + [0] * (width - len(i or [])) for i in ids], dtype=torch.long,
                         device=local_logits.device).reshape(len(ids), width)
    mine, idx = shard.owned(index)
    picked = local_logits.gather(1, idx)
    return shard.group.all_reduce(torch.where(mine, picked, torch.zeros_like(picked)))


def score_rows(shard: VocabShard, hidden: torch.Tensor, local_logits: Callable[[torch.Tensor], torch.Tensor],
               targets: torch.Tensor, ks: list[int], mode: str, rows_per_block: int,
               temps: torch.Tensor | None = None, token_ids: list[list[int] | None] | None = None,
               ranks: list[bool] | None = None) -> ScoredRows:
    """logprobs.score_rows over a split vocabulary, blocks of rows_per_block: the same results (temps: [R] per-row
    temperature or None; token_ids: per row, the ids whose values it also reports; ranks: per row, whether it
    reports its target's rank)."""
    out = ScoredRows([], [], [], torch.empty(0))
    lses: list[torch.Tensor] = []
    for lo in range(0, hidden.shape[0], rows_per_block):
        hi = min(lo + rows_per_block, hidden.shape[0])
        kmax = max(ks[lo:hi], default=0)
        t = targets[lo:hi]
        # [rows, V_r] float32: the block's one vocab-wide buffer (logit_buffer.py), scaled in place.
        logits = owned_float32(local_logits(hidden[lo:hi]), hidden)
        if temps is not None:  # as logprobs.score_rows: a division, as the client's reference writes it
            logits.div_(temps[lo:hi, None])
        picked, lse, top_v, top_i = score_block(shard, logits, t, kmax, mode)
        lses.append(lse)
        out.values.extend(zip(picked.tolist(), t.tolist(), strict=True))
        want = ranks[lo:hi] if ranks else [False] * (hi - lo)
        if any(want):  # each rank counts its range, summed; on the shifted values, as the target's own was shifted
            shift = lse if mode == "raw_logprobs" else torch.zeros_like(lse)
            counts = shard.group.all_reduce(count_at_least(logits, picked, shift)).tolist()
            out.ranks.extend(c if w else None for c, w in zip(counts, want, strict=True))
        else:
            out.ranks.extend([None] * (hi - lo))
        ids = token_ids[lo:hi] if token_ids else None
        if ids and any(i for i in ids):
            shift = lse if mode == "raw_logprobs" else torch.zeros_like(lse)
            vals = (token_id_values(shard, logits, ids) - shift[:, None]).tolist()
            out.token_ids.extend(None if i is None else list(zip(vals[r][:len(i)], i, strict=True))
                                 for r, i in enumerate(ids))
        else:
            out.token_ids.extend(None if ids is None or i is None else [] for i in (ids or [None] * (hi - lo)))
        if top_v is None or top_i is None:
            out.tops.extend([None] * (hi - lo))
            continue
        tv, ti = top_v.tolist(), top_i.tolist()
        out.tops.extend(list(zip(tv[r][:k], ti[r][:k], strict=True)) if k > 0 else None
                        for r, k in enumerate(ks[lo:hi]))
    out.lse = torch.cat(lses) if lses else torch.empty(0)
    return out
