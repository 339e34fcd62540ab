"""Variable-length paged attention: the whole step's queries in one call, K/V read from the paged cache through a
block table (the FlashAttention `varlen` + paged-KV contract, which `torch.nn.attention.varlen.varlen_attn` takes).

One function contract, two implementations with the same arguments:
- `varlen_attention_reference`: pure torch, runs anywhere; the CPU tests check the contract's inputs through it
  against today's path and transformers.
- `varlen_attention_cuda`: torch's own flash kernel (`varlen_attn`), when the running torch has the arguments
  (`block_table`, `seqused_k`, `window_size`, `enable_gqa`: torch 2.13 has them, 2.11 lacks the paged three) and
  the pages suit it (its paged mode is FlashAttention 2's: a page size that is a multiple of 256);
  `kernel_blocker` says why not otherwise. engine/layers/varlen_triton.py serves the same contract in Triton.

Alignment: sequence i has q_i = cu_seqlens_q[i+1] - cu_seqlens_q[i] new queries at the end of its k_i =
seqused_k[i] keys (causal "bottom-right", FlashAttention's rule when q_i < k_i): query j sits at position
k_i - q_i + j and sees keys up to it, and with a window W only those after position - W (transformers'
`kv_idx > q_idx - sliding_window`, FlashAttention's window_size = (W - 1, 0)).
"""

from __future__ import annotations

import inspect
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch

from engine.layers.window import attend, window_mask

log = logging.getLogger(__name__)

# What varlen_attn must accept for this contract (they arrived across torch releases).
_NEEDED_ARGS = ("block_table", "seqused_k", "window_size", "enable_gqa")


