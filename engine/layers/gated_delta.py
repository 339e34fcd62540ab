"""The gated delta rule (Gated DeltaNet, Qwen3.5's linear-attention layers) and its short causal convolution, in
plain torch: the engine's reference on every device, written to compute what transformers' torch fallbacks compute
(torch_chunk_gated_delta_rule, torch_recurrent_gated_delta_rule, causal_conv1d_fn) for one request's chunk that
starts from a carried state rather than from zeros.

Per value head, with a state S [Dk, Dv] that starts at zero: for each token, S <- exp(g) S, then the delta rule
S <- S + k (beta (v - S^T k))^T, and the output is S^T q (q, k l2-normalised, q scaled by Dk^-1/2). The chunked form
computes the same over blocks of CHUNK tokens with a triangular solve (prefill); the recurrent form, token by token,
for one-token steps (decode), batched over requests. The state is kept in float32, as transformers keeps it."""

from __future__ import annotations

import torch
import torch.nn.functional as F

# Tokens per block of the chunked form (transformers' and fla's default).
CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
             ) -> tuple[torch.Tensor, ...]:
    """[B, L, H*, D] inputs -> float32 [B, Hv, L, D] with q/k heads repeated to the value heads (grouped value
    attention: each q/k head serves Hv / Hk consecutive value heads) and normalised."""
    hk, hv = k.shape[2], v.shape[2]
    if hk != hv:
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g))
    return l2norm(q), l2norm(k), v, g, beta


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                           state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k: [B, L, Hk, Dk]; v: [B, L, Hv, Dv]; g (log decay, <= 0), beta: [B, L, Hv]; state: [B, Hv, Dk, Dv]
    float32 or None (zeros). Returns (out [B, L, Hv, Dv] in q's dtype, final state [B, Hv, Dk, Dv] float32)."""
    dtype = q.dtype
    b, length = q.shape[0], q.shape[1]
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    dk, dv, hv = k.shape[-1], v.shape[-1], v.shape[1]
    q = q * dk ** -0.5
    pad = (CHUNK - length % CHUNK) % CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    n = (length + pad) // CHUNK
    v_beta = v * beta[..., None]
    k_beta = k * beta[..., None]
    q, k, k_beta, v_beta = (x.reshape(b, hv, n, CHUNK, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(b, hv, n, CHUNK).cumsum(dim=-1)  # [B, Hv, N, C] log decay from the block's start
    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    decay = (g[..., :, None] - g[..., None, :]).masked_fill(upper, float("-inf")).exp()  # [B, Hv, N, C, C]
    system = (k_beta @ k.transpose(-1, -2)) * decay
    intra = (q @ k.transpose(-1, -2)) * decay
    # Unit lower-triangular solves (the UT transform): the whole block's delta-rule updates in a few matmuls.
    values = torch.linalg.solve_triangular(system, v_beta, upper=False, unitriangular=True)
    k_cum = torch.linalg.solve_triangular(system, k_beta * g.exp()[..., None], upper=False, unitriangular=True)
    s = torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=q.device) if state is None else state.float()
    out = torch.zeros_like(values)
    q = q * g.exp()[..., None]
    k = k * (g[..., -1:] - g).exp()[..., None]
    block_decay = g[..., -1].exp()[..., None, None]  # [B, Hv, N, 1, 1]
    for i in range(n):
        v_new = values[:, :, i] - k_cum[:, :, i] @ s
        out[:, :, i] = q[:, :, i] @ s + intra[:, :, i] @ v_new
        s = s * block_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    out = out.reshape(b, hv, -1, dv)[:, :, :length]
    return out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format), s


def recurrent_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                               beta: torch.Tensor, state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """The same as chunk_gated_delta_rule, token by token (for steps of one token per request)."""
    dtype = q.dtype
    b, length = q.shape[0], q.shape[1]
    q, k, v, g, beta = _prepare(q, k, v, g, beta)
    dk, dv, hv = k.shape[-1], v.shape[-1], v.shape[1]
    q = q / dk ** 0.5
    s = torch.zeros(b, hv, dk, dv, dtype=torch.float32, device=q.device) if state is None else state.float()
    out = torch.zeros_like(v)
    for t in range(length):
        s = s * g[:, :, t].exp()[..., None, None]
        kt = k[:, :, t]
        delta = (v[:, :, t] - (s * kt[..., None]).sum(dim=-2)) * beta[:, :, t, None]
        s = s + kt[..., None] * delta[..., None, :]
        out[:, :, t] = (s * q[:, :, t, :, None]).sum(dim=-2)
    return out.transpose(1, 2).contiguous().to(dtype), s


def causal_conv1d(x: torch.Tensor, state: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Depthwise causal convolution (before its activation, in the weight's dtype), continuing from a state.
    x: [B, C, L]; state: [B, C, K - 1] (the inputs before x; zeros at a sequence's start, as transformers' left
    padding); weight: [C, K]. Returns (out [B, C, L], the new state [B, C, K - 1]: the last K - 1 inputs)."""
    xs = torch.cat([state.to(x.dtype), x], dim=-1)  # [B, C, K - 1 + L]
    out = F.conv1d(xs.to(weight.dtype), weight[:, None, :], groups=weight.shape[0])
    return out, xs[:, :, -state.shape[-1]:]
