"""gpt-oss's sparse MoE MLP (transformers' GptOssMLP) on the engine's MoE block (engine/layers/moe.py):

- router: a linear with a bias (mlp.router.weight [E, H], mlp.router.bias [E]); the top-k of its logits, softmaxed
  over those k alone (no renormalisation needed: they sum to one);
- experts: stacked, with biases, in the checkpoint's own layout (mlp.experts.gate_up_proj [E, H, 2W] with gate and up
  *interleaved* along the last axis: column 2j is gate j, 2j + 1 is up j; gate_up_proj_bias [E, 2W] likewise;
  down_proj [E, W, H]; down_proj_bias [E, H]); fuse() turns them into the block's layout (gate_up [E, 2W, H], gate
  rows then up rows; down [E, H, W]), so the block's dispatch and tensor-parallel split apply unchanged;
- activation: the clamped SwiGLU, gate clamped above at `swiglu_limit`, up clamped to +-limit, then
  (up + 1) * gate * sigmoid(alpha * gate) with alpha = `swiglu_alpha`."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.linear import linear
from engine.layers.moe import SparseMoeBlock


class GptOssExperts(nn.Module):
    """The experts' weights under the checkpoint's names (transformers' GptOssExperts); folded by fuse()."""

    def __init__(self, num_experts: int, hidden: int, width: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, hidden, 2 * width))  # gate/up interleaved
        self.gate_up_proj_bias = nn.Parameter(torch.empty(num_experts, 2 * width))
        self.down_proj = nn.Parameter(torch.empty(num_experts, width, hidden))
        self.down_proj_bias = nn.Parameter(torch.empty(num_experts, hidden))


class GptOssMoeBlock(SparseMoeBlock):
    """The base block's dispatch (and tensor-parallel split) with gpt-oss's router, expert layout and activation."""

    def __init__(self, cfg: Any) -> None:
        super().__init__(cfg, num_experts=int(cfg.num_local_experts), width=int(cfg.intermediate_size),
                         norm_topk_prob=False)
        hidden = int(cfg.hidden_size)
        self.alpha = float(cfg.swiglu_alpha)
        self.limit = float(cfg.swiglu_limit)
        del self.gate  # gpt-oss's router has its own name and a bias
        self.router = nn.Linear(hidden, self.num_experts, bias=True)
        self.experts = GptOssExperts(self.num_experts, hidden, self.width)

    def fuse(self) -> None:
        """The checkpoint's interleaved, transposed stacks as the block's layout (copies: the loaded tensors go)."""
        e = self.experts
        assert isinstance(e, GptOssExperts)
        gu = e.gate_up_proj  # [E, H, 2W]
        self.gate_up = _frozen(torch.cat([gu[..., 0::2], gu[..., 1::2]], dim=-1).transpose(1, 2).contiguous())
        b = e.gate_up_proj_bias
        self.gate_up_bias = _frozen(torch.cat([b[..., 0::2], b[..., 1::2]], dim=-1).contiguous())
        self.down = _frozen(e.down_proj.transpose(1, 2).contiguous())
        self.down_bias = _frozen(e.down_proj_bias.detach().clone())
        del self.experts
        self.fuse_shared()

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, H] -> (weights [T, k], expert ids [T, k]): transformers' GptOssTopKRouter (softmax of the top-k
        logits, in the logits' dtype)."""
        logits = linear(x, self.router.weight, self.router.bias)  # [T, E]
        top, idx = torch.topk(logits, self.top_k, dim=-1)
        return torch.softmax(top, dim=-1), idx

    def activate(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        gate = gate.clamp(max=self.limit)
        up = up.clamp(min=-self.limit, max=self.limit)
        return (up + 1) * (gate * torch.sigmoid(gate * self.alpha))


def _frozen(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)
