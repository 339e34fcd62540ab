"""DeepSeek-V3 / R1 (and Kimi-K2-class checkpoints of the same layout): Multi-head Latent Attention over a latent
paged cache (engine/layers/mla.py), the first `first_k_dense_replace` layers with a dense MLP, the others with
routed experts (a sigmoid router whose e_score_correction_bias steers the choice, limited to the best topk_group of
n_group expert groups, weights renormalised by norm_topk_prob and scaled by routed_scaling_factor: transformers'
DeepseekV3TopkRouter) plus shared experts (a dense MLP of n_shared_experts x moe_intermediate_size).

Checkpoint names: transformers' and the hub's (model.layers.i.self_attn.{q_a_proj, q_a_layernorm, q_b_proj | q_proj,
kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj}, mlp.gate.{weight, e_score_correction_bias},
mlp.experts.e.{gate,up,down}_proj, mlp.shared_experts.*). The hub's FP8 weights are dequantized at load
(engine/loading/fp8.py); its multi-token-prediction layer (model.layers.{num_hidden_layers}) is not read."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from engine.layers.linear import Linear, linear
from engine.layers.mla import MultiHeadLatentAttention
from engine.layers.moe import SparseMoeBlock
from engine.layers.rotary import FamilyRotaryEmbedding
from engine.models.llama import MLP, DecoderLayer, LlamaForCausalLM


class DeepseekV3MoE(SparseMoeBlock):
    def __init__(self, cfg: Any) -> None:
        # The shared experts: one dense MLP of n_shared_experts x moe_intermediate_size, added to the routed sum.
        shared = MLP(cfg, intermediate_size=cfg.moe_intermediate_size * cfg.n_shared_experts)
        super().__init__(cfg, num_experts=cfg.n_routed_experts, norm_topk_prob=bool(cfg.norm_topk_prob),
                         shared_expert=shared)
        self.n_group, self.topk_group = int(cfg.n_group or 1), int(cfg.topk_group or 1)
        if self.num_experts % self.n_group:
            raise ValueError(f"config field n_group {self.n_group} does not divide n_routed_experts "
                             f"{self.num_experts}")
        self.routed_scaling_factor = float(cfg.routed_scaling_factor)
        # The checkpoint's mlp.gate.e_score_correction_bias [E]: added to the scores that choose, not to the weights.
        self.gate.e_score_correction_bias = nn.Parameter(torch.empty(self.num_experts))

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [T, hidden] -> (weights [T, k] in x's dtype, expert ids [T, k]), in float32 as transformers' router."""
        t = x.shape[0]
        scores = linear(x.float(), self.gate.weight.float()).sigmoid()  # [T, E]
        choice = scores + self.gate.e_score_correction_bias.float()
        per_group = self.num_experts // self.n_group
        # A group's worth: the sum of its two best (bias-corrected) scores; only the best topk_group groups compete.
        group_scores = choice.view(t, self.n_group, per_group).topk(2, dim=-1)[0].sum(dim=-1)  # [T, G]
        group_idx = group_scores.topk(self.topk_group, dim=-1, sorted=False)[1]
        keep = torch.zeros_like(group_scores, dtype=torch.bool).scatter_(1, group_idx, True)  # [T, G]
        choice = choice.masked_fill(~keep.repeat_interleave(per_group, dim=1), float("-inf"))
        idx = choice.topk(self.top_k, dim=-1, sorted=False)[1]  # [T, k]
        weights = scores.gather(1, idx)
        if self.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        return (weights * self.routed_scaling_factor).to(x.dtype), idx


class DeepseekV3ForCausalLM(LlamaForCausalLM):
    @classmethod
    def checkpoint_name(cls, name: str) -> str:
        """DeepSeek's mlp.shared_experts is SparseMoeBlock's shared_expert."""
        return name.replace(".mlp.shared_experts.", ".mlp.shared_expert.")

    @classmethod
    def keeps_float32(cls, name: str) -> bool:
        """The router stays float32 in a bfloat16 model, as transformers keeps it (_keep_in_fp32_modules_strict): a
        rounded router weight or correction bias would change which experts a token gets."""
        return name.endswith(("mlp.gate.weight", "mlp.gate.e_score_correction_bias"))

    def make_layer(self, cfg: Any, i: int) -> DecoderLayer:
        attn: Any = MultiHeadLatentAttention(cfg)
        mlp = MLP(cfg) if i < int(cfg.first_k_dense_replace or 0) else DeepseekV3MoE(cfg)
        return DecoderLayer(cfg, attn, mlp, self.norm_cls)

    def make_ropes(self, cfg: Any) -> list[Any]:
        """The decoupled rotary part's (cfg.head_dim is qk_rope_head_dim), YaRN's attention factor in cos/sin."""
        return [FamilyRotaryEmbedding(cfg)]

    def kv_bytes_per_token(self) -> int:
        """One latent per token and layer (kv_lora_rank + qk_rope_head_dim values), no K/V pair: the MHA equivalent
        would hold num_heads x (qk_nope + qk_rope + v_head_dim) values."""
        return self.num_layers * self.head_dim * self.dtype.itemsize

    def make_kv_caches(self, num_slots: int, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer one [slots, 1, kv_lora_rank + qk_rope_head_dim] tensor, given as both K and V: MLA attends the
        latents as keys and takes its values from the same vectors (engine/layers/mla.py)."""
        caches = []
        for _ in range(self.num_layers):
            latent = torch.zeros(num_slots, 1, self.head_dim, dtype=self.dtype, device=device)
            caches.append((latent, latent))
        return caches

    def lora_targets(self, i: int) -> dict[str, tuple[Linear, int, list[int]]]:
        """The MLA projections that stay linears (q_proj or q_a_proj / q_b_proj, kv_a_proj_with_mqa, o_proj) and a
        dense layer's gate/up/down. kv_b_proj is not a target: its weight is absorbed into the query and the output
        (an adapter on it would have to be absorbed too); nor are the experts."""
        layer = self.model.layers[i]
        attn = layer.self_attn
        names = ["q_proj"] if attn.q_lora_rank is None else ["q_a_proj", "q_b_proj"]
        targets = {n: (getattr(attn, n), 0, getattr(attn, n).whole_parts([getattr(attn, n).out_features]))
                   for n in [*names, "kv_a_proj_with_mqa", "o_proj"]}
        mlp = layer.mlp
        if isinstance(mlp, MLP):
            assert mlp.gate_up_proj is not None
            gate_up = mlp.gate_up_proj.whole_parts([mlp.intermediate_size] * 2)
            targets["gate_proj"] = (mlp.gate_up_proj, 0, gate_up)
            targets["up_proj"] = (mlp.gate_up_proj, 1, gate_up)
            targets["down_proj"] = (mlp.down_proj, 0, [mlp.down_proj.out_features])
        return targets

    def batch_invariant_blockers(self) -> list[str]:
        found = ["multi-head latent attention (kv_lora_rank)"]
        if any(isinstance(layer.mlp, DeepseekV3MoE) for layer in self.model.layers):
            found.append("mixture-of-experts MLP blocks (n_routed_experts)")
        return found
