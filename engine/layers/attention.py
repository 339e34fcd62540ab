"""Paged attention behind a small interface, so a GPU kernel can sit beside the pure-PyTorch path."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from engine.layers.varlen import VarlenInputs, varlen_attention_reference
from engine.layers.window import attend, decode_window_bias, window_mask


@dataclass
class AttentionMetadata:
    """Where each request's tokens sit in the flat batch and in the paged cache. Built once per step."""

    # [num_tokens] flat KV-cache slot (block * block_size + offset) of each new token.
    slot_mapping: torch.Tensor
    # Per request: tokens already in the cache before this step, and tokens computed in this step.
    starts: list[int]
    lens: list[int]
    # Per request: [start + len] slots holding its whole context (cached and new), in position order.
    context_slots: list[torch.Tensor]
    # Decoding requests (one new token after a cached context) are attended in one batched call:
    # their token rows in the flat batch, [B * S_max] context slots (padding repeats a valid slot) and the
    # [B, 1, 1, S_max] additive mask (0 for real keys, -inf for padding) in the model dtype. Built by finalize().
    decode_rows: torch.Tensor | None = None
    decode_slots: torch.Tensor | None = None
    decode_mask: torch.Tensor | None = None
    # [B] position of each decoding request's query (sliding-window layers mask from it).
    decode_starts: torch.Tensor | None = None
    # Indices (into starts/lens/context_slots) of the requests attended one by one (prefill chunks), and
    # each request's first row in the flat batch.
    others: list[int] = field(default_factory=list)
    offsets: list[int] = field(default_factory=list)
    # A backend's own per-step layout, built at the first layer and reused by the others (by backend name).
    plans: dict[str, Any] = field(default_factory=dict)
    # Per request: its KV-cache block ids in position order (VarlenPagedAttention reads the cache through them).
    block_tables: list[list[int]] = field(default_factory=list)
    # A hybrid model's linear layers (engine/layers/gated_deltanet.py; empty otherwise), per request: its state slot;
    # the row its chunk's state starts from (-1: zeros, at position 0; its slot, or a prefix-cache snapshot); and the
    # snapshots its chunk writes, (tokens into the chunk, row).
    state_slots: list[int] = field(default_factory=list)
    state_sources: list[int] = field(default_factory=list)
    state_saves: list[list[tuple[int, int]]] = field(default_factory=list)

    def finalize(self, device: torch.device, dtype: torch.dtype = torch.float32) -> None:
        offsets, offset = [], 0
        for n in self.lens:
            offsets.append(offset)
            offset += n
        self.offsets = offsets
        dec = [i for i, (s, n) in enumerate(zip(self.starts, self.lens, strict=True)) if n == 1 and s > 0]
        self.others = [i for i in range(len(self.lens)) if i not in set(dec)]
        if len(dec) < 2:  # nothing to batch
            self.others = list(range(len(self.lens)))
            return
        s_max = max(self.starts[i] + 1 for i in dec)
        slots = torch.zeros(len(dec), s_max, dtype=torch.long, device=device)
        mask = torch.zeros(len(dec), s_max, dtype=torch.bool, device=device)
        for b, i in enumerate(dec):
            n = self.starts[i] + 1
            slots[b, :n] = self.context_slots[i]
            mask[b, :n] = True
        self.decode_rows = torch.tensor([offsets[i] for i in dec], device=device)
        self.decode_starts = torch.tensor([self.starts[i] for i in dec], device=device)
        # Flat, for index_select (4x faster than advanced indexing on CPU); a float mask, which CPU SDPA takes
        # 2x faster than a boolean one here.
        self.decode_slots = slots.flatten()
        bias = torch.zeros(len(dec), s_max, dtype=dtype, device=device).masked_fill_(~mask, float("-inf"))
        self.decode_mask = bias[:, None, None, :]


