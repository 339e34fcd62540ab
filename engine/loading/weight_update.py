"""Weight updates from disk: stage a checkpoint (load and check it while the old weights keep serving), then apply
it in place once the engine holds no request, so no answer mixes two versions and no cache built on the old weights
serves a new request.

Staging loads the checkpoint as a whole second model (the same loader, fused projections included) and keeps its
parameters: the update costs one model's memory for its duration. Applying copies them into the live parameters,
so every reference to the model (runner, scorer, batch-invariant plans keyed by shape) stays valid."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from engine.loading.loader import load_model

if TYPE_CHECKING:
    from engine.llm_engine import LLMEngine

# Keys of config.json a trainer's save may change without changing the model.
IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "torch_dtype", "dtype", "use_cache"})


class WeightUpdateError(ValueError):
    """The checkpoint cannot replace the served weights (no such folder, unreadable, other architecture or
    shapes): the caller's fault, and the old weights keep serving."""


@dataclass
class StagedWeights:
    path: Path
    params: dict[str, torch.Tensor]  # fused names, as the live model's named_parameters()


def stage_weights(engine: LLMEngine, path: str) -> StagedWeights:
    """Load `path` (a checkpoint folder on this worker) and check it against the served model. Touches no engine
    state, so it runs beside the engine's steps (in another thread)."""
    folder = Path(path)
    if engine.parallel is not None:  # the other ranks hold their own shards, which this update does not reach
        raise WeightUpdateError("Weight updates are not supported with tensor_parallel_size or "
                                "pipeline_parallel_size > 1 yet: restart the "
                                "deployment on the new checkpoint.")
    if not folder.is_dir():
        raise WeightUpdateError(f"The model_path {path!r} is not a checkpoint folder on this worker.")
    try:
        model, cfg = load_model(folder, engine.config.dtype, engine.device)
    except Exception as exc:  # whatever the loader or safetensors raise on a bad folder is the request's fault
        raise WeightUpdateError(f"The checkpoint {path!r} could not be loaded: {exc}") from exc
    old, new = engine.hf_config.to_dict(), cfg.to_dict()
    differs = sorted(k for k in set(old) | set(new) if k not in IGNORED_CONFIG_KEYS and old.get(k) != new.get(k))
    if differs:
        raise WeightUpdateError(f"The checkpoint {path!r} has another config than the served model "
                                f"({', '.join(differs[:5])}): a weight update keeps the architecture.")
    live = dict(engine.model.named_parameters())
    params = dict(model.named_parameters())
    for name, tensor in live.items():
        got = params.get(name)
        if got is None or got.shape != tensor.shape:
            shape = None if got is None else tuple(got.shape)
            raise WeightUpdateError(f"The checkpoint {path!r} does not fit the served model: weight {name} has shape "
                                    f"{shape}, expected {tuple(tensor.shape)}.")
    return StagedWeights(folder, params)


@torch.inference_mode()
def apply_weights(engine: LLMEngine, staged: StagedWeights, version: str) -> None:
    """Copy the staged parameters into the live model and empty every cache built on the old ones. Only between
    steps with no request computing in the engine (the caller drains, aborts or retracts them first: a retracted
    request recomputes on the new weights)."""
    assert not engine.scheduler.running, "weights change only when no request holds KV blocks"
    for name, tensor in engine.model.named_parameters():
        tensor.copy_(staged.params[name])
    engine.flush_cache()
    engine.weight_version = version
