"""The split of a loaded model over N ranks (Megatron's layout, vLLM's QKVParallelLinear / RowParallelLinear):

- fused q/k/v: column parallel by heads. Rank r holds query heads [r Hq/N, (r+1) Hq/N) and the KV heads they read:
  KV heads split the same way when N divides Hkv, else (Hkv divides N) each KV head is replicated on N/Hkv ranks;
- o_proj: row parallel (the input columns of rank r's heads), one all-reduce, bias added once after it;
- fused gate/up: column parallel by intermediate rows; down_proj: row parallel, one all-reduce;
- mixture-of-experts blocks (engine/layers/moe.py), one all-reduce per block. By default every expert is split like
  the dense MLP: rank r holds rows [r W/N, (r+1) W/N) of each expert's gate and up and those columns of its down
  (down_bias on rank 0 only, so the sum adds it once). With expert_parallel, rank r holds whole experts
  [r E/N, (r+1) E/N) and computes only the (token, expert) pairs routed to them; the others' rows are zeros, so the
  sum adds each pair once. The router stays whole on every rank (each routes every token the same); a shared expert
  is split as the dense MLP, its down projection's partial sum added to the routed one before the block's all-reduce;
- LM head: vocabulary parallel, contiguous ranges of ceil(V/N) rows (vocab.py); the embedding stays replicated
  (a row lookup: no collective per step, for V x hidden values per rank);
- attention sinks (gpt-oss, one logit per query head): split with the query heads; Qwen3.5's gated attention (each
  head's query then its output gate in q_proj) splits q_proj by head, each head's gate with it;
- multi-head latent attention (DeepSeek-V3): the heads split, q_proj / q_b_proj rows and the absorbed kv_b_proj by
  head, o_proj row parallel (one all-reduce); the latent projections (q_a_proj, q_a_layernorm, kv_a_proj_with_mqa,
  kv_a_layernorm) replicated, so every rank computes and caches the whole latent of each token (one [c, k_pe] vector
  per token and layer, as vLLM and SGLang keep MLA's cache under TP: it has no head axis to split);
- Gated DeltaNet linear attention (Qwen3.5): heads split, rank r holding key heads [r Hk/N, (r+1) Hk/N) and the
  value heads they serve ([r Hv/N, (r+1) Hv/N): each key head serves Hv/Hk consecutive value heads), so in_proj_qkv's
  q, k and v rows, the conv1d channels, in_proj_z, in_proj_b, in_proj_a, A_log and dt_bias by head, out_proj row
  parallel (one all-reduce); the gated norm (one weight over a head's value dims) replicated. A rank's state slots
  hold its heads' conv and recurrent state only;
- norms, rotary tables, per-head q/k norms: replicated; a classifier's score head too (rank 0 applies it to the
  pooled row, which the last all-reduce made the same on every rank): no vocabulary to split;
- LoRA adapters: each split Linear records which share of the whole linear it is (engine/layers/lora.py's Shard),
  and keeps the same share of every adapter (column parallel: all of A, its rows of B; row parallel: its columns of
  A, all of B, the delta summed by the same all-reduce).

A rank's hidden states after each all-reduce are the same bits on every rank, so the residual stream, the final
norm and the scoring rows agree everywhere. The split runs after load_model's fuse, so families fused in the
checkpoint (Phi-3) and fused at load are one case."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.gated_deltanet import GatedDeltaNet
from engine.layers.linear import Linear, linear
from engine.layers.lora import Shard
from engine.layers.mla import MultiHeadLatentAttention
from engine.layers.moe import SparseMoeBlock
from engine.models.llama import MLP, LlamaForCausalLM
from engine.models.qwen3_5 import GatedAttention
from engine.parallel.group import TPGroup


class RowParallelLinear(Linear):
    """y = all_reduce(x_r W_r^T + x_r A_r^T B^T) + b: each rank multiplies its slice of the input features, adapter
    deltas included (partial sums like the base product's), and the bias is added once, after the sum."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, group: TPGroup, shard: Shard) -> None:
        super().__init__(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
        self.weight = nn.Parameter(weight.contiguous(), requires_grad=False)  # [out, in / N]
        self.bias = nn.Parameter(bias, requires_grad=False) if bias is not None else None
        self.group = group
        self.shard = shard

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = linear(x, self.weight)
        if self.lora is not None:
            y = self.lora.add(y, x)
        y = self.group.all_reduce(y)
        return y + self.bias if self.bias is not None else y


def vocab_range(vocab: int, rank: int, size: int) -> tuple[int, int]:
    """[lo, hi) of the vocabulary rank holds: contiguous ranges of ceil(V / N) (the last may be shorter)."""
    width = -(-vocab // size)
    return min(vocab, rank * width), min(vocab, (rank + 1) * width)


def refusals(model: LlamaForCausalLM, size: int, expert_parallel: bool = False) -> list[str]:
    """Why `model` cannot be split over `size` ranks, each naming its config field; empty: it can."""
    cfg = model.config
    found: list[str] = []
    attn = next((layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn")), None)
    if isinstance(attn, MultiHeadLatentAttention):  # one latent shared by every head: the heads split, not it
        if attn.num_heads % size:
            found.append(f"num_attention_heads {attn.num_heads} is not divisible by tensor_parallel_size {size}")
    elif attn is not None:
        hq, hkv = attn.num_heads, attn.num_kv_heads
        if hq % size:
            found.append(f"num_attention_heads {hq} is not divisible by tensor_parallel_size {size}")
        if hkv % size and size % hkv:
            found.append(f"num_key_value_heads {hkv} neither divides nor is divisible by tensor_parallel_size {size}")
    linear_attn = next((layer.linear_attn for layer in model.model.layers if hasattr(layer, "linear_attn")), None)
    if linear_attn is not None and linear_attn.num_k_heads % size:  # then Hv (a multiple of Hk) splits too
        found.append(f"linear_num_key_heads {linear_attn.num_k_heads} is not divisible by tensor_parallel_size "
                     f"{size}")
    widths: dict[str, int] = {}  # config field -> a width that must split evenly
    for layer in model.model.layers:
        mlp = layer.mlp
        if isinstance(mlp, SparseMoeBlock):
            if expert_parallel:
                widths["num_experts"] = mlp.num_experts
            else:
                widths["moe_intermediate_size"] = mlp.width
            if isinstance(mlp.shared_expert, MLP):
                widths["shared_expert_intermediate_size"] = mlp.shared_expert.intermediate_size
            elif mlp.shared_expert is not None:  # its whole output on every rank would be summed N times
                found.append(f"{type(mlp.shared_expert).__name__} shared experts are not split across ranks")
        elif isinstance(mlp, MLP):
            widths["intermediate_size"] = mlp.intermediate_size
        else:
            found.append(f"{type(mlp).__name__} MLP blocks are not split across ranks")
    found += [f"{name} {width} is not divisible by tensor_parallel_size {size}"
              for name, width in widths.items() if width % size]
    if not model.classifier and vocab_range(cfg.vocab_size, size - 1, size)[0] >= cfg.vocab_size:
        found.append(f"vocab_size {cfg.vocab_size} leaves a rank of tensor_parallel_size {size} no vocabulary")
    return found


def shard_model(model: LlamaForCausalLM, group: TPGroup, expert_parallel: bool = False) -> None:
    """Keep this rank's shard of every split weight (in place); raises ValueError naming what cannot be split.
    expert_parallel: MoE blocks hold whole experts per rank instead of a share of every expert."""
    rank, size = group.rank, group.size
    broken = refusals(model, size, expert_parallel)
    if broken:
        raise ValueError(f"{type(model).__name__} cannot be served with tensor_parallel_size {size}: "
                         + "; ".join(broken))
    for layer in model.model.layers:
        if isinstance(getattr(layer, "linear_attn", None), GatedDeltaNet):
            _shard_linear_attention(layer.linear_attn, rank, size, group)
        elif isinstance(layer.self_attn, MultiHeadLatentAttention):
            _shard_latent_attention(layer.self_attn, rank, size, group)
        else:
            _shard_attention(layer.self_attn, rank, size, group)
        if isinstance(layer.mlp, SparseMoeBlock):
            shard_moe(layer.mlp, rank, size, group, expert_parallel)
        else:
            _shard_mlp(layer.mlp, rank, size, group)
    attn = next((layer.self_attn for layer in model.model.layers if hasattr(layer, "self_attn")), None)
    model.num_kv_heads = attn.num_kv_heads if attn is not None else 0
    if model.classifier:  # the score head stays whole: rank 0 applies it to a pooled row, the same on every rank
        return
    lo, hi = vocab_range(model.config.vocab_size, rank, size)
    head = model.lm_head.weight[lo:hi].clone()  # a copy: with tied embeddings the full table stays for lookups
    model.lm_head = Linear(head.shape[1], head.shape[0], bias=False, device="meta")
    model.lm_head.weight = nn.Parameter(head, requires_grad=False)


def _column(rows: list[tuple[int, int]], weight: torch.Tensor, bias: torch.Tensor | None, widths: list[int]
            ) -> Linear:
    """A Linear of the given output-row ranges of a fused weight (its parts' widths: `widths`), side by side."""
    w = torch.cat([weight[lo:hi] for lo, hi in rows]).contiguous()
    out = Linear(w.shape[1], w.shape[0], bias=bias is not None, device="meta")
    out.weight = nn.Parameter(w, requires_grad=False)
    if bias is not None:
        out.bias = nn.Parameter(torch.cat([bias[lo:hi] for lo, hi in rows]).contiguous(), requires_grad=False)
    out.shard = Shard(weight.shape[1], tuple(widths), out_rows=tuple(rows))
    return out


def _row(weight: torch.Tensor, bias: torch.Tensor | None, lo: int, hi: int, group: TPGroup) -> RowParallelLinear:
    """The input features [lo, hi) of a linear, row parallel."""
    shard = Shard(weight.shape[1], (weight.shape[0],), in_cols=(lo, hi))
    return RowParallelLinear(weight[:, lo:hi], bias, group, shard)


def _shard_attention(attn: nn.Module, rank: int, size: int, group: TPGroup) -> None:
    hq, hkv, d = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q_local = hq // size
    kv_local = hkv // size if hkv % size == 0 else 1
    kv_first = rank * kv_local if hkv % size == 0 else rank // (size // hkv)  # replicated: N / Hkv ranks per head
    # q rows per head: its query, and with an output gate (Qwen3.5) its gate after it, the two split together.
    qd = 2 * d if isinstance(attn, GatedAttention) else d
    q0, k0, v0 = 0, hq * qd, hq * qd + hkv * d  # q, k, v rows of the fused projection
    qkv = attn.qkv_proj
    attn.qkv_proj = _column([(q0 + rank * q_local * qd, q0 + (rank + 1) * q_local * qd),
                             (k0 + kv_first * d, k0 + (kv_first + kv_local) * d),
                             (v0 + kv_first * d, v0 + (kv_first + kv_local) * d)], qkv.weight, qkv.bias,
                            [hq * qd, hkv * d, hkv * d])
    o = attn.o_proj
    attn.o_proj = _row(o.weight, o.bias, rank * q_local * d, (rank + 1) * q_local * d, group)
    if attn.sinks is not None:  # gpt-oss: one sink logit per query head, kept with its head
        attn.sinks = nn.Parameter(attn.sinks[rank * q_local:(rank + 1) * q_local].contiguous(), requires_grad=False)
    attn.num_heads, attn.num_kv_heads = q_local, kv_local


def _shard_latent_attention(attn: MultiHeadLatentAttention, rank: int, size: int, group: TPGroup) -> None:
    """The module docstring's MLA layout: this rank's heads of q and of the absorbed kv_b_proj, o_proj's columns of
    them; the latent path stays whole (each rank caches every token's whole latent)."""
    local = attn.num_heads // size
    lo, hi = rank * local, (rank + 1) * local
    name = "q_proj" if attn.q_lora_rank is None else "q_b_proj"
    q = getattr(attn, name)
    setattr(attn, name, _column([(lo * attn.qk_dim, hi * attn.qk_dim)], q.weight, q.bias, [q.out_features]))
    kv_b = attn.kv_b_proj  # per head its k_nope rows then its v rows: a head's rows are contiguous
    per_head = attn.nope_dim + attn.v_dim
    attn.kv_b_proj = _column([(lo * per_head, hi * per_head)], kv_b.weight, kv_b.bias, [kv_b.out_features])
    o = attn.o_proj
    attn.o_proj = _row(o.weight, o.bias, lo * attn.v_dim, hi * attn.v_dim, group)
    attn.num_heads = local
    attn.fuse()  # w_uk / w_uv: views of this rank's kv_b_proj


def _shard_linear_attention(gdn: GatedDeltaNet, rank: int, size: int, group: TPGroup) -> None:
    """The module docstring's Gated DeltaNet layout: this rank's key heads and the value heads they serve."""
    hk, hv, dk, dv = gdn.num_k_heads // size, gdn.num_v_heads // size, gdn.head_k_dim, gdn.head_v_dim
    k_lo, k_hi, v_lo, v_hi = rank * hk * dk, (rank + 1) * hk * dk, rank * hv * dv, (rank + 1) * hv * dv
    key, value = gdn.key_dim, gdn.value_dim
    channels = [(k_lo, k_hi), (key + k_lo, key + k_hi), (2 * key + v_lo, 2 * key + v_hi)]  # its q, k, v
    qkv = gdn.in_proj_qkv
    gdn.in_proj_qkv = _column(channels, qkv.weight, qkv.bias, [key, key, value])
    conv = torch.cat([gdn.conv1d.weight[lo:hi] for lo, hi in channels])  # depthwise: one filter per channel
    gdn.conv1d = nn.Conv1d(conv.shape[0], conv.shape[0], gdn.kernel, groups=conv.shape[0], bias=False, device="meta")
    gdn.conv1d.weight = _frozen(conv)
    z = gdn.in_proj_z
    gdn.in_proj_z = _column([(v_lo, v_hi)], z.weight, z.bias, [value])
    heads = (rank * hv, (rank + 1) * hv)
    for name in ("in_proj_b", "in_proj_a"):
        proj = getattr(gdn, name)
        setattr(gdn, name, _column([heads], proj.weight, proj.bias, [gdn.num_v_heads]))
    gdn.dt_bias = _frozen(gdn.dt_bias[heads[0]:heads[1]])
    gdn.A_log = _frozen(gdn.A_log[heads[0]:heads[1]])
    out = gdn.out_proj
    gdn.out_proj = _row(out.weight, out.bias, v_lo, v_hi, group)
    gdn.num_k_heads, gdn.num_v_heads = hk, hv
    gdn.key_dim, gdn.value_dim = hk * dk, hv * dv
    gdn.conv_dim = 2 * gdn.key_dim + gdn.value_dim


def _shard_mlp(mlp: MLP, rank: int, size: int, group: TPGroup, reduce: bool = True) -> None:
    """reduce=False: the down projection's output stays this rank's partial sum (an MoE block's shared expert, summed
    with the routed experts' partial sum by the block's one all-reduce)."""
    width = mlp.intermediate_size
    local = width // size
    lo, hi = rank * local, (rank + 1) * local
    gate_up = mlp.gate_up_proj
    assert gate_up is not None
    mlp.gate_up_proj = _column([(lo, hi), (width + lo, width + hi)], gate_up.weight, gate_up.bias, [width, width])
    down = mlp.down_proj
    mlp.down_proj = (_row(down.weight, down.bias, lo, hi, group) if reduce
                     else _local_linear(down.weight[:, lo:hi], down.bias if rank == 0 else None))
    mlp.intermediate_size = local


def _local_linear(weight: torch.Tensor, bias: torch.Tensor | None) -> Linear:
    out = Linear(weight.shape[1], weight.shape[0], bias=bias is not None, device="meta")
    out.weight = nn.Parameter(weight.contiguous(), requires_grad=False)
    if bias is not None:
        out.bias = nn.Parameter(bias, requires_grad=False)
    return out


def shard_moe(block: SparseMoeBlock, rank: int, size: int, group: TPGroup | None, expert_parallel: bool) -> None:
    """This rank's share of an MoE block (the module docstring's layout); group: the ranks whose partial sums the
    block all-reduces (None: the caller sums them, as a test of the split alone may)."""
    gate_up, down = block.gate_up, block.down
    assert gate_up is not None and down is not None, "fuse() before the split"
    gub, db = block.gate_up_bias, block.down_bias
    if expert_parallel:
        local = block.num_experts // size
        lo, hi = rank * local, (rank + 1) * local
        block.expert_range = (lo, hi)
        gate_up, down = gate_up[lo:hi], down[lo:hi]
        gub = gub[lo:hi] if gub is not None else None
        db = db[lo:hi] if db is not None else None  # each pair on one rank: its bias too
    else:
        width = block.width
        local = width // size
        lo, hi = rank * local, (rank + 1) * local
        gate_up = torch.cat([gate_up[:, lo:hi], gate_up[:, width + lo:width + hi]], dim=1)
        down = down[:, :, lo:hi]
        if gub is not None:
            gub = torch.cat([gub[:, lo:hi], gub[:, width + lo:width + hi]], dim=1)
        db = db if rank == 0 else None  # added once, by rank 0's partial sum
        block.width = local
    # New parameters, not views: the whole stacks are freed (a stacked checkpoint's too).
    if hasattr(block, "experts"):
        del block.experts
    block.gate_up, block.down = _frozen(gate_up), _frozen(down)
    block.gate_up_bias = _frozen(gub) if gub is not None else None
    block.down_bias = _frozen(db) if db is not None else None
    shared = block.shared_expert
    if isinstance(shared, MLP):  # a partial sum, reduced with the routed one by the block's all-reduce
        _shard_mlp(shared, rank, size, group, reduce=False)
    block.group = group


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t.contiguous(), requires_grad=False)
