"""A model's memory from its config.json alone (no weights, no transformers): bytes of weights per rank and KV
bytes per token per rank under tensor_parallel_size x pipeline_parallel_size, for `python -m deploy.plan`.

Weights: parameters counted from the config's sizes (embedding, LM head unless tied, attention by kind, dense or
mixture-of-experts MLPs with shared experts, norms left out: < 0.01 %), at the bytes of a dtype: "served", the
config's `torch_dtype` / `dtype` (what the engine holds: it dequantizes fp8 checkpoints at load,
engine/loading/fp8.py, for exact logprobs); "stored", the checkpoint's own, quantization_config's method where it
says one: fp8 (1 byte per linear weight, plus one float32 scale per weight_block_size block; embedding and LM head
stay 16-bit, as DeepSeek-V3's checkpoint stores them) or mxfp4 (gpt-oss: the experts' weights at 4 bits plus one
8-bit scale per 32 values, the rest 16-bit); or a dtype by name.

Split: tensor parallelism divides every layer's weights by N (the engine's layout, engine/parallel/shard.py; the
replicated router and norms are left out) but MLA's latent projections (q_a_proj, kv_a_proj_with_mqa), whole on
every rank; the embedding stays whole on each rank of the first stage, and the LM head is divided over the first
stage's ranks too (the engine runs the head on stage 0: engine/parallel/pipeline.py). Pipeline parallelism gives each
stage L // P layers, the remainder one more each on the last stages (the engine's stage_layers).

KV per token, by attention kind: grouped heads, 2 x kv_heads x head_dim per layer, kv heads split over the ranks
(replicated when fewer than N); MLA (DeepSeek-V3: kv_lora_rank set), the latent kv_lora_rank + qk_rope_head_dim per
layer, whole on every rank (as vLLM's MLA cache); linear-attention layers (Qwen3.5 / Qwen3-Next hybrids,
layer_types "linear_attention") hold no KV per token but a fixed state per sequence, counted apart. Sliding-window
layers are counted as full attention (an upper bound: the engine pages them like the others)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DTYPE_BYTES: dict[str, float] = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1}
MXFP4_BYTES = (4 + 8 / 32) / 8  # 4-bit values, one e8m0 scale per 32


@dataclass(frozen=True)
class Layer:
    """One decoder layer's parameters by kind, and its cache."""

    attention: float  # parameters
    experts: float  # routed experts' parameters
    dense: float  # dense MLP, shared experts, router
    kv_per_token: float  # elements per token (whole layer, before any split); 0: none
    kv_splits: bool  # kv heads divide over tensor-parallel ranks
    kv_heads: int
    state_per_seq: float  # elements of a linear-attention layer's state per sequence (before any split)
    replicated: float = 0.0  # of `attention`, the parameters whole on every tensor-parallel rank (MLA's latent path)


