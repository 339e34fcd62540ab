"""Batch-invariant paged attention: a query's output has the same bits whatever else is in the step,
wherever the chunk boundaries fall and however long the context behind it is.

torch's fused CPU attention blocks keys by the key length, and a matmul's bits follow its row count. Here every
query attends its keys in blocks of KEY_BLOCK from position 0, in order (online softmax), and every matmul has
one fixed shape: QUERY_TILE query rows (the query heads of a KV group x positions, padded) against one key block,
batched over tiles with torch.bmm (an item's bits do not follow the batch count at these shapes: K = head_dim or
KEY_BLOCK is never split; tested). A row's bits then depend on its own query and keys only: rows are independent
in a matmul of fixed shape, the max runs along the row, and a block past a query's position (masked) adds exact
zeros with factor exp(0) = 1. So a prefill tile that runs more blocks than a decode step gives the same bits.
Plain torch ops only, so it runs on CUDA too (bitwise invariance there rests on cuBLAS choosing the same kernel
for the same per-item shape: unchecked, no GPU here).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.invariant.row_plan import InvariantModeError, machine_name

if TYPE_CHECKING:  # layers/ imports this package's kernels; the metadata type is only named here
    from engine.layers.attention import AttentionMetadata

KEY_BLOCK = 128
QUERY_TILE = 16
# exp() is taken of max(score - row maximum, FLOOR): never a subnormal float32 nor -inf, which take x86's slow path
# (100-500x slower, measured). A weight under exp(FLOOR) = 1.6e-38 of the maximum's is raised to it: a fixed
# function of the row's own scores, far below float32 resolution. Masked keys get exactly 0 (a 0/1 factor).
FLOOR = -87.0

# Per key block: the first active entry, how many entries from there have keys they must not see, and for those
# the additive mask (0 / -inf) and the factor (1 / 0), [masked, tile rows, KEY_BLOCK].
Block = tuple[int, int, torch.Tensor | None, torch.Tensor | None]
KeyFn = Callable[[int, int], tuple[torch.Tensor, torch.Tensor]]


@dataclass
class TileGroup:
    """Queries attended together: one prefill chunk (its tiles share one request's keys), or every single-token
    request of the step (one tile each, each its own keys). Positions never decrease from tile to tile."""

    rows: torch.Tensor  # [tiles * tile_rows] flat query row of each tile slot (padding repeats a real row)
    real: torch.Tensor  # tile slots holding a real row ...
    dest: torch.Tensor  # ... and the flat rows they go back to
    slots: torch.Tensor  # [requests * key_blocks * KEY_BLOCK] KV slots, padded with each request's first slot
    num_requests: int
    num_tiles: int
    blocks: list[Block]


def tile_rows(groups: int) -> int:
    """Rows per tile: a whole KV group of one position always fits one tile (a decode step's query is one tile)."""
    return -(-groups // QUERY_TILE) * QUERY_TILE


def _group(reqs: list[tuple[int, int, int, torch.Tensor]], groups: int, repeat: int, device: torch.device,
           dtype: torch.dtype) -> TileGroup:
    """reqs: (first flat token row, start, n, context slots) in non-decreasing position order. repeat: entries
    per tile in the attention batch (the KV heads, when each tile has its own keys)."""
    qt = tile_rows(groups)
    rows, qpos, real, dest, slots = [], [], [], [], []
    num_tiles = 0
    ctx_max = max(start + n for _, start, n, _ in reqs)
    span = -(-ctx_max // KEY_BLOCK) * KEY_BLOCK
    for offset, start, n, ctx in reqs:
        r = torch.arange(n * groups, device=device)
        tiles = -(-len(r) // qt)
        pad = tiles * qt - len(r)
        real.append(num_tiles * qt + r)
        dest.append(offset * groups + r)
        r = torch.cat([r, r[-1:].expand(pad)])  # padding rows: the last real row again (finite, discarded)
        rows.append(offset * groups + r)
        qpos.append(start + r // groups)
        slots.append(torch.cat([ctx, ctx[:1].expand(span - len(ctx))]))
        num_tiles += tiles
    pos = torch.cat(qpos).view(num_tiles, qt)
    lo_pos, hi_pos = pos[:, 0].tolist(), pos[:, -1].tolist()
    kpos = torch.arange(KEY_BLOCK, device=device)
    blocks: list[Block] = []
    for lo in range(0, max(hi_pos) + 1, KEY_BLOCK):
        t0 = bisect_left(hi_pos, lo)  # tiles that see a key of this block
        t1 = max(t0, bisect_left(lo_pos, lo + KEY_BLOCK - 1))  # from here on every row sees the whole block
        bias = keep = None
        if t1 > t0:
            hidden = ((lo + kpos)[None, None, :] > pos[t0:t1, :, None]).repeat_interleave(repeat, 0)
            bias = torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill_(hidden, float("-inf"))
            keep = (~hidden).to(dtype)
        blocks.append((t0 * repeat, (t1 - t0) * repeat, bias, keep))
    return TileGroup(torch.cat(rows), torch.cat(real), torch.cat(dest), torch.cat(slots), len(reqs), num_tiles,
                     blocks)


def plan(meta: AttentionMetadata, groups: int, hkv: int, device: torch.device,
         dtype: torch.dtype) -> list[TileGroup]:
    """The step's tile groups, built once and shared by every layer."""
    single, out = [], []
    for offset, start, n, ctx in zip(meta.offsets, meta.starts, meta.lens, meta.context_slots, strict=True):
        if n == 1:
            single.append((offset, start, n, ctx))
        elif n > 1:
            out.append(_group([(offset, start, n, ctx)], groups, 1, device, dtype))
    if single:  # one tile each; by context length, so the tiles still to attend a key block are a suffix
        out.append(_group(sorted(single, key=lambda r: r[1]), groups, hkv if len(single) > 1 else 1, device,
                          dtype))
    return out


def online_softmax(q: torch.Tensor, keys: KeyFn, blocks: list[Block]) -> torch.Tensor:
    """q: [N, rows, D] scaled queries, entries in position order; keys(block, first entry) -> K [N - first,
    KEY_BLOCK, D] and V with a column of ones [N - first, KEY_BLOCK, D + 1] (its last output column sums the
    weights: the denominator). Returns [N, rows, D]."""
    m = torch.full(q.shape[:2], float("-inf"), dtype=q.dtype, device=q.device)
    acc = q.new_zeros(*q.shape[:2], q.shape[2] + 1)
    for j, (b0, masked, bias, keep) in enumerate(blocks):
        k, v = keys(j, b0)
        s = torch.bmm(q[b0:], k.transpose(1, 2))  # [A, rows, KEY_BLOCK], one fixed shape per entry
        if masked:
            s[:masked] += bias
        mj = m[b0:]
        m_new = torch.maximum(mj, s.amax(-1))
        # Exactly 1 for a block the row does not see; tiny for the first block (times an accumulator of 0).
        alpha = (mj - m_new).clamp_(min=FLOOR).exp_()
        p = s.sub_(m_new[..., None]).clamp_(min=FLOOR).exp_()
        if masked:
            p[:masked] *= keep
        acc[b0:].mul_(alpha[..., None]).baddbmm_(p, v)
        mj.copy_(m_new)
    return acc[..., :-1] / acc[..., -1:]


def _with_ones(v: torch.Tensor) -> torch.Tensor:
    """[..., D] -> [..., D + 1], a column of ones appended."""
    out = v.new_ones(*v.shape[:-1], v.shape[-1] + 1)
    out[..., :-1] = v
    return out


class InvariantPagedAttention:
    """The AttentionBackend of batch-invariant mode: same interface and cache layout as TorchPagedAttention."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        t, hq, d = q.shape
        hkv = k.shape[1]
        g = hq // hkv
        qt = tile_rows(g)
        tiles = meta.plans.get("invariant")
        if tiles is None:
            tiles = meta.plans["invariant"] = plan(meta, g, hkv, q.device, q.dtype)
        # Query rows per KV head, position-major then group: [Hkv, T * G, D] (head h*G + g reads KV head h).
        qf = (q * scale).view(t, hkv, g, d).permute(1, 0, 2, 3).reshape(hkv, t * g, d)
        of = torch.empty_like(qf)
        for grp in tiles:
            qg = qf.index_select(1, grp.rows).view(hkv, grp.num_tiles, qt, d)
            kc = k_cache.index_select(0, grp.slots).view(grp.num_requests, -1, hkv, d)
            vc = v_cache.index_select(0, grp.slots).view(grp.num_requests, -1, hkv, d)
            if grp.num_requests == 1:
                o = self._shared(qg, kc[0], vc[0], grp.blocks)
            else:
                o = self._own(qg, kc, vc, grp.blocks)
            of.index_copy_(1, grp.dest, o.reshape(hkv, -1, d).index_select(1, grp.real))
        return of.view(hkv, t, g, d).permute(1, 0, 2, 3).reshape(t, hq, d)

    @staticmethod
    def _shared(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        """One request's tiles: q [Hkv, tiles, rows, D], k/v [L, Hkv, D]. Per KV head, the key block is
        broadcast to every tile (stride 0: no copy)."""
        k, v = k.transpose(0, 1).contiguous(), _with_ones(v.transpose(0, 1))  # [Hkv, L, D], [Hkv, L, D + 1]
        out = torch.empty_like(q)
        for h in range(q.shape[0]):
            def keys(j: int, b0: int, h: int = h) -> tuple[torch.Tensor, torch.Tensor]:
                lo, n = j * KEY_BLOCK, q.shape[1] - b0
                return (k[h, lo:lo + KEY_BLOCK].expand(n, -1, -1), v[h, lo:lo + KEY_BLOCK].expand(n, -1, -1))
            out[h] = online_softmax(q[h], keys, blocks)
        return out

    @staticmethod
    def _own(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, blocks: list[Block]) -> torch.Tensor:
        """One tile per request: q [Hkv, R, rows, D], k/v [R, L, Hkv, D]. Entries (request, KV head), request-major,
        so a key block is a strided view of [R, Hkv, L, D] for every head at once."""
        hkv = q.shape[0]
        k, v = k.permute(0, 2, 1, 3).contiguous(), _with_ones(v.permute(0, 2, 1, 3))  # [R, Hkv, L, D (+ 1)]
        qr = q.transpose(0, 1).reshape(-1, q.shape[2], q.shape[3])  # [R * Hkv, rows, D]

        def keys(j: int, b0: int) -> tuple[torch.Tensor, torch.Tensor]:
            lo, r0 = j * KEY_BLOCK, b0 // hkv  # the plan counted entries (request, KV head)
            return (k[r0:, :, lo:lo + KEY_BLOCK].flatten(0, 1), v[r0:, :, lo:lo + KEY_BLOCK].flatten(0, 1))

        o = online_softmax(qr, keys, blocks)
        return o.view(-1, hkv, q.shape[2], q.shape[3]).transpose(0, 1)



@torch.inference_mode()
def check(groups: int, head_dim: int, dtype: torch.dtype, device: torch.device, max_entries: int) -> None:
    """The one property this kernel takes from the BLAS library, checked on the running machine: an entry's bits
    follow neither the number of entries in its torch.bmm / baddbmm calls (1 to max_entries: every count up to
    128, every 16th beyond) nor its place among them, with the key blocks laid out both ways the backend passes
    them (each entry its own; one request's block broadcast to every tile). Raises InvariantModeError."""
    rows = tile_rows(groups)
    counts = sorted({*range(1, min(max_entries, 128) + 1), *range(128, max_entries + 1, 16), max_entries})
    top, shift = max(counts), 3
    gen = torch.Generator(device="cpu").manual_seed(4321)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    q = randn(top + shift, rows, head_dim) * head_dim ** -0.5
    k, v = randn(top + shift, 2 * KEY_BLOCK, head_dim), _with_ones(randn(top + shift, 2 * KEY_BLOCK, head_dim))
    blocks: list[Block] = [(0, 0, None, None), (0, 0, None, None)]

    def run(layout: str, lo: int, a: int) -> torch.Tensor:
        def keys(j: int, b0: int) -> tuple[torch.Tensor, torch.Tensor]:
            kb, vb = k[:, j * KEY_BLOCK:(j + 1) * KEY_BLOCK], v[:, j * KEY_BLOCK:(j + 1) * KEY_BLOCK]
            if layout == "own":
                return kb[lo + b0:lo + a], vb[lo + b0:lo + a]
            return kb[0].expand(a - b0, -1, -1), vb[0].expand(a - b0, -1, -1)
        return online_softmax(q[lo:lo + a], keys, blocks)

    for layout in ("own", "shared"):
        ref = run(layout, 0, top + shift)
        for lo, a in [(0, c) for c in counts] + [(shift, top)]:
            if not torch.equal(run(layout, lo, a), ref[lo:lo + a]):
                raise InvariantModeError(
                    f"batch-invariant mode cannot start: on this machine ({machine_name(device)}, "
                    f"{torch.get_num_threads()} threads) attention's batched matmuls give an entry other bits in a "
                    f"call of {a} entries (from entry {lo}, {layout} keys) than in one of {top + shift}; run "
                    "without batch_invariant, or with another num_threads")
