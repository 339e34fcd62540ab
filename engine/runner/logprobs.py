"""Compact projection: final norm + LM head + log-softmax over only the rows that are needed, in fixed-size
blocks of rows, so scoring never materializes [L, vocab] logits whatever the prompt length; a block holds one
vocab-wide tensor, its float32 logits, turned into its values in place (engine/runner/logit_buffer.py)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from engine.runner.logit_buffer import count_at_least, log_softmax_, log_sum_exp, owned_float32
from protocol.outputs import TokenLogprob

# Batch-invariant log-softmax: rows per call, the last tile padded (one shape per call by construction).
ROW_TILE = 64


def row_scores(logits: torch.Tensor, mode: str, invariant: bool = False) -> torch.Tensor:
    """Per-token values in the engine's logprobs mode, in float32, from raw logits: [R, V] -> [R, V].
    invariant: log-softmax in fixed tiles of rows (batch-invariant mode)."""
    logits = logits.float()
    if mode != "raw_logprobs":
        return logits
    return tiled_log_softmax(logits) if invariant else F.log_softmax(logits, dim=-1)


def tiled_log_softmax(logits: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """log_softmax over the last axis of [R, V], ROW_TILE rows per call (the last tile padded), so a row's bits do
    not follow R on any device. (torch's CPU kernel is already row-wise; this holds it to that by construction.)
    out: where the values go (may be `logits` itself: each tile is computed whole before it is written back)."""
    n = logits.shape[0]
    out = torch.empty_like(logits) if out is None else out
    for lo in range(0, n, ROW_TILE):
        hi = min(lo + ROW_TILE, n)
        tile = logits[lo:hi]
        if hi - lo < ROW_TILE:
            tile = torch.cat([tile, tile.new_zeros(ROW_TILE - (hi - lo), tile.shape[1])])
        out[lo:hi] = F.log_softmax(tile, dim=-1)[:hi - lo]
    return out


def values_in_place(logits: torch.Tensor, mode: str, invariant: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """[R, V] float32 (scaled) logits -> (the same tensor holding the values in `mode`, [R] their log-sum-exp).
    torch's float32 log_softmax, as transformers users compute it: `logits - logsumexp` is as accurate but rounds
    differently (~2.5e-5 on a 49k vocabulary), which adds up over a multi-token continuation. The log-sum-exp
    kept for the shortcut is the one log_softmax used, so shortcut rows match it too."""
    if mode != "raw_logprobs":
        return logits, log_sum_exp(logits)
    first = logits[:, 0].clone()
    scores = tiled_log_softmax(logits, out=logits) if invariant else log_softmax_(logits)
    return scores, first - scores[:, 0]


def top_k_rows(values: torch.Tensor, ks: list[int]) -> list[list[TokenLogprob] | None]:
    """Each row's own k (a batch may mix k's): one topk at the widest k, then each row keeps its first k."""
    kmax = max(ks, default=0)
    if kmax <= 0:
        return [None] * len(ks)
    top_v, top_i = torch.topk(values, min(kmax, values.shape[-1]), dim=-1)
    tv, ti = top_v.tolist(), top_i.tolist()
    return [list(zip(tv[r][:k], ti[r][:k], strict=True)) if k > 0 else None for r, k in enumerate(ks)]


@dataclass
class ScoredRows:
    """What score_rows gives back, one entry per row."""

    values: list[TokenLogprob]  # (value, target)
    tops: list[list[TokenLogprob] | None]  # top-k, None where the row's k is 0
    token_ids: list[list[TokenLogprob] | None]  # values of the row's asked token ids, None where none are asked
    lse: torch.Tensor  # [R] float32 log-sum-exp of the (temperature-scaled) logits
    ranks: list[int | None] = field(default_factory=list)  # the target's rank where the row asks it, else None


def score_rows(hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor,
               ks: list[int], mode: str, rows_per_block: int, invariant: bool = False,
               temps: torch.Tensor | None = None, token_ids: list[list[int] | None] | None = None,
               ranks: list[bool] | None = None) -> ScoredRows:
    """hidden: [R, hidden] pre-norm rows; compute_logits: the model's final norm + LM head over some rows, in a
    new tensor that score_rows then overwrites (float32, as logit_buffer.float_logits gives it, for the memory bound
    of score_chunks.py; another dtype costs a float32 copy); targets: [R] the token each row scores.
    temps: [R] float32 temperature per row, or None when every row is at 1 (no extra work): values are then taken
    from logits / T. token_ids: per row, the token ids whose values it also reports (None: none).
    The log-sum-exp is kept by the caller so a later score of the same position needs no projection; it is that
    of the scaled logits, so only rows at T = 1 may be kept.
    invariant: batch-invariant mode (the LM head is tiled by its own flag; log-softmax tiled here).
    ranks: per row, whether it reports its target's rank (None: no row does)."""
    out = ScoredRows([], [], [], torch.empty(0))
    lses: list[torch.Tensor] = []
    for lo in range(0, hidden.shape[0], rows_per_block):
        hi = min(lo + rows_per_block, hidden.shape[0])
        # [rows, V] float32: the block's one vocab-wide buffer, from here on overwritten in place.
        logits = owned_float32(compute_logits(hidden[lo:hi]), hidden)
        if temps is not None:  # a division, as `logits / T` is written by the client's reference
            logits.div_(temps[lo:hi, None])
        scores, lse = values_in_place(logits, mode, invariant)
        lses.append(lse)
        t = targets[lo:hi]
        picked = scores.gather(1, t[:, None])[:, 0]
        out.values.extend(zip(picked.tolist(), t.tolist(), strict=True))
        out.tops.extend(top_k_rows(scores, ks[lo:hi]))
        out.token_ids.extend(token_id_rows(scores, token_ids[lo:hi]) if token_ids else [None] * (hi - lo))
        out.ranks.extend(target_ranks(scores, picked, ranks[lo:hi] if ranks else [False] * (hi - lo)))
    out.lse = torch.cat(lses)
    return out


def token_id_rows(scores: torch.Tensor, ids: list[list[int] | None]) -> list[list[TokenLogprob] | None]:
    """Each row's values at its own token ids, in the order asked: one gather over the rows' ids padded to the
    longest list (a block mixes requests)."""
    width = max((len(i) for i in ids if i), default=0)
    if width == 0:
        return [None if i is None else [] for i in ids]
    index = torch.tensor([(i or []) + [0] * (width - len(i or [])) for i in ids], device=scores.device)
    vals = scores.gather(1, index).tolist()
    return [None if i is None else list(zip(vals[r][:len(i)], i, strict=True)) for r, i in enumerate(ids)]


def target_ranks(scores: torch.Tensor, picked: torch.Tensor, want: list[bool]) -> list[int | None]:
    """vLLM's rank of each row's target: how many tokens have a value >= its own (1 = the most likely; a tie counts
    against it). One compare over the block only when some row asks."""
    if not any(want):
        return [None] * len(want)
    counts = count_at_least(scores, picked).tolist()  # [rows]
    return [c if w else None for c, w in zip(counts, want, strict=True)]