@dataclass(frozen=True)
class ModelSize:
    name: str
    layers: list[Layer]
    embed: float  # parameters
    head: float  # 0 when tied
    weight_bytes: float  # bytes per parameter of attention / dense weights
    expert_bytes: float  # bytes per parameter of the routed experts
    embed_bytes: float
    kv_bytes: float  # bytes per cached element (the served dtype)
    heads: int
    notes: list[str]

    @property
    def params(self) -> float:
        return self.embed + self.head + sum(x.attention + x.experts + x.dense for x in self.layers)

    @property
    def weight_total(self) -> float:
        return ((self.embed + self.head) * self.embed_bytes
                + sum((x.attention + x.dense) * self.weight_bytes + x.experts * self.expert_bytes
                      for x in self.layers))

    def stages(self, pp: int) -> list[list[Layer]]:
        sizes = [len(self.layers) // pp + (s >= pp - len(self.layers) % pp) for s in range(pp)]
        return [self.layers[sum(sizes[:s]):sum(sizes[:s + 1])] for s in range(pp)]

    def rank_weights(self, tp: int, pp: int, stage: int) -> float:
        """Bytes of weights on one rank of `stage` (0-based) of tp x pp."""
        layers = self.stages(pp)[stage]
        total = sum((x.attention - x.replicated + x.dense) * self.weight_bytes + x.experts * self.expert_bytes
                    for x in layers) / tp + sum(x.replicated for x in layers) * self.weight_bytes
        if stage == 0:  # the embedding whole on every rank, the head's vocabulary split
            total += self.embed * self.embed_bytes + self.head * self.embed_bytes / tp
        return total

    def rank_kv_per_token(self, tp: int, pp: int, stage: int) -> float:
        """Bytes one rank of `stage` caches per token of context."""
        total = 0.0
        for x in self.stages(pp)[stage]:
            if not x.kv_per_token:
                continue
            share = (max(x.kv_heads // tp, 1) / x.kv_heads) if x.kv_splits else 1.0
            total += x.kv_per_token * share
        return total * self.kv_bytes

    def rank_state_per_seq(self, tp: int, pp: int, stage: int) -> float:
        return sum(x.state_per_seq for x in self.stages(pp)[stage]) / tp * self.kv_bytes


def _get(cfg: dict[str, Any], *names: str, default: Any = None) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return default


def model_size(config: dict[str, Any], dtype: str = "served") -> ModelSize:
    """dtype: of weights and cache: "served" (the config's dtype), "stored" (quantized where the config says) or a
    name of DTYPE_BYTES."""
    top = config
    cfg = config.get("text_config") or config  # vision-language configs: the decoder's
    notes: list[str] = []
    h = int(cfg["hidden_size"])
    n_layers = int(cfg["num_hidden_layers"])
    vocab = int(cfg["vocab_size"])
    heads = int(cfg["num_attention_heads"])
    kv_heads = int(_get(cfg, "num_key_value_heads", default=heads))
    head_dim = int(_get(cfg, "head_dim", default=h // heads))
    stored = str(_get(cfg, "torch_dtype", "dtype", default=_get(top, "torch_dtype", "dtype", default="bfloat16")))
    base = DTYPE_BYTES.get(stored, 2)
    served = base if dtype in ("served", "stored") else DTYPE_BYTES[dtype]
    weight_b = expert_b = served
    quant = (top.get("quantization_config") or cfg.get("quantization_config") or {}) if dtype == "stored" else {}
    method = quant.get("quant_method")
    if method == "fp8":
        block = quant.get("weight_block_size") or [128, 128]
        weight_b = expert_b = 1 + 4 / (block[0] * block[1])
        notes.append(f"fp8 weights (blocks {block[0]}x{block[1]}), 16-bit embedding and LM head")
    elif method == "mxfp4":
        expert_b = MXFP4_BYTES
        notes.append("mxfp4 experts (4.25 bits per weight), the rest 16-bit")
    elif method:
        raise ValueError(f"quantization_config.quant_method {method!r} is not sized (fp8, mxfp4)")

    # Attention, by kind.
    kv_lora = cfg.get("kv_lora_rank")
    types = cfg.get("layer_types") or []
    if kv_lora:  # MLA
        rope, nope = int(cfg["qk_rope_head_dim"]), int(cfg["qk_nope_head_dim"])
        v_dim, q_lora = int(cfg["v_head_dim"]), cfg.get("q_lora_rank")
        q = h * q_lora + q_lora * heads * (nope + rope) if q_lora else h * heads * (nope + rope)
        full_attn = q + h * (kv_lora + rope) + kv_lora * heads * (nope + v_dim) + heads * v_dim * h
        full_kv, kv_split = kv_lora + rope, False
        latent = (h * q_lora if q_lora else 0) + h * (kv_lora + rope)  # every rank computes the whole latent
    else:
        gated = 2 if cfg.get("attn_output_gate") or top.get("model_type", "").startswith(("qwen3_next", "qwen3_5")) \
            else 1  # Qwen3-Next / Qwen3.5 full-attention layers gate their output: q_proj twice as wide
        full_attn = h * heads * head_dim * gated + 2 * h * kv_heads * head_dim + heads * head_dim * h
        full_kv, kv_split = 2 * kv_heads * head_dim, True
        latent = 0
    lin = None
    if "linear_attention" in types:
        nk, nv = int(cfg["linear_num_key_heads"]), int(cfg["linear_num_value_heads"])
        dk, dv, kernel = int(cfg["linear_key_head_dim"]), int(cfg["linear_value_head_dim"]), \
            int(cfg["linear_conv_kernel_dim"])
        conv = 2 * nk * dk + nv * dv
        params = h * (2 * nk * dk + 2 * nv * dv) + h * 2 * nv + conv * kernel + nv * dv * h
        lin = (params, conv * (kernel - 1) + nv * dk * dv)  # conv window + recurrent state per sequence

    # MLPs: which layers are sparse, and their sizes.
    n_experts = int(_get(cfg, "num_experts", "n_routed_experts", "num_local_experts", default=0))
    moe_width = int(_get(cfg, "moe_intermediate_size", default=cfg.get("intermediate_size", 0)))
    dense_width = int(cfg.get("intermediate_size") or 0)
    shared = int(_get(cfg, "shared_expert_intermediate_size", default=0)) or \
        int(cfg.get("n_shared_experts") or 0) * moe_width
    glu = 3  # gate, up, down

    def sparse(i: int) -> bool:
        if not n_experts:
            return False
        if "first_k_dense_replace" in cfg:  # DeepSeek
            return i >= int(cfg["first_k_dense_replace"]) and i % int(cfg.get("moe_layer_freq") or 1) == 0
        if i in (cfg.get("mlp_only_layers") or []):
            return False
        return (i + 1) % int(cfg.get("decoder_sparse_step") or 1) == 0

    layers = []
    for i in range(n_layers):
        linear = bool(types) and types[i] == "linear_attention"
        attn, kv, state = (lin[0], 0.0, float(lin[1])) if linear and lin else (full_attn, float(full_kv), 0.0)
        if sparse(i):
            experts = n_experts * glu * h * moe_width
            dense = glu * h * shared + h * n_experts + (h if cfg.get("shared_expert_intermediate_size") else 0)
        else:
            experts, dense = 0.0, glu * h * dense_width
        layers.append(Layer(attn, experts, dense, kv, kv_split, kv_heads, state, 0.0 if linear and lin else latent))
    if cfg.get("num_nextn_predict_layers"):
        notes.append(f"{cfg['num_nextn_predict_layers']} multi-token-prediction layer(s) not counted (not served)")
    tied = bool(_get(cfg, "tie_word_embeddings", default=_get(top, "tie_word_embeddings", default=False)))
    name = (top.get("architectures") or [top.get("model_type", "model")])[0]
    return ModelSize(name, layers, vocab * h, 0 if tied else vocab * h, weight_b, expert_b,
                     served, served, heads, notes)
