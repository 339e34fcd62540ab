"""Multi-head Latent Attention (DeepSeek-V2/V3, Kimi-K2) over a latent paged cache.

A token's keys and values come from one compressed vector: the kv_a_layernorm-ed latent c [kv_lora_rank] (through
kv_b_proj: each head's k_nope and v) and a decoupled rotary key k_pe [qk_rope_head_dim] shared by every head. The
paged cache holds exactly that per token and layer, [c, k_pe] (kv_lora_rank + qk_rope_head_dim values), never
per-head keys and values.

Attention runs with the projections absorbed (DeepSeek-V2 paper, section 2.1.2): head h's score
q_nope . (W_uk[h] c) + q_pe . k_pe equals [W_uk[h]^T q_nope, q_pe] . [c, k_pe], and its output
sum_j p_j W_uv[h] c_j equals W_uv[h] (sum_j p_j c_j). So every head attends the cached [c, k_pe] vectors themselves,
as multi-query attention (one KV head) with head dim kv_lora_rank + qk_rope_head_dim, and the backend's values are
the same vectors (k_cache and v_cache are one tensor): the last qk_rope_head_dim output dims are dropped and the rest
go through W_uv. Any paged-attention backend (TorchPagedAttention, the varlen kernels) runs it unchanged, with no
per-step rebuild of every cached token's keys. In float32 this is transformers' arithmetic re-associated (the same
products summed in another order): measured within 1e-6 of its rows on the tiny checkpoints.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.modeling_rope_utils import yarn_apply_mscale

from engine.layers.attention import AttentionBackend, AttentionMetadata
from engine.layers.linear import Linear
from engine.layers.norm import RMSNorm
from engine.layers.rope import RotaryEmbedding, rope_parameters

# transformers' DeepseekV3RMSNorm default: q_a_layernorm and kv_a_layernorm take no eps from the config.
LATENT_NORM_EPS = 1e-6


class MultiHeadLatentAttention(nn.Module):
    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.num_heads = int(cfg.num_attention_heads)
        self.q_lora_rank: int | None = cfg.q_lora_rank
        self.kv_lora_rank = int(cfg.kv_lora_rank)
        self.nope_dim = int(cfg.qk_nope_head_dim)
        self.rope_dim = int(cfg.qk_rope_head_dim)
        self.v_dim = int(cfg.v_head_dim)
        self.qk_dim = self.nope_dim + self.rope_dim
        # What the paged cache holds per token: one "KV head" of the latent then the rotary key.
        self.num_kv_heads = 1
        self.head_dim = self.kv_lora_rank + self.rope_dim
        self.interleave = bool(getattr(cfg, "rope_interleave", True))
        # YaRN's mscale_all_dim scales every dim's score, not only the rotary ones (transformers' MLA scaling).
        self.scale = float(yarn_apply_mscale(rope_parameters(cfg), self.qk_dim ** -0.5))
        # The family features LlamaForCausalLM's checks read: MLA has neither.
        self.sliding_window: int | None = None
        self.softcap: float | None = None
        bias = bool(getattr(cfg, "attention_bias", False))
        hidden, heads = int(cfg.hidden_size), self.num_heads
        if self.q_lora_rank is None:
            self.q_proj = Linear(hidden, heads * self.qk_dim, bias=False)
        else:
            self.q_a_proj = Linear(hidden, self.q_lora_rank, bias=bias)
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(self.q_lora_rank, heads * self.qk_dim, bias=False)
        self.kv_a_proj_with_mqa = Linear(hidden, self.kv_lora_rank + self.rope_dim, bias=bias)
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = Linear(self.kv_lora_rank, heads * (self.nope_dim + self.v_dim), bias=False)
        self.o_proj = Linear(heads * self.v_dim, hidden, bias=bias)
        self.w_uk: torch.Tensor | None = None  # [H, nope, lora]
        self.w_uv: torch.Tensor | None = None  # [H, v, lora]

    def fuse(self) -> None:
        """kv_b_proj's key and value parts per head, as views of its weight (a weight update reaches them)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        self.w_uk, self.w_uv = w[:, :self.nope_dim], w[:, self.nope_dim:]

    def rotate(self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor,
               sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """q: [T, H, R], k: [T, 1, R], cos/sin: [T, R]. Interleaved: transformers' apply_rotary_pos_emb_interleave
        (pairs (x0, x1), (x2, x3), ... turn by one angle; the output holds the pairs' first members, then their
        second ones, for q and k alike); else the rotate-half form."""
        if not self.interleave:
            return RotaryEmbedding.apply(q, k, cos, sin)
        half = cos.shape[-1] // 2
        c, s = cos[:, None, :half], sin[:, None, :half]

        def turn(x: torch.Tensor) -> torch.Tensor:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s], dim=-1)

        return turn(q), turn(k)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        """x: [T, hidden]; k_cache is v_cache: [slots, 1, kv_lora_rank + rope]. Returns [T, hidden]."""
        del rope  # the rotation is MLA's own (interleaved or not), on the decoupled dims only
        assert self.w_uk is not None and self.w_uv is not None, "fuse() after loading the weights"
        t = x.shape[0]
        q = self.q_proj(x) if self.q_lora_rank is None else self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x)))
        q_nope, q_pe = q.view(t, self.num_heads, self.qk_dim).split([self.nope_dim, self.rope_dim], dim=-1)
        c, k_pe = self.kv_a_proj_with_mqa(x).split([self.kv_lora_rank, self.rope_dim], dim=-1)
        c = self.kv_a_layernorm(c)  # [T, lora]
        q_pe, k_pe = self.rotate(q_pe, k_pe[:, None, :], cos, sin)  # [T, H, R], [T, 1, R]
        q_lat = torch.bmm(q_nope.transpose(0, 1), self.w_uk).transpose(0, 1)  # [T, H, lora]: W_uk^T q_nope
        query = torch.cat([q_lat, q_pe], dim=-1)  # [T, H, lora + R]
        latent = torch.cat([c[:, None, :], k_pe], dim=-1)  # [T, 1, lora + R]: what the cache keeps
        o = backend.forward(query, latent, latent, k_cache, v_cache, meta, self.scale)  # [T, H, lora + R]
        o = torch.bmm(o[..., :self.kv_lora_rank].transpose(0, 1), self.w_uv.transpose(1, 2))  # [H, T, v]
        return self.o_proj(o.transpose(0, 1).reshape(t, self.num_heads * self.v_dim))
