"""Gated DeltaNet, the linear-attention layer of Qwen3.5 (transformers' Qwen3_5GatedDeltaNet), over a flat batch of
chunks from many requests. Its state is not a paged cache: each request holds one state slot (its conv state, the
last K - 1 inputs of the convolution, and its recurrent state, [Hv, Dk, Dv] float32 per value head), which the step
writes at the chunk's end. A chunk starts from zeros at position 0 (a new request, or one recomputed after
preemption: a slot needs no clearing), from a prefix-cache snapshot row at a hit's first chunk, else from its slot.
A chunk that reaches a snapshot's position is cut there, and the state at the cut copied into the snapshot's row.

One-token chunks after a computed context (decodes) run together through the recurrent form; every other chunk
runs alone through the chunked form (engine/layers/gated_delta.py, or fla's kernels on CUDA: gated_delta_cuda.py)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from engine.layers.activation import activation
from engine.layers.attention import AttentionMetadata
from engine.layers.gated_delta import causal_conv1d, chunk_gated_delta_rule, recurrent_gated_delta_rule
from engine.layers.gated_delta_cuda import cuda_rules
from engine.layers.linear import Linear


class GatedRMSNorm(nn.Module):
    """transformers' Qwen3_5RMSNormGated: RMS-normalise each head's output in float32, scale by the weight in the
    model dtype, multiply by SiLU(gate) in float32."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        h = self.weight * h.to(dtype)
        return (h * F.silu(gate.float())).to(dtype)


