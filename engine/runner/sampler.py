"""The sampler: a pure function of float32 logits and per-row parameters. Each row draws from its own
torch.Generator, so a seeded request gets the same tokens whatever else shares the batch."""

from __future__ import annotations

import torch

from protocol.sampling import SamplingParams
from rulebook.rules import MIN_TEMPERATURE


def apply_filters(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """Temperature, then top-k, top-p and min-p masks. logits: [B, V] float32 (non-greedy rows)."""
    device = logits.device
    temp = torch.tensor([p.temperature for p in params], device=device, dtype=torch.float32)
    # Greedy rows never get here; the clamp keeps a caller that skips that rule from dividing by ~0.
    x = logits / temp.clamp_min(MIN_TEMPERATURE)[:, None]
    vocab = x.shape[-1]
    if not any(_filters(p, vocab) for p in params):
        # Temperature only (prime-rl's teacher call: temperature 1, top_p 1): the masks below would keep every
        # token, so their vocabulary-wide sort and scatter would give x back, value for value.
        return x
    sorted_x, order = x.sort(dim=-1, descending=True)
    rank = torch.arange(vocab, device=device)[None, :]
    top_k = torch.tensor([p.top_k if p.top_k > 0 else vocab for p in params], device=device)
    remove = rank >= top_k[:, None]
    probs = sorted_x.masked_fill(remove, float("-inf")).softmax(dim=-1)
    top_p = torch.tensor([p.top_p for p in params], device=device, dtype=torch.float32)
    # Drop a token once the mass before it already reaches top_p (the first token always stays).
    remove |= ((probs.cumsum(dim=-1) - probs) >= top_p[:, None]) & (top_p[:, None] < 1.0)
    min_p = torch.tensor([p.min_p for p in params], device=device, dtype=torch.float32)
    remove |= probs < (min_p[:, None] * probs[:, :1])
    remove[:, 0] = False
    sorted_x = sorted_x.masked_fill(remove, float("-inf"))
    return torch.empty_like(x).scatter_(1, order, sorted_x)


def _filters(p: SamplingParams, vocab: int) -> bool:
    """Whether a row's top-k, top-p or min-p can drop a token."""
    return 0 < p.top_k < vocab or p.top_p < 1.0 or p.min_p > 0.0


def sample(logits: torch.Tensor, params: list[SamplingParams],
           generators: list[torch.Generator]) -> torch.Tensor:
    """logits: [B, V] float32 raw logits. Returns [B] token ids."""
    out = logits.argmax(dim=-1)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        filtered = apply_filters(logits[rows], [params[i] for i in rows])
        probs = filtered.softmax(dim=-1)
        # No NaN reaches the draw: a row whose probabilities are not finite (non-finite logits from the model)
        # takes its argmax rather than the id 0 that argmax over NaN gives.
        sound = torch.isfinite(probs).all(dim=-1).tolist()
        for j, i in enumerate(rows):
            if not sound[j]:
                continue
            # Exponential race (Gumbel-max in another form): argmax(p / E), E ~ Exp(1), draws from p.
            noise = torch.empty_like(probs[j]).exponential_(generator=generators[i])
            out[i] = (probs[j] / noise).argmax()
    return out
