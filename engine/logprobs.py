"""Compact projection: final norm + LM head + log-softmax over only the rows that are needed, in fixed-size
blocks of rows, so scoring never materializes [L, vocab] logits whatever the prompt length."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from engine.outputs import TokenLogprob


def row_scores(logits: torch.Tensor, mode: str) -> torch.Tensor:
    """Per-token values in the engine's logprobs mode, in float32, from raw logits: [R, V] -> [R, V]."""
    logits = logits.float()
    return F.log_softmax(logits, dim=-1) if mode == "raw_logprobs" else logits


def top_k_rows(values: torch.Tensor, ks: list[int]) -> list[list[TokenLogprob] | None]:
    """Each row's own k (a batch may mix k's): one topk at the widest k, then each row keeps its first k."""
    kmax = max(ks, default=0)
    if kmax <= 0:
        return [None] * len(ks)
    top_v, top_i = torch.topk(values, min(kmax, values.shape[-1]), dim=-1)
    tv, ti = top_v.tolist(), top_i.tolist()
    return [list(zip(tv[r][:k], ti[r][:k], strict=True)) if k > 0 else None for r, k in enumerate(ks)]


def score_rows(hidden: torch.Tensor, compute_logits: Callable[[torch.Tensor], torch.Tensor], targets: torch.Tensor,
               ks: list[int], mode: str, rows_per_block: int
               ) -> tuple[list[TokenLogprob], list[list[TokenLogprob] | None], torch.Tensor]:
    """hidden: [R, hidden] pre-norm rows; compute_logits: the model's final norm + LM head over some rows;
    targets: [R] the token each row scores.
    Returns per row (value, target), its top-k list (None where its k is 0), and [R] float32 log-sum-exp of
    its raw logits (kept by the caller so a later score of the same position needs no projection)."""
    values: list[TokenLogprob] = []
    tops: list[list[TokenLogprob] | None] = []
    lses: list[torch.Tensor] = []
    for lo in range(0, hidden.shape[0], rows_per_block):
        hi = min(lo + rows_per_block, hidden.shape[0])
        logits = compute_logits(hidden[lo:hi]).float()  # [rows, V]: the only vocab-wide buffers
        # torch's float32 log_softmax, as transformers users compute it: `logits - logsumexp` is as accurate but
        # rounds differently (~2.5e-5 on a 49k vocabulary), which adds up over a multi-token continuation.
        scores = row_scores(logits, mode)
        # The log-sum-exp kept for the shortcut is the one log_softmax used, so shortcut rows match it too.
        lses.append(logits[:, 0] - scores[:, 0] if mode == "raw_logprobs" else torch.logsumexp(logits, dim=-1))
        t = targets[lo:hi]
        picked = scores.gather(1, t[:, None])[:, 0]
        values.extend(zip(picked.tolist(), t.tolist(), strict=True))
        tops.extend(top_k_rows(scores, ks[lo:hi]))
    return values, tops, torch.cat(lses)
