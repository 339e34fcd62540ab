"""The experts' matmuls of a mixture-of-experts block as one grouped Triton kernel per projection (CUDA): the
(token, expert) pairs arrive sorted by expert (engine/layers/moe_dispatch.py's contract), and one launch multiplies
every expert's run of rows by that expert's weight, instead of one matmul launch per expert (128-256 per layer in
the MoE teachers, most with a few rows at decode).

The grid is (row tiles, output tiles). Row tiles never straddle two experts: expert e's rows take
ceil(count_e / BLOCK_M) tiles, and a tile's expert and row range come from the counts on the device (cumulative
sums and a searchsorted, no host sync), so the grid is an upper bound, cdiv(N, BLOCK_M) + E tiles, whose extra
tiles exit at once. Each program walks K in BLOCK_K steps with a float32 accumulator; float32 inputs take IEEE
products (no TF32), so float32 stays within the engine's 1e-4. The bias, when given, is added before the store.

The activation between the two projections stays in torch (a family's activate(), e.g. a clamped SwiGLU), over
all rows at once. vLLM's fused_moe kernel is the model (moe_align_block_size pads each expert's rows to the tile
the same way); this one is ours, smaller: no quantized weights, no fused top-k weighting.

Only language features triton 3.6 has (the lent image's) are used (TRITON_36_FEATURES; a test checks the source).
The tests run it on CPU in Triton's interpreter (TRITON_INTERPRET=1)."""

from __future__ import annotations

from typing import Any

import torch

from engine.layers.moe_dispatch import Activate

try:
    import triton
    import triton.language as tl
except ImportError:  # optional at run time: the loop of moe_dispatch.py runs instead
    triton = None
    tl = None

TRITON_36_FEATURES = frozenset({
    "triton.jit", "triton.cdiv", "tl.constexpr", "tl.program_id", "tl.load", "tl.store", "tl.arange", "tl.zeros",
    "tl.dot", "tl.trans", "tl.int64", "tl.float32",
})

BLOCK_M, BLOCK_N, BLOCK_K = 32, 64, 32


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _grouped(a_ptr, w_ptr, b_ptr, c_ptr, tile_expert, tile_lo, tile_hi, n_out, k_in,  # noqa: ANN001
                 s_am, s_we, s_wn, s_be, s_cm,  # noqa: ANN001
                 HAS_BIAS: tl.constexpr, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr):
        tile = tl.program_id(0)
        expert = tl.load(tile_expert + tile)
        if expert >= 0:
            lo = tl.load(tile_lo + tile)
            hi = tl.load(tile_hi + tile)
            rows = lo + tl.arange(0, BLOCK_M)
            row_ok = rows < hi
            cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
            col_ok = cols < n_out
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
            w_base = w_ptr + expert.to(tl.int64) * s_we
            for k0 in range(0, k_in, BLOCK_K):
                ks = k0 + tl.arange(0, BLOCK_K)
                k_ok = ks < k_in
                a = tl.load(a_ptr + rows.to(tl.int64)[:, None] * s_am + ks[None, :],
                            mask=row_ok[:, None] & k_ok[None, :], other=0.0)
                w = tl.load(w_base + cols.to(tl.int64)[:, None] * s_wn + ks[None, :],
                            mask=col_ok[:, None] & k_ok[None, :], other=0.0)
                if IEEE:
                    acc += tl.dot(a, tl.trans(w), input_precision="ieee")
                else:
                    acc += tl.dot(a, tl.trans(w))
            if HAS_BIAS:
                bias = tl.load(b_ptr + expert.to(tl.int64) * s_be + cols, mask=col_ok, other=0.0)
                acc += bias.to(tl.float32)[None, :]
            tl.store(c_ptr + rows.to(tl.int64)[:, None] * s_cm + cols[None, :], acc.to(c_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & col_ok[None, :])


def tile_map(counts: torch.Tensor, rows: int, block_m: int = BLOCK_M
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(expert, first row, one past the last row) of each row tile, on counts' device without a host sync:
    cdiv(rows, block_m) + E tiles, those past the last expert's marked -1."""
    counts = counts.to(torch.int64)
    tiles = (counts + block_m - 1) // block_m  # [E] tiles of each expert
    tile_end = torch.cumsum(tiles, 0)  # one past each expert's last tile
    row_end = torch.cumsum(counts, 0)
    bound = -(-rows // block_m) + counts.shape[0]
    t = torch.arange(bound, device=counts.device)
    expert = torch.searchsorted(tile_end, t, right=True)  # the expert whose tiles hold t
    valid = expert < counts.shape[0]
    e = expert.clamp(max=counts.shape[0] - 1)
    first_tile = tile_end[e] - tiles[e]
    lo = row_end[e] - counts[e] + (t - first_tile) * block_m
    hi = row_end[e]
    return torch.where(valid, e, -1).to(torch.int32), lo.to(torch.int32), hi.to(torch.int32)


def grouped_linear(rows: torch.Tensor, tiles: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                   weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """rows [N, K] grouped by expert, weight [E, OUT, K], bias [E, OUT] -> [N, OUT]: each row by its expert's."""
    assert triton is not None, "triton is not installed"
    rows, weight = rows.contiguous(), weight.contiguous()
    n, k = rows.shape
    n_out = weight.shape[1]
    out = torch.empty(n, n_out, dtype=rows.dtype, device=rows.device)
    expert, lo, hi = tiles
    if n == 0:
        return out
    grid: Any = (expert.shape[0], triton.cdiv(n_out, BLOCK_N))
    b = bias.contiguous() if bias is not None else weight  # a pointer never read without HAS_BIAS
    _grouped[grid](rows, weight, b, out, expert, lo, hi, n_out, k,
                   rows.stride(0), weight.stride(0), weight.stride(1), b.stride(0), out.stride(0),
                   HAS_BIAS=bias is not None, IEEE=rows.dtype == torch.float32, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N,
                   BLOCK_K=BLOCK_K)
    return out


def expert_grouped(rows: torch.Tensor, counts: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor,
                   gate_up_bias: torch.Tensor | None, down_bias: torch.Tensor | None, activate: Activate
                   ) -> torch.Tensor:
    """moe_dispatch.expert_loop's contract in two grouped launches and the activation between them."""
    tiles = tile_map(counts, rows.shape[0])
    h = grouped_linear(rows, tiles, gate_up, gate_up_bias)
    width = gate_up.shape[1] // 2
    return grouped_linear(activate(h[:, :width], h[:, width:]).contiguous(), tiles, down, down_bias)