@dataclass
class VarlenInputs:
    """The contract's per-step arguments, built once per step and shared by every layer."""

    cu_seqlens_q: torch.Tensor  # [N + 1] int32: sequence i's queries are rows cu[i] .. cu[i+1] of the flat batch
    seqused_k: torch.Tensor  # [N] int32: keys of sequence i (cached context + this step's tokens)
    block_table: torch.Tensor  # [N, max_blocks] int32: the cache blocks of sequence i in position order (0-padded)
    max_seqlen_q: int
    max_seqlen_k: int

    @staticmethod
    def build(starts: list[int], lens: list[int], block_tables: list[list[int]], device: torch.device,
              max_blocks: int | None = None) -> VarlenInputs:
        """starts: tokens already cached per sequence; lens: tokens computed in this step; block_tables: each
        sequence's blocks (at least ceil((start + len) / block_size) of them). Built on the host, moved once.
        max_blocks: the table's width (fixed for a captured CUDA graph); default: the longest table."""
        width = max_blocks if max_blocks is not None else max((len(t) for t in block_tables), default=0)
        table = torch.zeros(len(block_tables), max(width, 1), dtype=torch.int32)
        for i, blocks in enumerate(block_tables):
            table[i, :len(blocks)] = torch.tensor(blocks[:width], dtype=torch.int32)
        cu = torch.zeros(len(lens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(lens, dtype=torch.int32).cumsum(0)
        used = [s + n for s, n in zip(starts, lens, strict=True)]
        return VarlenInputs(cu.to(device), torch.tensor(used, dtype=torch.int32).to(device), table.to(device),
                            max(lens, default=0), max(used, default=0))


def varlen_attention_reference(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                               cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, block_table: torch.Tensor,
                               max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool = True,
                               window: int | None = None, softcap: float | None = None,
                               sinks: torch.Tensor | None = None) -> torch.Tensor:
    """q: [T, Hq, D]; k_pages, v_pages: [num_blocks, block_size, Hkv, D] (Hq a multiple of Hkv: GQA); sinks: [Hq]
    per-head logits in the softmax's denominator (gpt-oss), None: none. Returns
    [T, Hq, D]. Reads each sequence's keys through its block table: only the blocks its queries can see (from the
    first one inside the window of its first query), no padded copy of the batch. max_seqlen_*: unused here (the
    CUDA kernel sizes its grid from them); kept so both implementations take the same arguments."""
    del max_seqlen_q, max_seqlen_k
    bs, hkv, d = k_pages.shape[1], k_pages.shape[2], k_pages.shape[3]
    groups = q.shape[1] // hkv
    out = torch.empty_like(q)
    cu, used = cu_seqlens_q.tolist(), seqused_k.tolist()
    for i, k_len in enumerate(used):
        lo_q, hi_q = cu[i], cu[i + 1]
        n = hi_q - lo_q
        if n == 0:
            continue
        start = k_len - n  # position of the first query
        # First key any query sees: the window of the first query starts at start - window + 1.
        first = max(0, start - window + 1) if window is not None and causal else 0
        b0, b1 = first // bs, (k_len + bs - 1) // bs
        blocks = block_table[i, b0:b1].long()
        lo = first - b0 * bs  # offset of key `first` inside the gathered blocks
        ki = k_pages.index_select(0, blocks).reshape(-1, hkv, d)[lo:k_len - b0 * bs]  # [k_len - first, Hkv, D]
        vi = v_pages.index_select(0, blocks).reshape(-1, hkv, d)[lo:k_len - b0 * bs]
        qi = q[lo_q:hi_q].transpose(0, 1)[None]  # [1, Hq, n, D]
        mask = None
        if causal and (n > 1 or first > 0 or window is not None):
            mask = window_mask(start, n, window, q.device)[:, first:]  # [n, k_len - first]
            if n == 1 and bool(mask.all()):
                mask = None
        oi = attend(qi, _heads(ki, groups), _heads(vi, groups), mask, scale, softcap,
                    sinks=None if sinks is None else sinks.view(1, -1, 1, 1))
        out[lo_q:hi_q] = oi[0].transpose(0, 1)
    return out


def _heads(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[S, Hkv, D] -> [1, Hq, S, D], each KV head repeated for its query group (the reference's GQA)."""
    x = x.transpose(0, 1)
    return (x.repeat_interleave(groups, dim=0) if groups > 1 else x)[None]


def varlen_attention_cuda(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor,
                          cu_seqlens_q: torch.Tensor, seqused_k: torch.Tensor, block_table: torch.Tensor,
                          max_seqlen_q: int, max_seqlen_k: int, scale: float, causal: bool = True,
                          window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """The same contract on torch's flash kernel. No soft-cap (kernel_blocker keeps such a model off it); no host
    sync, so a CUDA graph can capture it (max_seqlen_k then fixed at the graph's largest)."""
    from torch.nn.attention.varlen import varlen_attn

    if softcap is not None:
        raise ValueError("torch's varlen_attn has no soft-cap")
    left = window - 1 if window is not None else -1
    # With a block table the kernel takes each sequence's keys from seqused_k; the cumulative key lengths are
    # given anyway, consistent with them, for the kernels that still read them. No host sync: graph-safe.
    cu_k = torch.nn.functional.pad(seqused_k.cumsum(0, dtype=torch.int32), (1, 0))
    return varlen_attn(q, k_pages, v_pages, cu_seqlens_q, cu_k, max_seqlen_q, max_seqlen_k,
                       scale=scale, window_size=(left, 0) if causal else (-1, -1),
                       enable_gqa=q.shape[1] != k_pages.shape[2], seqused_k=seqused_k, block_table=block_table)


def torch_varlen_missing(fn: Any = None, version: str | None = None) -> str | None:
    """Why the running torch's varlen_attn (or fn, a varlen_attn of torch `version`) cannot serve the contract;
    None when it can (arguments only). torch 2.11's, the lent GPU image's, lacks block_table, seqused_k and
    enable_gqa; 2.13's has all four."""
    version = version or torch.__version__
    if fn is None:
        try:
            from torch.nn.attention.varlen import varlen_attn as fn
        except ImportError:
            return f"torch {version} has no torch.nn.attention.varlen.varlen_attn"
    params = inspect.signature(fn).parameters
    missing = [a for a in _NEEDED_ARGS if a not in params]
    if missing:
        return f"torch {version}'s varlen_attn lacks {', '.join(missing)}"
    return None


def kernel_blocker(device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int,
                   softcap: bool, sinks: bool = False) -> str | None:
    """Why the CUDA kernel cannot run this model here (None: it can, checked by a tiny call against the
    reference, so a page size or head dim the kernel refuses is found at start, not in a request)."""
    if device.type != "cuda":
        return "no CUDA device"
    missing = torch_varlen_missing()
    if missing:
        return missing
    if dtype not in (torch.bfloat16, torch.float16):
        return f"the flash kernel takes bfloat16/float16, not {dtype}"
    if softcap:
        return "the flash kernel has no attention soft-cap (Gemma 2)"
    if sinks:
        return "the flash kernel has no attention sinks (gpt-oss)"
    return probe(varlen_attention_cuda, device, dtype, block_size, head_dim)


def triton_blocker(device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int) -> str | None:
    """Why our Triton kernel (engine/layers/varlen_triton.py) cannot run here; None: it can (probed)."""
    from engine.layers import varlen_triton

    if device.type != "cuda":
        return "no CUDA device"
    if not varlen_triton.available():
        return "triton is not installed"
    return probe(varlen_triton.varlen_attention_triton, device, dtype, block_size, head_dim, softcap=True, sinks=True)


# Units of least precision at the output's magnitude a correct kernel stays within: half precision rounds the
# output once and the probabilities once before P @ V; float32 (IEEE products) sums in another order than SDPA.
PROBE_ULPS = {torch.bfloat16: 8, torch.float16: 8, torch.float32: 256}


def probe_tolerance(dtype: torch.dtype, magnitude: float) -> float:
    """PROBE_ULPS units of least precision of dtype at magnitude (the largest |output| of the reference)."""
    ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(magnitude, 2.0 ** -20)))
    return PROBE_ULPS.get(dtype, 8) * ulp


def probe(kernel: Any, device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int,
          softcap: bool = False, sinks: bool = False) -> str | None:
    """None when the kernel runs two tiny paged steps and agrees with the reference in float32 within
    probe_tolerance; else why not. The steps: a prefill (two requests, one crossing a page boundary) and a decode
    (three one-token requests, contexts over several pages), each without and with a window (and a soft-cap and
    sinks when asked). The errors it measured are logged, so a failure's margin is on record."""
    name = getattr(kernel, "__name__", str(kernel))
    try:
        for shape in ("prefill", "decode"):
            for window, cap in ((None, None), (3, 2.0 if softcap else None)):
                err, mag = _probe_error(kernel, device, dtype, block_size, head_dim, shape, window, cap,
                                        sinks and window is not None)
                tol = probe_tolerance(dtype, mag)
                log.info("probe %s %s page %d head_dim %d %s window %s soft-cap %s: max |error| %.3g of tolerance "
                         "%.3g (|output| up to %.3g)", name, dtype, block_size, head_dim, shape, window, cap, err,
                         tol, mag)
                if not err <= tol:
                    return (f"{name} differs from the reference on a probe call ({shape}, window {window}) by "
                            f"{err:.3g}, past {tol:.3g} ({PROBE_ULPS.get(dtype, 8)} units of {dtype} at {mag:.3g})")
        return None
    except Exception as e:  # noqa: BLE001  # any refusal of the kernel means: not usable here
        return f"{name} failed on a probe call: {type(e).__name__}: {e}"[:300]


# (tokens cached, new tokens, block tables) of the probe's steps, by page count so any page size fits.
_PROBE_STEPS = {"prefill": ([-1, 2], [3, 1], [[2, 0], [1, 3, 0]]),
                "decode": ([-1, 2, 4], [1, 1, 1], [[2, 0], [1, 3, 0], [4, 5, 6, 7, 0]])}


def _probe_error(kernel: Any, device: torch.device, dtype: torch.dtype, block_size: int, head_dim: int,
                 shape: str, window: int | None, softcap: float | None, sinks: bool = False) -> tuple[float, float]:
    """(max |kernel - reference|, max |reference|), both in float32 on the same dtype-rounded inputs. A start of
    -1 is one token before the first page's end (the request crosses into its second page); k > 0 is k pages."""
    g = torch.Generator(device="cpu").manual_seed(0)
    hq, hkv, blocks = 4, 2, 8
    kp, vp = (torch.randn(blocks, block_size, hkv, head_dim, generator=g).to(device, dtype) for _ in range(2))
    starts, lens, tables = _PROBE_STEPS[shape]
    starts = [block_size - 1 if s < 0 else s * block_size for s in starts]
    q = torch.randn(sum(lens), hq, head_dim, generator=g).to(device, dtype)
    inputs = VarlenInputs.build(starts, lens, tables, device)
    rest = (inputs.cu_seqlens_q, inputs.seqused_k, inputs.block_table, inputs.max_seqlen_q, inputs.max_seqlen_k,
            head_dim ** -0.5)
    extra = {"sinks": torch.randn(hq, generator=g).to(device, dtype)} if sinks else {}
    got = kernel(q, kp, vp, *rest, window=window, softcap=softcap, **extra).float()
    want = varlen_attention_reference(q.float(), kp.float(), vp.float(), *rest, window=window, softcap=softcap,
                                      **{k: v.float() for k, v in extra.items()})
    return (got - want).abs().max().item(), want.abs().max().item()
