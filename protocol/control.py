"""The control plane's operations, one dataclass each, matched by type from the route to the engine: the generation
controls (SGLang's /pause_generation, /continue_generation, /abort_request), the cache flush, and the stages of a
weight update (workers/weights.py publishes them to every worker replica, workers/weight_sync.py runs them)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, TypeAlias

# What a pause does to the requests in flight (engine/core/pause.py): end them now with their output, give back
# their KV cache and recompute after the resume, or keep it.
PauseMode: TypeAlias = Literal["abort", "retract", "in_place"]


@dataclass(frozen=True)
class Pause:
    mode: PauseMode = "abort"
    # First let the requests in flight finish while new ones wait, then pause (vLLM's /pause?mode=wait): the operation
    # completes when the engine has drained.
    drain: bool = False


@dataclass(frozen=True)
class Resume:
    # First hand the CUDA allocator's cached blocks back to the driver (SGLang's torch_empty_cache).
    empty_cache: bool = False


@dataclass(frozen=True)
class Abort:
    """End a live request with finish_reason abort, its stream answered with what it produced so far."""

    request_id: str | None = None  # None: every live request


@dataclass(frozen=True)
class FlushCache:
    """Empty the prefix cache (between two engine steps)."""


# The operations that act on generation, counted by the requests they touched.
GenerationControl: TypeAlias = Pause | Resume | Abort | FlushCache


@dataclass(frozen=True)
class PrepareWeights:
    """Stage 1 of an update: load and check the checkpoint beside the serving engine."""

    path: str


@dataclass(frozen=True)
class CommitWeights:
    """Stage 2: drain (or abort, abort_all) and swap in the staged weights, under `version`."""

    path: str
    version: str
    abort_all: bool = False


@dataclass(frozen=True)
class DiscardWeights:
    """Stage 2 when a replica failed to prepare: drop what was staged."""


WeightStage: TypeAlias = PrepareWeights | CommitWeights | DiscardWeights
ControlOp: TypeAlias = GenerationControl | WeightStage


@dataclass(frozen=True)
class WeightUpdate:
    """POST /update_weights_from_disk (SGLang's fields): every worker replica loads `model_path`, a checkpoint
    folder each of them can read; None weight_version keeps the current name."""

    model_path: str
    weight_version: str | None = None
    abort_all_requests: bool = False


@dataclass(frozen=True)
class WeightUpdateResult:
    """SGLang's answer: success, a message, and how many requests were in the workers when the operation began
    (they finished on the old weights, or were aborted, paused). weight_version: the weights served now."""

    success: bool
    message: str
    num_paused_requests: int = 0
    weight_version: str | None = None
