"""Qwen3.5 (dense), a hybrid: each layer's token mixer is, by the config's `layer_types`, either Gated DeltaNet
linear attention (engine/layers/gated_deltanet.py; three of every four layers in the hub's sizes) or full attention
with an output gate (q_proj yields each head's query and a gate, the output is scaled by sigmoid(gate)), q/k norms and
partial rotary. Norms scale by (1 + w) (Gemma's arithmetic). Its text rotary is interleaved M-RoPE, which for text
(three equal positions) is plain RoPE over the rotary fraction of the head.

The paged KV cache holds the attention layers only; the linear layers keep per-request state slots (make_kv_caches
gives them (conv, recurrent) state tensors in the same list, so a layer reads what the list holds at its place)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.attention import AttentionBackend, AttentionMetadata
from engine.layers.gated_deltanet import GatedDeltaNet
from engine.layers.linear import Linear
from engine.layers.norm import GemmaRMSNorm
from engine.layers.rope import RotaryEmbedding
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.loading.lora import LoraError
from engine.models.llama import MLP, Attention, LlamaForCausalLM

LINEAR, FULL = "linear_attention", "full_attention"


class GatedAttention(Attention):
    """transformers' Qwen3_5Attention: q_proj is [Hq x 2D] (per head, its query then its gate)."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, bool(cfg.attention_bias), bool(cfg.attention_bias))
        self.q_proj = Linear(cfg.hidden_size, 2 * self.num_heads * self.head_dim, bias=bool(cfg.attention_bias))
        self.q_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)
        self.k_norm = GemmaRMSNorm(self.head_dim, cfg.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        t, h, d = x.shape[0], self.num_heads, self.head_dim
        assert self.qkv_proj is not None and self.q_norm is not None and self.k_norm is not None
        qg, k, v = self.qkv_proj(x).split([2 * h * d, self.num_kv_heads * d, self.num_kv_heads * d], dim=-1)
        q, gate = qg.view(t, h, 2 * d).chunk(2, dim=-1)  # [T, Hq, D] each
        q = self.q_norm(q)
        k = self.k_norm(k.view(t, self.num_kv_heads, d))
        q, k = rope.apply(q, k, cos, sin)
        o = backend.forward(q.contiguous(), k.contiguous(), v.view(t, self.num_kv_heads, d), k_cache, v_cache, meta,
                            self.scale)
        return self.o_proj(o.reshape(t, h * d) * torch.sigmoid(gate.reshape(t, h * d)))


class HybridLayer(nn.Module):
    """Pre-norm residual block whose token mixer is `self_attn` (full attention) or `linear_attn` (Gated DeltaNet),
    the checkpoint's names; called as DecoderLayer is, with the layer's pair from make_kv_caches."""

    def __init__(self, cfg: Any, kind: str, mlp: nn.Module) -> None:
        super().__init__()
        self.kind = kind
        if kind == LINEAR:
            self.linear_attn = GatedDeltaNet(cfg)
        else:
            self.self_attn = GatedAttention(cfg)
        self.mlp = mlp
        self.input_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = GemmaRMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.rope_index = 0

    def forward(self, h: torch.Tensor, rope: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor,
                a: torch.Tensor, b: torch.Tensor, meta: AttentionMetadata, backend: AttentionBackend) -> torch.Tensor:
        """a, b: (K cache, V cache) for full attention, (conv states, recurrent states) for linear attention."""
        x = self.input_layernorm(h)
        if self.kind == LINEAR:
            h = h + self.linear_attn(x, a, b, meta)
        else:
            h = h + self.self_attn(x, rope, cos, sin, a, b, meta, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


def layer_kind(cfg: Any, i: int) -> str:
    kind = cfg.layer_types[i]
    if kind not in (LINEAR, FULL):
        raise ValueError(f"config field layer_types[{i}] is {kind!r}, which this engine does not implement "
                         f"({LINEAR}, {FULL})")
    return str(kind)


class Qwen3_5ForCausalLM(LlamaForCausalLM):
    norm_cls = GemmaRMSNorm
    # Per-request state beside the paged cache (engine/core/kv_cache_manager.py gives each running request a slot).
    hybrid = True

    def __init__(self, cfg: Any) -> None:
        if getattr(cfg, "text_config", None) is not None:  # transformers' Qwen3_5ForSequenceClassification
            raise ValueError(f"architectures {getattr(cfg, 'architectures', None)} with a vision-language config "
                             "(text_config) is not served as a classifier; Qwen3_5TextForSequenceClassification (a "
                             "text config) is")
        super().__init__(cfg)

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        """The hub's checkpoints (Qwen3_5ForConditionalGeneration's) hold the decoder under model.language_model.,
        which transformers' Qwen3_5ForCausalLM loads as model. (its PrefixChange); their vision tower and
        multi-token-prediction weights (model.visual., mtp.) are not this model's and are not read."""
        prefix = "model.language_model."
        return "model." + name[len(prefix):] if name.startswith(prefix) else name

    def make_mlp(self, cfg: Any, i: int) -> nn.Module:
        return MLP(cfg)

    def make_layer(self, cfg: Any, i: int) -> HybridLayer:  # type: ignore[override]
        return HybridLayer(cfg, layer_kind(cfg, i), self.make_mlp(cfg, i))

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        return [FamilyRotaryEmbedding(cfg)]

    def _layers_of(self, kind: str) -> list[HybridLayer]:
        return [layer for layer in self.model.layers if layer.kind == kind]

    def kv_bytes_per_token(self) -> int:
        """K and V of the full-attention layers only: the linear layers keep no per-token cache."""
        return 2 * len(self._layers_of(FULL)) * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def state_bytes_per_slot(self) -> int:
        """One request's state: every linear layer's conv state (model dtype) and recurrent state (float32)."""
        total = 0
        for layer in self._layers_of(LINEAR):
            conv, rec = layer.linear_attn.state_shapes()
            total += conv[0] * conv[1] * self.dtype.itemsize + rec[0] * rec[1] * rec[2] * 4
        return total

    def make_kv_caches(self, num_slots: int, device: torch.device,
                       state_slots: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer: (K, V) [num_slots, Hkv, D] for full attention; (conv [state_slots, C, K - 1] in the model
        dtype, recurrent [state_slots, Hv, Dk, Dv] float32) for linear attention."""
        caches = []
        for layer in self.model.layers:
            if layer.kind == FULL:
                shape = (num_slots, self.num_kv_heads, self.head_dim)
                caches.append((torch.zeros(shape, dtype=self.dtype, device=device),
                               torch.zeros(shape, dtype=self.dtype, device=device)))
            else:
                conv, rec = layer.linear_attn.state_shapes()
                caches.append((torch.zeros((state_slots, *conv), dtype=self.dtype, device=device),
                               torch.zeros((state_slots, *rec), dtype=torch.float32, device=device)))
        return caches

    def lora_targets(self, i: int) -> dict[str, tuple[Linear, int, list[int]]]:
        raise LoraError(f"LoRA adapters (config field lora_adapters, POST /v1/load_lora_adapter) are not served for "
                        f"{type(self).__name__}: its linear-attention layers have no adapter targets in this engine.")

    def batch_invariant_blockers(self) -> list[str]:
        found = {"Gated DeltaNet linear attention (layer_types)"}
        if any(not isinstance(layer.mlp, MLP) for layer in self.model.layers):
            found.add("mixture-of-experts MLP blocks (num_experts)")
        return sorted(found)

    def fuse_projections(self) -> None:
        for layer in self.model.layers:
            (layer.linear_attn if layer.kind == LINEAR else layer.self_attn).fuse()
            layer.mlp.fuse()
