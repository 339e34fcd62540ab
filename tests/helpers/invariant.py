"""Drives an attention backend, or a whole model, over a hand-made schedule of steps with a paged KV cache: the
runner's flat layout (requests side by side, each a chunk of positions) without the scheduler, so a test can put
one request's positions in any chunking and company and compare the bits of what comes out."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.layers.attention import AttentionBackend, AttentionMetadata

# One request's chunk in a step: (request name, first position, number of positions).
Chunk = tuple[str, int, int]


@dataclass
class Layout:
    """Each request owns a contiguous run of KV slots (its block table, flattened) from its base."""

    base: dict[str, int]

    @staticmethod
    def of(lengths: dict[str, int], gap: int = 37) -> Layout:
        base, at = {}, 0
        for name, n in lengths.items():
            base[name] = at
            at += n + gap  # gaps: slots are not simply positions
        return Layout(base)

    @property
    def num_slots(self) -> int:
        return max(self.base.values()) + 4096

    def meta(self, step: list[Chunk], device: torch.device) -> AttentionMetadata:
        meta = AttentionMetadata(slot_mapping=torch.empty(0), starts=[], lens=[], context_slots=[])
        new = []
        for name, start, n in step:
            slots = self.base[name] + torch.arange(start + n, device=device)
            meta.starts.append(start)
            meta.lens.append(n)
            meta.context_slots.append(slots)
            new.append(slots[start:])
        meta.slot_mapping = torch.cat(new)
        meta.finalize(device)
        return meta


def run_attention(backend: AttentionBackend, qkv: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]],
                  steps: list[list[Chunk]], scale: float) -> dict[str, torch.Tensor]:
    """qkv: per request [L, Hq, D], [L, Hkv, D], [L, Hkv, D] for positions 0..L-1. Returns per request the
    [L', Hq, D] outputs of the positions the steps computed, in position order."""
    layout = Layout.of({name: q.shape[0] for name, (q, _, _) in qkv.items()})
    _, k0, _ = next(iter(qkv.values()))
    k_cache = torch.zeros(layout.num_slots, *k0.shape[1:], dtype=k0.dtype)
    v_cache = torch.zeros_like(k_cache)
    outs: dict[str, list[torch.Tensor]] = {name: [] for name in qkv}
    for step in steps:
        meta = layout.meta(step, k0.device)
        q = torch.cat([qkv[name][0][s:s + n] for name, s, n in step])
        k = torch.cat([qkv[name][1][s:s + n] for name, s, n in step])
        v = torch.cat([qkv[name][2][s:s + n] for name, s, n in step])
        o = backend.forward(q, k, v, k_cache, v_cache, meta, scale)
        at = 0
        for name, _, n in step:
            outs[name].append(o[at:at + n])
            at += n
    return {name: torch.cat(parts) for name, parts in outs.items() if parts}


@torch.inference_mode()
def run_model(model: torch.nn.Module, backend: AttentionBackend, ids: dict[str, list[int]],
              steps: list[list[Chunk]]) -> dict[str, torch.Tensor]:
    """The model's last hidden states (pre-norm) of each request's computed positions, in position order."""
    layout = Layout.of({name: len(t) for name, t in ids.items()})
    w = model.model.embed_tokens.weight
    shape = (layout.num_slots, model.num_kv_heads, model.head_dim)
    caches = [(torch.zeros(shape, dtype=w.dtype), torch.zeros(shape, dtype=w.dtype)) for _ in model.model.layers]
    outs: dict[str, list[torch.Tensor]] = {name: [] for name in ids}
    for step in steps:
        meta = layout.meta(step, w.device)
        tok = torch.tensor([t for name, s, n in step for t in ids[name][s:s + n]])
        pos = torch.cat([torch.arange(s, s + n) for _, s, n in step])
        h = model(tok, pos, caches, meta, backend)
        at = 0
        for name, _, n in step:
            outs[name].append(h[at:at + n])
            at += n
    return {name: torch.cat(parts) for name, parts in outs.items() if parts}


def chunked(name: str, length: int, sizes: list[int]) -> list[list[Chunk]]:
    """One request alone, in chunks of the given sizes (the last one repeats until the prompt is done)."""
    steps, start, i = [], 0, 0
    while start < length:
        n = min(sizes[min(i, len(sizes) - 1)], length - start)
        steps.append([(name, start, n)])
        start, i = start + n, i + 1
    return steps


def merge(*schedules: list[list[Chunk]]) -> list[list[Chunk]]:
    """Requests run side by side: step i holds every schedule's step i (shorter schedules simply end)."""
    out: list[list[Chunk]] = []
    for i in range(max(len(s) for s in schedules)):
        out.append([c for s in schedules if i < len(s) for c in s[i]])
    return out
