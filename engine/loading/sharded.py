"""One rank's shard of the served model: the checkpoint is read on CPU, split over the stage's ranks (shard.py),
cut to the rank's pipeline stage (pipeline.py; every stage's cache cost measured before the cut), and only the shard
goes to the rank's device, so a device never holds more than its shard. (Each rank reads the whole checkpoint into
host memory once, tensor by tensor as load_model does; reading only a rank's slices from safetensors is left to
do.)"""

from __future__ import annotations

from typing import Any

import torch

from engine.config import EngineConfig
from engine.loading.default_model import resolve_model_path
from engine.loading.loader import exact_float32, load_model
from engine.models.llama import LlamaForCausalLM
from engine.parallel.group import TPGroup
from engine.parallel.pipeline import cut_stage, stage_costs
from engine.parallel.shard import shard_model


def load_sharded(config: EngineConfig, group: TPGroup) -> tuple[LlamaForCausalLM, Any]:
    """(this rank's shard of the model on group.device, the transformers config)."""
    if group.size != config.tensor_parallel_size or group.stages != config.pipeline_parallel_size:
        raise ValueError(f"the process group has {group.stages} stage(s) of {group.size} rank(s) but "
                         f"tensor_parallel_size is {config.tensor_parallel_size} and pipeline_parallel_size "
                         f"{config.pipeline_parallel_size}")
    model, hf_config = load_model(resolve_model_path(config.model, config.cache_dir), config.dtype,
                                  torch.device("cpu"), config.float32_head)
    if model.multimodal:  # the other ranks' forwards take no image rows (engine/parallel/follower.py)
        raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} and pipeline_parallel_size "
                         f"{config.pipeline_parallel_size} are not available for the vision-language model "
                         f"{type(model).__name__}; serve it with both at 1")
    # Split before the cut (the same shards: each layer splits alone), so the stages' costs are of this rank's heads.
    if group.size > 1:
        shard_model(model, group, config.expert_parallel)
    if group.stages > 1:
        model.stage_costs = stage_costs(model, group.stages)
        cut_stage(model, group.stage, group.stages)
    model.to(group.device)
    model.rope_to(group.device)
    exact_float32(group.device, config.dtype)  # loaded on the CPU above: keep a CUDA rank's float32 out of TF32
    return model, hf_config