class GatedDeltaNet(nn.Module):
    # The chunked and recurrent forms; gated_delta_cuda.py swaps in fla's kernels on CUDA.
    chunk_rule = staticmethod(chunk_gated_delta_rule)
    recurrent_rule = staticmethod(recurrent_gated_delta_rule)

    def __init__(self, cfg: Any) -> None:
        super().__init__()
        self.num_v_heads = int(cfg.linear_num_value_heads)
        self.num_k_heads = int(cfg.linear_num_key_heads)
        self.head_k_dim = int(cfg.linear_key_head_dim)
        self.head_v_dim = int(cfg.linear_value_head_dim)
        if self.num_v_heads % self.num_k_heads:
            raise ValueError(f"config field linear_num_value_heads ({self.num_v_heads}) must be a multiple of "
                             f"linear_num_key_heads ({self.num_k_heads})")
        self.key_dim = self.head_k_dim * self.num_k_heads
        self.value_dim = self.head_v_dim * self.num_v_heads
        self.conv_dim = 2 * self.key_dim + self.value_dim
        self.kernel = int(cfg.linear_conv_kernel_dim)
        hidden = int(cfg.hidden_size)
        # The checkpoint's [C, 1, K] depthwise weight, as nn.Conv1d holds it (only its weight is used).
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, self.kernel, groups=self.conv_dim, bias=False)
        self.act = activation(cfg.hidden_act)
        self.dt_bias = nn.Parameter(torch.empty(self.num_v_heads))
        self.A_log = nn.Parameter(torch.empty(self.num_v_heads))
        self.norm = GatedRMSNorm(self.head_v_dim, cfg.rms_norm_eps)
        self.out_proj = Linear(self.value_dim, hidden, bias=False)
        self.in_proj_qkv = Linear(hidden, self.conv_dim, bias=False)
        self.in_proj_z = Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = Linear(hidden, self.num_v_heads, bias=False)

    def fuse(self) -> None:
        """Nothing to fuse: kept separate, each as the checkpoint names it (their outputs differ in use)."""

    def state_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """One slot's (conv state, recurrent state) shapes."""
        return (self.conv_dim, self.kernel - 1), (self.num_v_heads, self.head_k_dim, self.head_v_dim)

    def forward(self, x: torch.Tensor, conv_states: torch.Tensor, rec_states: torch.Tensor,
                meta: AttentionMetadata) -> torch.Tensor:
        """x: [T, hidden] of the step's chunks in meta's order; conv_states: [slots, C, K - 1]; rec_states: [slots,
        Hv, Dk, Dv] float32, read and written at each request's meta.state_slots entry. Returns [T, hidden]."""
        t = x.shape[0]
        qkv = self.in_proj_qkv(x)  # [T, C]
        z = self.in_proj_z(x)  # [T, Hv * Dv]
        beta = self.in_proj_b(x).sigmoid()  # [T, Hv]
        # float32, as transformers computes it (A_log.exp() could overflow in half precision).
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias)  # [T, Hv]
        core = torch.empty(t, self.num_v_heads, self.head_v_dim, dtype=x.dtype, device=x.device)
        chunk_rule, recurrent_rule = cuda_rules(x.device, x.dtype) or (self.chunk_rule, self.recurrent_rule)
        offsets, at = [], 0
        for n in meta.lens:
            offsets.append(at)
            at += n
        dec = [i for i, (s, n) in enumerate(zip(meta.starts, meta.lens, strict=True)) if n == 1 and s > 0]
        if dec:
            rows = torch.tensor([offsets[i] for i in dec], device=x.device)
            slots = torch.tensor([meta.state_slots[i] for i in dec], device=x.device)
            sources = torch.tensor([meta.state_sources[i] for i in dec], device=x.device)
            core[rows] = self._run(qkv[rows, :, None], g[rows, None], beta[rows, None], conv_states, rec_states,
                                   slots, sources, rule=recurrent_rule)[:, 0]
            for i in dec:
                self._save(conv_states, rec_states, meta.state_slots[i], [row for _, row in meta.state_saves[i]])
        single = set(dec)
        for i, n in enumerate(meta.lens):
            if i in single:
                continue
            slot = torch.tensor([meta.state_slots[i]], device=x.device)
            source = torch.tensor([meta.state_sources[i]], device=x.device) if meta.state_sources[i] >= 0 else None
            # Cut at each snapshot the chunk writes: the state there is copied into the snapshot's row.
            saves = dict(meta.state_saves[i])
            cuts = sorted({*saves, n})
            lo = offsets[i]
            for a, b in zip([0, *cuts[:-1]], cuts, strict=True):
                core[lo + a:lo + b] = self._run(qkv[lo + a:lo + b].T[None], g[lo + a:lo + b][None],
                                                beta[lo + a:lo + b][None], conv_states, rec_states, slot,
                                                source if a == 0 else slot, rule=chunk_rule)[0]
                if b in saves:
                    self._save(conv_states, rec_states, meta.state_slots[i], [saves[b]])
        out = self.norm(core.reshape(-1, self.head_v_dim), z.reshape(-1, self.head_v_dim))
        return self.out_proj(out.reshape(t, self.value_dim))

    @staticmethod
    def _save(conv_states: torch.Tensor, rec_states: torch.Tensor, slot: int, rows: list[int]) -> None:
        for row in rows:
            conv_states[row] = conv_states[slot]
            rec_states[row] = rec_states[slot]

    def _run(self, qkv: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, conv_states: torch.Tensor,
             rec_states: torch.Tensor, slots: torch.Tensor, sources: torch.Tensor | None, rule: Any) -> torch.Tensor:
        """B requests' chunks of equal length L: qkv [B, C, L], g/beta [B, L, Hv]; their states are read from rows
        `sources` [B] (None: zeros) and written to rows `slots` [B]. Returns the core output [B, L, Hv, Dv]."""
        b, _, length = qkv.shape
        fresh = sources is None
        conv = torch.zeros(b, self.conv_dim, self.kernel - 1, dtype=conv_states.dtype, device=qkv.device) if fresh \
            else conv_states.index_select(0, sources)  # type: ignore[arg-type]
        mixed, new_conv = causal_conv1d(qkv, conv, self.conv1d.weight[:, 0])
        conv_states.index_copy_(0, slots, new_conv.to(conv_states.dtype))
        mixed = self.act(mixed).to(qkv.dtype).transpose(1, 2)  # [B, L, C]
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        q = q.reshape(b, length, self.num_k_heads, self.head_k_dim)
        k = k.reshape(b, length, self.num_k_heads, self.head_k_dim)
        v = v.reshape(b, length, self.num_v_heads, self.head_v_dim)
        state = None if sources is None else rec_states.index_select(0, sources)
        out, new_state = rule(q, k, v, g, beta, state)
        rec_states.index_copy_(0, slots, new_state.to(rec_states.dtype))
        return out
