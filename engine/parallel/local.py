"""N ranks on this machine without Ray: processes started with torch.multiprocessing on one gloo group (tests and
`python -m bench tp`). Rank 0 builds an LLMEngine and runs `job(engine)`; the others run Follower until it stops.

The ranks come from a fork server that imported torch, transformers and the engine once (`rank_context`): each
rank forks from it ready to run, where a spawned rank would import them again. The server is a clean single-threaded
process, which is why it can fork safely where the caller (with torch's thread pool running) could not."""

from __future__ import annotations

import pickle
import queue
import traceback
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import torch
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.parallel.group import free_port

# What every rank imports: the fork server imports it once (rank_context).
_PRELOAD = ["torch", "transformers", "engine.llm_engine", "engine.parallel.follower", "engine.parallel.group"]


def rank_context() -> Any:
    """The multiprocessing context rank processes start from: a fork server with the engine's imports done."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(_PRELOAD)
    return ctx


def _rank_main(rank: int, size: int, address: str, cfg: dict[str, Any], job: Callable[[Any], Any],
               threads: int, out: Any) -> None:
    from engine.llm_engine import LLMEngine
    from engine.parallel.follower import Follower
    from engine.parallel.group import TPGroup

    torch.set_num_threads(threads)
    try:
        stages = cfg.get("pipeline_parallel_size", 1)
        group = TPGroup(rank, size, torch.device("cpu"), address, timeout_s=120, stages=stages)
        config = EngineConfig(**{**cfg, "tensor_parallel_size": size // stages})
        if rank:
            follower = Follower(config, group)
            follower.run()
            out.put(("done", rank, pickle.dumps(follower.steps)))
            return
        eng = LLMEngine(config, group)
        result = job(eng)
        eng.close()
        # Plain pickle copies tensors into the message: torch's queue pickler would hand over a file descriptor
        # through a socket this process closes when it exits, which can be before the parent reads it.
        out.put(("done", rank, pickle.dumps(result)))
    except BaseException:  # noqa: BLE001 - the parent raises it with the rank's traceback
        out.put(("error", rank, traceback.format_exc()))


def run_local(size: int, config: EngineConfig, job: Callable[[Any], Any], threads: int = 1,
              timeout_s: float = 600) -> tuple[Any, list[int]]:
    """(what job returned on rank 0, the forwards each other rank ran). size: every rank, tensor_parallel_size x
    config.pipeline_parallel_size. job must be picklable (module level)."""
    cfg = {k: v for k, v in asdict(config).items() if k != "tensor_parallel_size"}
    ctx = rank_context()
    out = ctx.Queue()
    address = f"127.0.0.1:{free_port()}"
    procs = [ctx.Process(target=_rank_main, args=(r, size, address, cfg, job, threads, out), daemon=True)
             for r in range(size)]
    for p in procs:
        p.start()
    got: dict[int, Any] = {}
    try:
        for _ in range(size):
            kind, rank, value = out.get(timeout=timeout_s)
            if kind == "error":
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            got[rank] = pickle.loads(value)
    except queue.Empty as exc:
        raise RuntimeError(f"the {size} ranks did not finish in {timeout_s} s") from exc
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    return got[0], [got[r] for r in range(1, size)]
