"""Paged attention behind a small interface, so a GPU kernel can sit beside the pure-PyTorch path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F


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


class AttentionBackend(Protocol):
    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        """q: [T, Hq, D]; k, v: [T, Hkv, D]; caches: [num_slots, Hkv, D]. Writes k/v, returns [T, Hq, D]."""
        ...


class TorchPagedAttention:
    """Reference path that runs anywhere: write the new K/V into their slots, gather each request's context
    from its blocks, causal attention with the chunk's offset."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                v_cache: torch.Tensor, meta: AttentionMetadata, scale: float) -> torch.Tensor:
        k_cache.index_copy_(0, meta.slot_mapping, k)
        v_cache.index_copy_(0, meta.slot_mapping, v)
        out = torch.empty_like(q)
        offset = 0
        for start, n, slots in zip(meta.starts, meta.lens, meta.context_slots, strict=True):
            qi = q[offset:offset + n].transpose(0, 1)  # [Hq, n, D]
            if start == 0:
                # Whole context is new: use it directly (no gather) with a plain causal mask.
                ki = k[offset:offset + n].transpose(0, 1)  # [Hkv, n, D]
                vi = v[offset:offset + n].transpose(0, 1)
                oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=n > 1, scale=scale, enable_gqa=True)
            else:
                ki = k_cache.index_select(0, slots).transpose(0, 1)  # [Hkv, start + n, D]
                vi = v_cache.index_select(0, slots).transpose(0, 1)
                mask = None
                if n > 1:
                    # Query j sits at position start + j and sees keys 0 .. start + j.
                    qpos = torch.arange(start, start + n, device=q.device)[:, None]
                    kpos = torch.arange(start + n, device=q.device)[None, :]
                    mask = kpos <= qpos  # [n, start + n]
                oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale, enable_gqa=True)
            out[offset:offset + n] = oi.transpose(0, 1)
            offset += n
        return out
