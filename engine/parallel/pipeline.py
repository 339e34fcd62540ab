"""Pipeline parallelism: the decoder layers cut into `stages` contiguous stages (pipeline_parallel_size), each a
tensor-parallel group (group.py). A step's hidden states go stage to stage by point-to-point send/recv, rank i of
stage s to rank i of stage s + 1 (the ranks of a stage hold the same [T, hidden] after each layer's all-reduce);
the last stage's rank 0 sends its final hidden states back to world rank 0.

Where the head runs: on stage 0, beside the embedding, so world rank 0 keeps everything that is single, unchanged
in meaning: the hidden-state store (every computed position's last hidden state, by KV slot), the log-sum-exp
store, the scoring rows through stage 0's vocabulary-parallel head and the sampling rows with rank 0's generators.
The return hop moves [T, hidden] once per step, the same bytes as one stage-to-stage hop and hidden / V of what
returning a row's logits would; the store needs every fresh row, so sending back only the scored rows would move
the store off rank 0 (to the last stage) without saving a byte in the default configuration."""

from __future__ import annotations

import torch
from torch import nn

from engine.layers.linear import Linear
from engine.models.llama import LlamaForCausalLM
from engine.parallel.group import TPGroup


def stage_layers(num_layers: int, stages: int) -> list[tuple[int, int]]:
    """[lo, hi) of each stage's layers: num_layers // stages each, the remainder one more each on the last stages
    (stage 0 also holds the embedding and the head)."""
    if num_layers < stages:
        raise ValueError(f"num_hidden_layers {num_layers} is fewer than pipeline_parallel_size {stages}: every stage "
                         "needs a layer")
    sizes = [num_layers // stages] * stages
    for s in range(stages - num_layers % stages, stages):
        sizes[s] += 1
    bounds, lo = [], 0
    for n in sizes:
        bounds.append((lo, lo + n))
        lo += n
    return bounds


def stage_costs(model: LlamaForCausalLM, stages: int) -> list[tuple[int, int]]:
    """Per stage, (KV bytes per token, hybrid state bytes per slot) of its layers, from the whole model before the
    cut (a rank's shard of it: its heads): rank 0 holds stage 0 only, yet sizes the cache every stage's ranks hold.
    Layers of one kind cost the same, but a hybrid's stages hold different mixes of kinds (a stage may have no
    attention layer at all)."""
    whole = model.model.layers
    costs = []
    try:
        for lo, hi in stage_layers(len(whole), stages):
            model.model.layers = nn.ModuleList(list(whole)[lo:hi])
            costs.append((model.kv_bytes_per_token(), model.state_bytes_per_slot()))
    finally:
        model.model.layers = whole
    return costs


def cut_stage(model: LlamaForCausalLM, stage: int, stages: int) -> None:
    """Keep stage `stage`'s layers only (in place; make_kv_caches then allocates theirs only). A later stage keeps
    no embedding rows and no LM head: empty tables keep the model's dtype and shapes' hidden size."""
    lo, hi = stage_layers(model.num_layers, stages)[stage]
    model.model.layers = nn.ModuleList(list(model.model.layers)[lo:hi])
    if stage == 0:
        return
    embed = model.model.embed_tokens.weight
    model.model.embed_tokens = nn.Embedding(0, embed.shape[1], dtype=embed.dtype)
    if not model.classifier:
        model.lm_head = _empty_linear(model.lm_head.weight)


def _empty_linear(weight: torch.Tensor) -> Linear:
    head = Linear(weight.shape[1], 1, bias=False, device="meta")  # (an empty one's init warns)
    head.out_features = 0
    head.weight = nn.Parameter(weight.new_empty(0, weight.shape[1]), requires_grad=False)
    return head


class Pipeline:
    """This rank's hops of a step's hidden states. With one stage every hop is a no-op."""

    def __init__(self, group: TPGroup, hidden_size: int, dtype: torch.dtype) -> None:
        self.group, self.hidden_size, self.dtype = group, hidden_size, dtype

    @property
    def first(self) -> bool:
        return self.group.stage == 0

    def receive(self, tokens: int) -> torch.Tensor:
        """A later stage: the previous stage's [tokens, hidden] hidden states."""
        g = self.group
        return g.recv((tokens, self.hidden_size), self.dtype, g.world_of(g.stage - 1, g.rank))

    def pass_on(self, hidden: torch.Tensor) -> None:
        """To the next stage's rank of this index; the last stage's rank 0 to world rank 0."""
        g = self.group
        if g.stages == 1:
            return
        if g.stage < g.stages - 1:
            g.send(hidden, g.world_of(g.stage + 1, g.rank))
        elif g.rank == 0:
            g.send(hidden, 0)

    def round_trip(self, hidden: torch.Tensor) -> torch.Tensor:
        """World rank 0, after stage 0's layers: the last stage's final hidden states of the same tokens."""
        if self.group.stages == 1:
            return hidden
        self.pass_on(hidden)
        return self.group.recv(tuple(hidden.shape), self.dtype, self.group.world_of(self.group.stages - 1, 0))
