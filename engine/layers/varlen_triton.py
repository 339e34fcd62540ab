"""The varlen paged-attention contract (engine/layers/varlen.py) as a Triton kernel of our own: for a torch whose
`varlen_attn` lacks the paged arguments (torch's `block_table` needs FlashAttention 3), and for what flash lacks
(Gemma 2's soft-cap, float32). Triton is optional: `available()` says whether it imports.

One program per (request, tile of BLOCK_M queries, query head): it walks the request's keys in BLOCK_N tiles,
each key found through the block table (page = table[key // page_size]), with an online softmax in float32
(FlashAttention's recurrence). Keys outside the causal range, past seqused_k or before the window are masked; the
tile loop starts at the first tile inside the first query's window and stops at the last query's position.
Tiles past a request's queries exit at once, so the grid needs only max_seqlen_q (no host sync: a CUDA graph can
capture it). Its tests run on CPU in Triton's interpreter (TRITON_INTERPRET=1) when triton is installed."""

from __future__ import annotations

from typing import Any

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # optional: the engine then keeps the other kernels
    triton = None
    tl = None


def available() -> bool:
    return triton is not None


if triton is not None:

    @triton.jit
    def _paged_attention(q_ptr, k_ptr, v_ptr, o_ptr, cu_q, used_k, table, scale, softcap, window,  # noqa: ANN001
                         s_qt, s_qh, s_kb, s_ks, s_kh, s_tb, s_ot, s_oh,  # noqa: ANN001
                         GROUPS: tl.constexpr, PAGE: tl.constexpr, D: tl.constexpr, D_PAD: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, HAS_CAP: tl.constexpr,
                         HAS_WINDOW: tl.constexpr, IEEE: tl.constexpr) -> None:
        seq, tile, h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
        q_lo = tl.load(cu_q + seq)
        n_q = tl.load(cu_q + seq + 1) - q_lo
        if tile * BLOCK_M < n_q:
            k_len = tl.load(used_k + seq)
            offs_m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
            offs_d = tl.arange(0, D_PAD)
            pos = k_len - n_q + offs_m  # each query's position
            row_ok = offs_m < n_q
            d_ok = offs_d < D
            q = tl.load(q_ptr + (q_lo + offs_m)[:, None] * s_qt + h * s_qh + offs_d[None, :],
                        mask=row_ok[:, None] & d_ok[None, :], other=0.0)
            kvh = h // GROUPS
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, D_PAD], tl.float32)
            first = k_len - n_q + tile * BLOCK_M
            last = tl.minimum(k_len - n_q + (tile + 1) * BLOCK_M, k_len)  # one past the last query's position
            lo = 0
            if HAS_WINDOW:
                lo = tl.maximum(first - window + 1, 0) // BLOCK_N * BLOCK_N
            for start in range(lo, last, BLOCK_N):
                offs_n = start + tl.arange(0, BLOCK_N)
                key_ok = offs_n < k_len
                page = tl.load(table + seq * s_tb + offs_n // PAGE, mask=key_ok, other=0)
                addr = page.to(tl.int64) * s_kb + (offs_n % PAGE) * s_ks + kvh * s_kh
                k = tl.load(k_ptr + addr[:, None] + offs_d[None, :], mask=key_ok[:, None] & d_ok[None, :], other=0.0)
                v = tl.load(v_ptr + addr[:, None] + offs_d[None, :], mask=key_ok[:, None] & d_ok[None, :], other=0.0)
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
            out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]
            dest = o_ptr + (q_lo + offs_m)[:, None] * s_ot + h * s_oh + offs_d[None, :]
            tl.store(dest, out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def varlen_attention_triton(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                            cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, block_table: torch.Tensor,
                            max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool = True,
                            window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """The contract on the Triton kernel. float32 inputs take IEEE products (no TF32), so float32 stays exact."""
    del max_seqlen_k
    if not causal:
        raise ValueError("the Triton kernel is causal only (the engine's attention always is)")
    assert triton is not None, "triton is not installed"
    t, hq, d = q.shape
    hkv = k_pages.shape[2]
    assert q.stride(2) == 1 and k_pages.stride(3) == 1 and v_pages.stride() == k_pages.stride(), "head dim contiguous"
    out = torch.empty_like(q)
    block_m = 16 if max_seqlen_q <= 16 else 64
    grid: Any = (cu_seqlens_q.shape[0] - 1, triton.cdiv(max(max_seqlen_q, 1), block_m), hq)
    _paged_attention[grid](
        q, k_pages, v_pages, out, cu_seqlens_q, seqused_k, block_table, scale,
        float(softcap) if softcap is not None else 1.0, int(window) if window is not None else 0,
        q.stride(0), q.stride(1), k_pages.stride(0), k_pages.stride(1), k_pages.stride(2), block_table.stride(0),
        out.stride(0), out.stride(1),
        GROUPS=hq // hkv, PAGE=k_pages.shape[1], D=d, D_PAD=max(16, triton.next_power_of_2(d)), BLOCK_M=block_m,
        BLOCK_N=32, HAS_CAP=softcap is not None, HAS_WINDOW=window is not None, IEEE=q.dtype == torch.float32)
    return out
