"""Tensor-parallel engines without Ray (engine/parallel/local.py): rank 0 runs batches of requests and sends back
its merged outputs."""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from typing import Any

from engine.config import EngineConfig
from engine.parallel.local import run_local
from engine.stats import EngineStats
from protocol.outputs import RequestOutput
from protocol.sampling import SamplingParams

Batch = tuple[list[list[int]], list[SamplingParams]]


@dataclass
class SplitRun:
    outputs: list[list[RequestOutput]]  # per batch, per prompt
    stats: EngineStats
    follower_steps: list[int]  # forwards each other rank ran (as many as rank 0's, or the broadcast failed)
    forwards: int  # forwards rank 0 ran
    peak_in_flight: int  # the most engine steps rank 0 had in flight at once (pipeline overlap)


def _batches(batches: list[Batch], loads: list[dict[str, str]], eng: Any
             ) -> tuple[list[list[RequestOutput]], EngineStats, int, int]:
    results = []
    for i, (prompts, params) in enumerate(batches):
        for name, path in (loads[i] if i < len(loads) else {}).items():
            eng.lora.register(name, path)  # what POST /v1/load_lora_adapter asks of the engine
        results.append(eng.generate(prompts, params, check=True))
    return results, eng.stats(), eng.runner.forwards, eng.peak_in_flight


def run_split(size: int, cfg: dict[str, Any], batches: list[Batch],
              loads: list[dict[str, str]] | None = None) -> SplitRun:
    """loads: per batch, LoRA adapters {name: PEFT folder} registered at run time before it runs."""
    job = partial(_batches, batches, loads or [])
    (results, stats, forwards, peak), steps = run_local(size, EngineConfig(**cfg), job, timeout_s=240)
    return SplitRun(results, stats, steps, forwards, peak)
