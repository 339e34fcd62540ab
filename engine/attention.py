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
        groups = q.shape[1] // k.shape[1]
        offset = 0
        for start, n, slots in zip(meta.starts, meta.lens, meta.context_slots, strict=True):
            # 4-D [1, H, S, D]: CPU's fused (flash) SDPA kernel takes only 4-D inputs, else the math path.
            qi = q[offset:offset + n].transpose(0, 1)[None]  # [1, Hq, n, D]
            if start == 0:
                # Whole context is new: use it directly (no gather) with a plain causal mask.
                ki = _expand(k[offset:offset + n], groups)  # [1, Hq, n, D]
                vi = _expand(v[offset:offset + n], groups)
                oi = F.scaled_dot_product_attention(qi, ki, vi, is_causal=n > 1, scale=scale)
            else:
                ki = _expand(k_cache.index_select(0, slots), groups)  # [1, Hq, start + n, D]
                vi = _expand(v_cache.index_select(0, slots), groups)
                mask = None
                if n > 1:
                    # Query j sits at position start + j and sees keys 0 .. start + j.
                    qpos = torch.arange(start, start + n, device=q.device)[:, None]
                    kpos = torch.arange(start + n, device=q.device)[None, :]
                    mask = kpos <= qpos  # [n, start + n]
                oi = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=mask, scale=scale)
            out[offset:offset + n] = oi[0].transpose(0, 1)
            offset += n
        return out


def _expand(x: torch.Tensor, groups: int) -> torch.Tensor:
    """[S, Hkv, D] -> [1, Hq, S, D]. Explicit repeat rather than SDPA's enable_gqa, which sends CPU attention down
    the math path that materializes [H, S, S] scores (gigabytes for a long prompt)."""
    x = x.transpose(0, 1)
    return (x.repeat_interleave(groups, dim=0) if groups > 1 else x)[None]