class AttentionBackend(Protocol):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D]; caches: [num_slots, Hkv, D]. Writes k/v, returns [T, Hq, D]."""
        ...


class TorchPagedAttention:
    """Reference path that runs anywhere: write the new K/V into their slots, then attend. Decoding requests
    go in one padded, masked call; prefill chunks gather their context and attend with the chunk's offset."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        """window: keys older than this many positions are masked (engine/layers/window.py); softcap: tanh cap
        on the scores; sinks: [Hq] per-head logits added to the softmax's denominator (gpt-oss)."""
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        hq, hkv, d = q.shape[1], k.shape[1], q.shape[2]
        groups = hq // hkv
        if meta.decode_rows is not None:
            assert meta.decode_slots is not None and meta.decode_mask is not None
            b = meta.decode_rows.shape[0]
            # One query per request: fold the query heads of a KV group into the query-length axis, so
            # GQA needs no repeat of K/V. [B, Hkv, G, D] against [B, Hkv, S_max, D].
            qd = q.index_select(0, meta.decode_rows).view(b, hkv, groups, d)
            kd = k_cache.index_select(0, meta.decode_slots).view(b, -1, hkv, d).transpose(1, 2)
            vd = v_cache.index_select(0, meta.decode_slots).view(b, -1, hkv, d).transpose(1, 2)
            bias = meta.decode_mask
            if window is not None:
                assert meta.decode_starts is not None
                key = f"decode_window_{window}"  # one per window size and step, shared by the layers
                if key not in meta.plans:
                    meta.plans[key] = decode_window_bias(bias, meta.decode_starts, window)
                bias = meta.plans[key]
            # Query head h = kv head h // G, group slot h % G: the sinks folded the same way.
            folded = None if sinks is None else sinks.view(1, hkv, groups, 1)
            od = attend(qd, kd, vd, bias, scale, softcap, sinks=folded)
            out.index_copy_(0, meta.decode_rows, od.reshape(b, hq, d))
        head_sinks = None if sinks is None else sinks.view(1, hq, 1, 1)
        for i in meta.others:
            start, n, slots, offset = meta.starts[i], meta.lens[i], meta.context_slots[i], meta.offsets[i]
            # 4-D [1, H, S, D]: CPU's fused (flash) SDPA kernel takes only 4-D inputs, else the math path.
            qi = q[offset:offset + n].transpose(0, 1)[None]  # [1, Hq, n, D]
            windowed = window is not None and start + n > window  # else the window hides no key
            if start == 0 and not windowed:
                # Whole context is new: use it directly (no gather) with a plain causal mask.
                ki = _expand(k[offset:offset + n], groups)  # [1, Hq, n, D]
                vi = _expand(v[offset:offset + n], groups)
                oi = attend(qi, ki, vi, None, scale, softcap, is_causal=n > 1, sinks=head_sinks)
            else:
                # Keys before `lo` are outside every query's window: not gathered (the first query, at position
                # start, sees keys from start - window + 1 on).
                lo = max(0, start - window + 1) if windowed and window is not None else 0
                ki = _expand(k_cache.index_select(0, slots[lo:]), groups)  # [1, Hq, start + n - lo, D]
                vi = _expand(v_cache.index_select(0, slots[lo:]), groups)
                mask = None
                if n > 1 or windowed:
                    # Query j sits at position start + j and sees keys 0 .. start + j (within the window).
                    mask = window_mask(start, n, window if windowed else None, q.device)[:, lo:]
                oi = attend(qi, ki, vi, mask, scale, softcap, sinks=head_sinks)
            out[offset:offset + n] = oi[0].transpose(0, 1)
        return out


# The varlen contract (engine/layers/varlen.py): q, k_pages, v_pages, cu_seqlens_q, seqused_k, block_table,
# max_seqlen_q, max_seqlen_k, scale, causal, window, softcap[, sinks] -> [T, Hq, D].
VarlenKernel = Callable[..., torch.Tensor]


class VarlenPagedAttention:
    """One attention call per layer for the whole step (prefill chunks, prefix hits and decodes together): the new
    K/V are written into their slots, then the kernel reads every request's context from the paged cache through
    its block table. The kernel is the CUDA one (varlen_attention_cuda) or the pure-torch reference."""

    name = "varlen"

    def __init__(self, block_size: int, kernel: VarlenKernel = varlen_attention_reference) -> None:
        self.block_size = block_size
        self.kernel = kernel

    def inputs(self, meta: AttentionMetadata) -> VarlenInputs:
        """The step's kernel arguments, built at the first layer (or set beforehand, as a CUDA graph does)."""
        got = meta.plans.get(self.name)
        if got is None:
            got = VarlenInputs.build(meta.starts, meta.lens, meta.block_tables, meta.slot_mapping.device)
            meta.plans[self.name] = got
        return got

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float, window: int | None = None,
                softcap: float | None = None, sinks: torch.Tensor | None = None) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        x = self.inputs(meta)
        shape = (-1, self.block_size, k_cache.shape[1], k_cache.shape[2])  # [blocks, block_size, Hkv, D]: a view
        args = (q, k_cache.view(shape), v_cache.view(shape), x.cu_seqlens_q, x.seqused_k, x.block_table,
                x.max_seqlen_q, x.max_seqlen_k, scale, True, window, softcap)
        # sinks only when set: the flash kernel's contract has none (attention_choice keeps sink models off it).
        return self.kernel(*args) if sinks is None else self.kernel(*args, sinks=sinks)


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[S, Hkv, D] -> [1, Hq, S, D]. Explicit repeat rather than SDPA's enable_gqa, which sends CPU attention down
    the math path that materializes [H, S, S] scores (gigabytes for a long prompt)."""
    x = x.transpose(0, 1)
    return (x.repeat_interleave(groups, dim=0) if groups > 1 else x)[None]
