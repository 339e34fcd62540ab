"""Tensor-parallel engines without Ray: N processes spawned with torch.multiprocessing on one gloo group. Rank 0
runs an LLMEngine over batches of requests and sends back its merged outputs; the other ranks run Follower."""

from __future__ import annotations

import queue
import traceback
from dataclasses import dataclass
from typing import Any

import torch
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.outputs import RequestOutput
from engine.sampling_params import SamplingParams
from engine.stats import EngineStats

Batch = tuple[list[list[int]], list[SamplingParams]]


@dataclass
class SplitRun:
    outputs: list[list[RequestOutput]]  # per batch, per prompt
    stats: EngineStats
    follower_steps: int  # forwards rank 1 ran (the same as rank 0's, or the broadcast failed)
    traffic_bytes: int  # payload rank 0 put into collectives


def _rank_main(rank: int, size: int, address: str, cfg: dict[str, Any], batches: list[Batch], out: Any) -> None:
    from engine.llm_engine import LLMEngine
    from engine.parallel.follower import Follower
    from engine.parallel.group import TPGroup

    torch.set_num_threads(1)
    try:
        group = TPGroup(rank, size, torch.device("cpu"), address, timeout_s=60)
        config = EngineConfig(**cfg, tensor_parallel_size=size)
        if rank:
            follower = Follower(config, group)
            follower.run()
            out.put(("steps", rank, follower.steps))
            return
        eng = LLMEngine(config, group)
        results = [eng.generate(prompts, params, check=True) for prompts, params in batches]
        stats, traffic = eng.stats(), group.traffic.total
        eng.close()
        out.put(("result", rank, (results, stats, traffic)))
    except BaseException:  # noqa: BLE001 - the parent reports it
        out.put(("error", rank, traceback.format_exc()))


def run_split(size: int, cfg: dict[str, Any], batches: list[Batch], timeout_s: float = 240) -> SplitRun:
    from engine.parallel.group import free_port

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    address = f"127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, size, address, cfg, batches, out), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    got: dict[str, Any] = {}
    try:
        for _ in range(size):
            kind, rank, value = out.get(timeout=timeout_s)
            if kind == "error":
                raise AssertionError(f"rank {rank} failed:\n{value}")
            got[f"{kind}{rank if kind == 'steps' else ''}"] = value
    except queue.Empty as exc:
        raise AssertionError(f"ranks did not finish in {timeout_s} s") from exc
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    results, stats, traffic = got["result"]
    return SplitRun(results, stats, got["steps1"], traffic)
