"""The varlen paged-attention contract (engine/layers/varlen.py) as a Triton kernel of our own: for a torch whose
`varlen_attn` lacks the paged arguments (torch 2.11, the lent GPU image) or refuses our pages (FlashAttention 2
takes a block table only with pages of a multiple of 256 tokens), and for what flash lacks (Gemma 2's soft-cap,
float32, gpt-oss's attention sinks). Triton is optional at run time: `available()` says whether it imports.

GQA is folded into the program: one program per (request, tile of queries, KV head) holds the queries of every
query head of that KV head's group as the rows of one tile (row r = query r // G_PAD, head r % G_PAD), so each
key/value tile is read once per group, not once per query head. It walks the request's keys in BLOCK_N tiles,
each key found through the block table (page = table[key // page_size]), with an online softmax in float32
(FlashAttention's recurrence); a sink (one learned logit per query head, in the denominator only) joins the
running max and sum after the last tile. Keys outside the causal range, past seqused_k or before the window are
masked; the tile loop starts at the first tile inside the first query's window and stops at the last query's position.
Tiles past a request's queries exit at once, so the grid needs only max_seqlen_q (no host sync: a CUDA graph can
capture it). Tile sizes and warps come from TILES by the step's shape.

Only language features triton 3.6 has (the lent image's) are used: TRITON_36_FEATURES lists them and a test
checks this file's source against it. The tests run the kernel on CPU in Triton's interpreter
(TRITON_INTERPRET=1)."""

from __future__ import annotations

from typing import Any, NamedTuple

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # optional at run time: the engine then keeps the other kernels
    triton = None
    tl = None

# Every triton / triton.language name this file uses; all are in triton 3.6's API (tests check the source).
TRITON_36_FEATURES = frozenset({
    "triton.jit", "triton.cdiv", "triton.next_power_of_2", "tl.constexpr", "tl.program_id", "tl.load", "tl.store",
    "tl.arange", "tl.full", "tl.zeros", "tl.dot", "tl.trans", "tl.exp", "tl.where", "tl.maximum", "tl.minimum",
    "tl.max", "tl.sum", "tl.int64", "tl.float32",
})


class Tiles(NamedTuple):
    rows: int  # query rows per program (queries x the group's heads), a power of two >= 16 (tl.dot's least M)
    keys: int  # keys per tile of the inner loop
    warps: int
    stages: int


# By the step's shape: "decode" when every request's rows (new tokens x G_PAD) fit 16, else "prefill"; the key
# tile halves past head_dim 128 so a tile's K and V stay in registers.
TILES: dict[str, Tiles] = {
    "decode": Tiles(rows=16, keys=64, warps=4, stages=2),
    "prefill": Tiles(rows=64, keys=64, warps=4, stages=2),
    "prefill_wide_head": Tiles(rows=64, keys=32, warps=8, stages=2),
}


