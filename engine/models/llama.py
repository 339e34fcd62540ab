"""Llama-family decoder (Llama 2/3, SmolLM2, TinyLlama, Mistral-style configs) with the checkpoint's
parameter names, so weights load by name. Forward runs over a flat batch of tokens from many requests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from transformers.activations import ACT2FN

from engine.layers.activation import invariant_silu
from engine.layers.attention import AttentionBackend, AttentionMetadata
from engine.layers.linear import Linear
from engine.layers.norm import RMSNorm
from engine.layers.rope import RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5
        self.q_proj = Linear(cfg.hidden_size, self.num_heads * self.head_dim, bias=qkv_bias)
        self.k_proj = Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.v_proj = Linear(cfg.hidden_size, self.num_kv_heads * self.head_dim, bias=qkv_bias)
        self.o_proj = Linear(self.num_heads * self.head_dim, cfg.hidden_size, bias=o_bias)
        self.qkv_proj: Linear | None = None

    def fuse(self) -> None:
        """One [Hq + 2 Hkv] x D projection instead of three (vLLM's QKVParallelLinear): one larger matmul uses the
        cores better than a wide one and two narrow ones (k/v are a third of q's width with GQA)."""
        self.qkv_proj = _fused([self.q_proj, self.k_proj, self.v_proj])
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        t = x.shape[0]
        assert self.qkv_proj is not None, "fuse() after loading the weights"
        q, k, v = self.qkv_proj(x).split([self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim,
                                          self.num_kv_heads * self.head_dim], dim=-1)
        q = q.view(t, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(t, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(t, self.num_kv_heads, self.head_dim)
        q, k = rope.apply(q, k, cos, sin)
        o = backend.forward(q, k, v, k_cache, v_cache, meta, self.scale)  # [T, Hq, D]
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    # Set by engine.invariant.set_batch_invariant.
    batch_invariant: bool = False

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        bias = bool(getattr(cfg, "mlp_bias", False))
        self.gate_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.up_proj = Linear(cfg.hidden_size, cfg.intermediate_size, bias=bias)
        self.down_proj = Linear(cfg.intermediate_size, cfg.hidden_size, bias=bias)
        self.act = ACT2FN[cfg.hidden_act]
        self.silu = cfg.hidden_act in ("silu", "swish")
        self.intermediate_size = cfg.intermediate_size
        self.gate_up_proj: Linear | None = None

    def fuse(self) -> None:
        """gate and up as one matmul (vLLM's MergedColumnParallelLinear)."""
        self.gate_up_proj = _fused([self.gate_proj, self.up_proj])
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        assert self.gate_up_proj is not None, "fuse() after loading the weights"
        gate, up = self.gate_up_proj(x).split(self.intermediate_size, dim=-1)
        if self.batch_invariant and self.silu:
            act = invariant_silu(gate)
        else:
            act = self.act(gate)
        return self.down_proj(act.mul_(up))


def _fused(parts: list[Linear]) -> Linear:
    """The linears' outputs side by side: weights (and biases) concatenated along the output axis. Same values
    as the separate layers (each output is the same dot product), up to the matmul's summation order."""
    w = torch.cat([p.weight for p in parts])
    bias = parts[0].bias is not None
    fused = Linear(w.shape[1], w.shape[0], bias=bias, device="meta")
    fused.weight = nn.Parameter(w, requires_grad=False)
    if bias:
        fused.bias = nn.Parameter(torch.cat([p.bias for p in parts]), requires_grad=False)
    return fused


class DecoderLayer(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        self.self_attn = Attention(cfg, qkv_bias, o_bias)
        self.mlp = MLP(cfg)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)

    def forward(self, h: torch.Tensor, rope: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        """h: [T, hidden] -> [T, hidden]: pre-norm attention, then pre-norm MLP, each added to its input."""
        h = h + self.self_attn(self.input_layernorm(h), rope, cos, sin, k_cache, v_cache, meta, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderModel(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg, qkv_bias, o_bias) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    @staticmethod
    def attention_biases(cfg: Any) -> tuple[bool, bool]:
        """(q/k/v bias, o bias): Llama has both only when the config says attention_bias."""
        bias = bool(getattr(cfg, "attention_bias", False))
        return bias, bias

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, *self.attention_biases(cfg))
        self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False))
        self.rope = RotaryEmbedding(cfg)
        head = self.model.layers[0].self_attn if cfg.num_hidden_layers else None
        self.num_kv_heads = head.num_kv_heads if head else 0
        self.head_dim = head.head_dim if head else 0

    # --- what the model runner needs ---------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.model.embed_tokens.weight.dtype

    @property
    def hidden_size(self) -> int:
        return int(self.config.hidden_size)

    @property
    def num_layers(self) -> int:
        return len(self.model.layers)

    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one position, in the model dtype."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, hidden] rows as forward() returns them -> [R, vocab] raw logits in the model dtype.
        Callers pass only the rows they need (bounded blocks), never the whole batch."""
        return self.lm_head(self.model.norm(hidden))

    def target_logits(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """hidden: [R, hidden], targets: [R] -> [R] float32 raw logit of each row's target token alone: one dot
        product with that token's LM-head row instead of a vocabulary-wide projection."""
        h = self.model.norm(hidden).float()  # [R, hidden]
        w = self.lm_head.weight[targets].float()  # [R, hidden]
        return (h * w).sum(-1)

    def tie_weights(self) -> None:
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        """After loading by checkpoint name: merge q/k/v and gate/up into single matmuls."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        """input_ids, positions: [T]. Returns the last layer's hidden states before the final norm: [T, hidden].
        The runner applies norm + LM head only to the rows it needs."""
        h = self.model.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = self.rope.cos_sin(positions, h.dtype)  # [T, D]
        for layer, (k_cache, v_cache) in zip(self.model.layers, kv_caches, strict=True):
            h = layer(h, self.rope, cos, sin, k_cache, v_cache, meta, backend)
        return h
