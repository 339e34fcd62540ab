"""Llama-family decoder (Llama 2/3, SmolLM2, TinyLlama, Mistral-style configs) with the checkpoint's
parameter names, so weights load by name. Forward runs over a flat batch of tokens from many requests."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.invariant.activation import invariant_silu
from engine.layers.activation import activation
from engine.layers.attention import AttentionBackend, AttentionMetadata
from engine.layers.embedding import unset_embedding
from engine.layers.linear import Linear, float32_linear
from engine.layers.norm import RMSNorm
from engine.layers.rope import RotaryEmbedding


class Attention(nn.Module):
    def __init__(self, cfg: Any, qkv_bias: bool, o_bias: bool) -> None:
        super().__init__()
        self.num_heads = cfg.num_attention_heads
        self.num_kv_heads = getattr(cfg, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // self.num_heads
        self.scale = self.head_dim ** -0.5
        # Family features, set by the family's make_layer (None: off). Per-head norms on q and k before RoPE
        # (Qwen3, Gemma 3); keys older than `sliding_window` positions masked; tanh cap on the attention scores.
        self.q_norm: nn.Module | None = None
        self.k_norm: nn.Module | None = None
        self.sliding_window: int | None = None
        self.softcap: float | None = None
        # gpt-oss: [Hq] learned per-head logits in the softmax's denominator (a parameter the family adds).
        self.sinks: nn.Parameter | None = None
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
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = rope.apply(q, k, cos, sin)
        if self.sliding_window is None and self.softcap is None and self.sinks is None:
            o = backend.forward(q, k, v, k_cache, v_cache, meta, self.scale)  # [T, Hq, D]
        else:  # not the batch-invariant backend: ModelRunner refuses batch-invariant mode for such a model
            o = backend.forward(q, k, v, k_cache, v_cache, meta, self.scale, window=self.sliding_window,
                                softcap=self.softcap, sinks=self.sinks)
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class MLP(nn.Module):
    # Set by engine.invariant.mode.set_batch_invariant.
    batch_invariant: bool = False

    def __init__(self, cfg: Any, intermediate_size: int | None = None, act: str | None = None) -> None:
        super().__init__()
        bias = bool(getattr(cfg, "mlp_bias", False))
        width = intermediate_size or cfg.intermediate_size
        self.gate_proj = Linear(cfg.hidden_size, width, bias=bias)
        self.up_proj = Linear(cfg.hidden_size, width, bias=bias)
        self.down_proj = Linear(width, cfg.hidden_size, bias=bias)
        act = act or cfg.hidden_act
        self.act = activation(act)
        self.act_name = act
        self.silu = act in ("silu", "swish")
        self.intermediate_size = width
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
    def __init__(self, cfg: Any, attn: Attention, mlp: nn.Module, norm: type[nn.Module] = RMSNorm) -> None:
        super().__init__()
        self.self_attn = attn
        self.mlp = mlp
        self.input_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        self.post_attention_layernorm = norm(cfg.hidden_size, cfg.rms_norm_eps)
        # Which of the model's rotary embeddings this layer uses (Gemma 3: local or global base).
        self.rope_index = 0

    def forward(self, h: torch.Tensor, rope: RotaryEmbedding, cos: torch.Tensor, sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                backend: AttentionBackend) -> torch.Tensor:
        """Pre-norm residual block: h + attn(norm(h)), then + mlp(norm(h)). h: [T, hidden]."""
        h = h + self.self_attn(self.input_layernorm(h), rope, cos, sin, k_cache, v_cache, meta, backend)
        return h + self.mlp(self.post_attention_layernorm(h))


class DecoderModel(nn.Module):
    def __init__(self, cfg: Any, layers: list[nn.Module], norm: nn.Module) -> None:
        super().__init__()
        self.embed_tokens = unset_embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(layers)
        self.norm = norm


def is_classifier(cfg: Any) -> bool:
    """A `*ForSequenceClassification` checkpoint: a `score` head instead of the LM head (engine/models/__init__.py)."""
    return any(str(a).endswith("ForSequenceClassification") for a in getattr(cfg, "architectures", None) or [])


class LlamaForCausalLM(nn.Module):
    @staticmethod
    def attention_biases(cfg: Any) -> tuple[bool, bool]:
        """(q/k/v bias, o bias): Llama has both only when the config says attention_bias."""
        bias = bool(getattr(cfg, "attention_bias", False))
        return bias, bias

    # Family hooks: a subclass overrides these rather than the forward.
    norm_cls: type[nn.Module] = RMSNorm
    # Takes images (engine/models/vision/language.py): [3, T] M-RoPE positions and a step's image rows.
    multimodal = False
    # Keeps per-request state slots beside the paged cache (Qwen3.5's linear attention: state_bytes_per_slot).
    hybrid = False

    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        """This model's parameter name for a checkpoint's (the same, but where a family's layout nests them)."""
        return name

    @classmethod
    def keeps_float32(cls, name: str) -> bool:
        """Whether parameter `name` stays float32 whatever the served dtype (transformers' _keep_in_fp32_modules)."""
        return False

    @classmethod
    def checkpoint_tensor(cls, name: str, tensor: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """A stored tensor as this model's parameter `name` (of `shape`) takes it: as stored, but where a family's
        checkpoints come in two layouts."""
        return tensor

    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        """Layer i, with the checkpoint's parameter names under model.layers.i."""
        attn = Attention(cfg, *self.attention_biases(cfg))
        attn.sliding_window = self.layer_window(cfg, i)
        return DecoderLayer(cfg, attn, MLP(cfg), self.norm_cls)

    @staticmethod
    def layer_window(cfg: Any, i: int) -> int | None:
        """Layer i's sliding window, by `layer_types` (transformers' Qwen2/Qwen3/Gemma rule); None: full attention."""
        types = getattr(cfg, "layer_types", None)
        if types and types[i] not in ("full_attention", "sliding_attention"):
            raise ValueError(f"config field layer_types[{i}] is {types[i]!r}, which this engine does not "
                             "implement (full_attention, sliding_attention)")
        window = getattr(cfg, "sliding_window", None)
        return window if types and types[i] == "sliding_attention" and window else None

    def lora_targets(self, i: int) -> dict[str, tuple[Linear, int, list[int]]]:
        """Layer i's linears a LoRA adapter may target, by PEFT's module names: (the served, fused Linear, which of
        its parts the module is, the output widths of its parts). An MoE layer's experts are not targets. Widths are
        the whole linear's, as adapters are written (a tensor-parallel rank's Linear is a share of it)."""
        layer = self.model.layers[i]
        attn = layer.self_attn
        assert attn.qkv_proj is not None, "fuse() after loading the weights"
        q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
        qkv = attn.qkv_proj.whole_parts([q, kv, kv])
        targets = {name: (attn.qkv_proj, part, qkv) for part, name in enumerate(("q_proj", "k_proj", "v_proj"))}
        targets["o_proj"] = (attn.o_proj, 0, [attn.o_proj.out_features])
        mlp = layer.mlp
        if isinstance(mlp, MLP):
            assert mlp.gate_up_proj is not None
            width = mlp.intermediate_size
            gate_up = mlp.gate_up_proj.whole_parts([width, width])
            targets["gate_proj"] = (mlp.gate_up_proj, 0, gate_up)
            targets["up_proj"] = (mlp.gate_up_proj, 1, gate_up)
            targets["down_proj"] = (mlp.down_proj, 0, [mlp.down_proj.out_features])
        return targets

    def position_limit(self) -> int | None:
        """The most positions this engine computes as transformers does (LLMEngine caps max_model_len to it);
        None: no such limit. transformers recomputes two RoPE types from the forward's length: "dynamic" past
        max_position_embeddings, and "longrope" (its long factors, for every position of the call) past
        original_max_position_embeddings; the engine computes each position once, with the fixed frequencies."""
        limits = []
        for rope in self.ropes:
            kind = rope.params.get("rope_type")
            if kind == "longrope":
                limits.append(int(rope.params.get("original_max_position_embeddings")
                                  or self.config.original_max_position_embeddings))
            elif kind == "dynamic":
                limits.append(int(self.config.max_position_embeddings))
        return min(limits, default=None)

    def make_ropes(self, cfg: Any) -> list[RotaryEmbedding]:
        """The distinct rotary embeddings; each layer's rope_index picks one."""
        return [RotaryEmbedding(cfg)]

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.config = cfg
        self.model = DecoderModel(cfg, [self.make_layer(cfg, i) for i in range(cfg.num_hidden_layers)],
                                  self.norm_cls(cfg.hidden_size, cfg.rms_norm_eps))
        # A classifier (transformers' GenericForSequenceClassification) has no LM head: `score`, a bias-free
        # [num_labels x hidden] linear on the final-normed hidden state of the pooled position.
        self.classifier = is_classifier(cfg)
        self.num_labels = int(cfg.num_labels) if self.classifier else 0
        if self.classifier:
            self.score = Linear(cfg.hidden_size, self.num_labels, bias=False)
        else:
            self.lm_head = Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.tie_word_embeddings = bool(getattr(cfg, "tie_word_embeddings", False)) and not self.classifier
        self.ropes = self.make_ropes(cfg)
        # Gemma: embeddings times sqrt(hidden), in the weights' dtype as transformers rounds it; None: unscaled.
        self.embed_scale: float | None = None
        # Gemma 2: logits = cap * tanh(logits / cap) before any log-softmax; None: raw logits.
        self.final_logit_softcap: float | None = None
        # EngineConfig.float32_head (set by the loader): the head projects the upcast norm output in float32.
        self.float32_head = False
        # Pipeline parallelism: every stage's (KV bytes per token, state bytes per slot), set at the cut
        # (engine/parallel/pipeline.py's stage_costs); empty: this model is whole.
        self.stage_costs: list[tuple[int, int]] = []
        # The first layer with attention (a hybrid's first layers may have none).
        head = next((layer.self_attn for layer in self.model.layers if hasattr(layer, "self_attn")), None)
        self.num_kv_heads = head.num_kv_heads if head else 0
        self.head_dim = head.head_dim if head else 0

    @property
    def rope(self) -> RotaryEmbedding:
        return self.ropes[0]

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
        """K and V of every layer for one position, in the model dtype (a family whose cache differs overrides this
        and make_kv_caches together)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    def state_bytes_per_slot(self) -> int:
        """Bytes of one request's state slot beside the paged cache (a hybrid's linear layers); 0: none."""
        return 0

    def make_kv_caches(self, num_slots: int, device: torch.device,
                       state_slots: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """The paged cache of each of this model's layers, in layer order: a (K, V) pair of [slots, ...] tensors,
        slot = block * block_size + offset. The model owns the layout because families differ (a latent per token,
        layers with no paged cache, a pipeline stage's layers only); the runner and the ranks only allocate it.
        state_slots: how many per-request state slots a hybrid allocates (unused by others)."""
        shape = (num_slots, self.num_kv_heads, self.head_dim)  # [slots, Hkv, D]
        return [(torch.zeros(shape, dtype=self.dtype, device=device),
                 torch.zeros(shape, dtype=self.dtype, device=device)) for _ in range(self.num_layers)]

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, hidden] rows as forward() returns them -> [R, vocab] raw logits in the model dtype (float32
        with float32_head). Callers pass only the rows they need (bounded blocks), never the whole batch."""
        normed = self.model.norm(hidden)
        return self._cap(float32_linear(normed, self.lm_head.weight) if self.float32_head else self.lm_head(normed))

    def classify(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [R, hidden] pooled rows as forward() returns them -> [R, num_labels] float32 raw scores, as
        transformers' score(norm(h)) (no soft-cap: transformers applies none to a classifier's head)."""
        normed = self.model.norm(hidden)
        return float32_linear(normed, self.score.weight) if self.float32_head else self.score(normed).float()

    def _cap(self, logits: torch.Tensor) -> torch.Tensor:
        """transformers' final soft-cap: divide, tanh, multiply (same ops, same order, so the same bits)."""
        if self.final_logit_softcap is None:
            return logits
        return torch.tanh(logits / self.final_logit_softcap) * self.final_logit_softcap

    def target_logits(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """hidden: [R, hidden], targets: [R] -> [R] float32 raw logit of each row's target token alone: one dot
        product with that token's LM-head row instead of a vocabulary-wide projection."""
        h = self.model.norm(hidden).float()  # [R, hidden]
        w = self.lm_head.weight[targets].float()  # [R, hidden]
        return self._cap((h * w).sum(-1))

    def batch_invariant_blockers(self) -> list[str]:
        """The features of this checkpoint batch-invariant mode does not cover (engine/invariant/mode.py), each with
        its config field; ModelRunner refuses the mode for a model that has any."""
        found: set[str] = set()
        for layer in self.model.layers:
            if layer.self_attn.sliding_window is not None:
                found.add("sliding-window attention (sliding_window)")
            if layer.self_attn.softcap is not None:
                found.add("attention logit soft-capping (attn_logit_softcapping)")
            if layer.self_attn.sinks is not None:
                found.add("attention sinks (the checkpoint's self_attn.sinks)")
            if not isinstance(layer.mlp, MLP):
                found.add("mixture-of-experts MLP blocks (num_experts)")
            elif not layer.mlp.silu:  # only SiLU has an invariant form (invariant_silu)
                found.add(f"the {layer.mlp.act_name} activation (hidden_act / hidden_activation)")
        if self.final_logit_softcap is not None:
            found.add("final logit soft-capping (final_logit_softcapping)")
        return sorted(found)

    def tie_weights(self) -> None:
        if self.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    def fuse_projections(self) -> None:
        """After loading by checkpoint name: merge q/k/v and gate/up into single matmuls."""
        for layer in self.model.layers:
            layer.self_attn.fuse()
            layer.mlp.fuse()

    def rope_to(self, device: torch.device) -> None:
        for rope in self.ropes:
            rope.to(device)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor,
                kv_caches: list[tuple[torch.Tensor, torch.Tensor]], meta: AttentionMetadata,
                backend: AttentionBackend, hidden: torch.Tensor | None = None) -> torch.Tensor:
        """input_ids, positions: [T]. Returns the last layer's hidden states before the final norm: [T, hidden].
        The runner applies norm + LM head only to the rows it needs. hidden: a later pipeline stage's input, the
        previous stage's [T, hidden] (engine/parallel/pipeline.py), instead of the embedding."""
        if hidden is None:
            h = self.model.embed_tokens(input_ids)  # [T, hidden]
            if self.embed_scale is not None:
                h = h * torch.tensor(self.embed_scale, dtype=h.dtype)
        else:
            h = hidden
        tables = [rope.cos_sin(positions, h.dtype) for rope in self.ropes]  # each ([T, D_rot], [T, D_rot])
        for layer, (k_cache, v_cache) in zip(self.model.layers, kv_caches, strict=True):
            cos, sin = tables[layer.rope_index]
            h = layer(h, self.ropes[layer.rope_index], cos, sin, k_cache, v_cache, meta, backend)
        return h