def tiles_for(max_seqlen_q: int, groups: int, head_dim: int) -> tuple[str, Tiles]:
    """The table's entry for a step: its name and tiles (rows raised to the group's padded size if larger)."""
    g_pad = _pow2(groups)
    if max(max_seqlen_q, 1) * g_pad <= TILES["decode"].rows:
        name = "decode"
    else:
        name = "prefill_wide_head" if head_dim > 128 else "prefill"
    t = TILES[name]
    return name, t._replace(rows=max(t.rows, g_pad))


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _paged_attention(q_ptr, k_ptr, v_ptr, o_ptr, cu_q, used_k, table, sinks_ptr, scale, softcap,  # noqa: ANN001
                         window,  # noqa: ANN001
                         s_qt, s_qh, s_kb, s_ks, s_kh, s_tb, s_ot, s_oh,  # noqa: ANN001
                         GROUPS: tl.constexpr, G_PAD: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr,
                         D_PAD: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr,
                         HAS_CAP: tl.constexpr, HAS_WINDOW: tl.constexpr, HAS_SINKS: tl.constexpr,
                         IEEE: tl.constexpr) -> None:
        seq, tile, kvh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        q_lo = tl.load(cu_q + seq)
        n_q = tl.load(cu_q + seq + 1) - q_lo
        if tile * BLOCK_Q < n_q:
            k_len = tl.load(used_k + seq)
            rows = tl.arange(0, BLOCK_M)
            q_idx = tile * BLOCK_Q + rows // G_PAD  # the row's query within the request
            head = kvh * GROUPS + rows % G_PAD  # the row's query head
            offs_d = tl.arange(0, D_PAD)
            pos = k_len - n_q + q_idx  # each row's query position
            row_ok = (q_idx < n_q) & (rows % G_PAD < GROUPS)
            d_ok = offs_d < D
            q_off = (q_lo + q_idx).to(tl.int64) * s_qt + head * s_qh
            q = tl.load(q_ptr + q_off[:, None] + offs_d[None, :], mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
            first = k_len - n_q + tile * BLOCK_Q
            last = tl.minimum(k_len - n_q + (tile + 1) * BLOCK_Q, k_len)  # one past the last query's position
            lo = 0
            if HAS_WINDOW:
                lo = tl.maximum(first - window + 1, 0) // BLOCK_N * BLOCK_N
            for start in range(lo, last, BLOCK_N):
                offs_n = start + tl.arange(0, BLOCK_N)
                key_ok = offs_n < k_len
                page = tl.load(table + seq * s_tb + offs_n // PAGE, mask=key_ok, other=0)
                addr = page.to(tl.int64) * s_kb + (offs_n % PAGE) * s_ks + kvh * s_kh
                kv_ok = key_ok[:, None] & d_ok[None, :]
                k = tl.load(k_ptr + addr[:, None] + offs_d[None, :], mask=kv_ok, other=0.0)
                v = tl.load(v_ptr + addr[:, None] + offs_d[None, :], mask=kv_ok, other=0.0)
                if IEEE:
                    s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
                else:
                    s = tl.dot(q, tl.trans(k)) * scale
                if HAS_CAP:  # cap * tanh(s / cap), tanh from exp (no libdevice in the interpreter)
                    s = softcap * (1.0 - 2.0 / (tl.exp(2.0 * s / softcap) + 1.0))
                ok = key_ok[None, :] & (offs_n[None, :] <= pos[:, None])
                if HAS_WINDOW:
                    ok = ok & (offs_n[None, :] > pos[:, None] - window)
                s = tl.where(ok, s, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, 1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp(-inf) = 0
                p = tl.exp(s - m_safe[:, None])
                alpha = tl.exp(m_i - m_safe)
                l_i = l_i * alpha + tl.sum(p, 1)
                if IEEE:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision="ieee")
                else:
                    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
                m_i = m_new
            if HAS_SINKS:  # exp(sink) joins the denominator, scaled to the running max like every score
                sink = tl.load(sinks_ptr + head, mask=row_ok, other=0.0).to(tl.float32)
                m_fin = tl.maximum(m_i, sink)
                alpha = tl.exp(m_i - m_fin)
                l_i = l_i * alpha + tl.exp(sink - m_fin)
                acc = acc * alpha[:, None]
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            o_off = (q_lo + q_idx).to(tl.int64) * s_ot + head * s_oh
            tl.store(o_ptr + o_off[:, None] + offs_d[None, :], out.to(o_ptr.dtype.element_ty),
                     mask=row_ok[:, None] & d_ok[None, :])


def varlen_attention_triton(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, block_table: torch.Tensor,
                            max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool = True,
                            window: int | None = None, softcap: float | None = None,
                            sinks: torch.Tensor | None = None) -> torch.Tensor:
    """The contract on the Triton kernel. float32 inputs take IEEE products (no TF32), so float32 stays exact.
    sinks: [Hq] per-head sink logits (gpt-oss), None: none."""
    del max_seqlen_k
    if not causal:
        raise ValueError("the Triton kernel is causal only (the engine's attention always is)")
    assert triton is not None, "triton is not installed"
    t, hq, d = q.shape
    hkv = k_pages.shape[2]
    assert q.stride(2) == 1 and k_pages.stride(3) == 1 and v_pages.stride() == k_pages.stride(), "head dim contiguous"
    groups = hq // hkv
    g_pad = _pow2(groups)
    _, tiles = tiles_for(max_seqlen_q, groups, d)
    out = torch.empty_like(q)
    block_q = tiles.rows // g_pad  # queries per tile
    grid: Any = (cu_seqlens_q.shape[0] - 1, triton.cdiv(max(max_seqlen_q, 1), block_q), hkv)
    _paged_attention[grid](
        q, k_pages, v_pages, out, cu_seqlens_q, seqused_k, block_table, sinks if sinks is not None else q, scale,
        float(softcap) if softcap is not None else 1.0, int(window) if window is not None else 0,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), block_table.stride(0),
        out.stride(0), out.stride(1),
        GROUPS=groups, G_PAD=g_pad, PAGE=k_pages.shape[1], D=d, D_PAD=max(16, triton.next_power_of_2(d)),
        BLOCK_M=tiles.rows, BLOCK_Q=block_q, BLOCK_N=tiles.keys, HAS_CAP=softcap is not None,
        HAS_WINDOW=window is not None, HAS_SINKS=sinks is not None, IEEE=q.dtype == torch.float32,
        num_warps=tiles.warps, num_stages=tiles.stages)
    return out
