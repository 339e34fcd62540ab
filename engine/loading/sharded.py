"""One rank's shard of the served model: the checkpoint is read on CPU, split (shard.py), and only the shard goes
to the rank's device, so a device never holds more than its shard. (Each rank reads the whole checkpoint into host
memory once, tensor by tensor as load_model does; reading only a rank's slices from safetensors is left to do.)"""

from __future__ import annotations

from typing import Any

import torch

from engine.config import EngineConfig
from engine.loading.default_model import resolve_model_path
from engine.loading.loader import exact_float32, load_model
from engine.models.llama import LlamaForCausalLM
from engine.parallel.group import TPGroup
from engine.parallel.shard import shard_model


def load_sharded(config: EngineConfig, group: TPGroup) -> tuple[LlamaForCausalLM, Any]:
    """(this rank's shard of the model on group.device, the transformers config)."""
    if group.size != config.tensor_parallel_size:
        raise ValueError(f"the process group has {group.size} ranks but tensor_parallel_size is "
                         f"{config.tensor_parallel_size}")
    model, hf_config = load_model(resolve_model_path(config.model, config.cache_dir), config.dtype,
                                  torch.device("cpu"), config.float32_head)
    if model.multimodal:  # the other ranks' forwards take no image rows (engine/parallel/follower.py)
        raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} is not available for the "
                         f"vision-language model {type(model).__name__}; serve it with tensor_parallel_size 1")
    if model.hybrid:  # the linear layers' state slots are not split across ranks
        raise ValueError(f"tensor_parallel_size {config.tensor_parallel_size} is not available for the hybrid "
                         f"model {type(model).__name__}; serve it with tensor_parallel_size 1")
    shard_model(model, group)
    model.to(group.device)
    model.rope_to(group.device)
    exact_float32(group.device, config.dtype)  # loaded on the CPU above: keep a CUDA rank's float32 out of TF32
    return model, hf_config
