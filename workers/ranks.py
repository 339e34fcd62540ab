"""The other ranks of a split worker replica: one Ray actor per rank in the replica's own placement group (Serve
reserves it from placement_group_bundles, deploy/app.py: one bundle per rank, the replica in bundle 0; STRICT_PACK on
one node, or PACK with pipeline stages, which may then sit on other nodes). Rank 0 is the replica itself, whose
engine drives the others over torch.distributed (engine/parallel/); Ray only places and watches them, nothing per
step goes through Ray.

With pipeline_parallel_size > 1 the world ranks are given to the bundles by node, once Ray has placed them (vLLM
numbers its Ray workers the same way): the bundles on the replica's node first, then each other node's, so that the
consecutive ranks of a stage share a node wherever PACK put that many bundles together.

The actors are created by the replica, so they are owned by it: when Serve removes the replica (scale-down,
redeploy, `serve shutdown`, a failed health check), Ray kills them with it."""

from __future__ import annotations

import logging
import os
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from engine.config import EngineConfig
from engine.loading.loader import resolve_device
from engine.parallel.group import TPGroup, free_port

log = logging.getLogger(__name__)

# Rank actors' names: this prefix, the placement group's id, the rank.
RANK_PREFIX = "rayscore-rank:"


@ray.remote
class RankActor:
    """Rank r > 0: joins the group, loads its shard, then runs rank 0's broadcasts until told to stop."""

    def serve(self, engine_config: dict[str, Any], rank: int, size: int, address: str) -> int:
        """Blocks for the replica's life; returns the forwards it ran once rank 0 says stop."""
        from engine.parallel.follower import Follower

        cfg = EngineConfig(**engine_config)
        group = TPGroup(rank, size, resolve_device(cfg.device), address, stages=cfg.pipeline_parallel_size)
        follower = Follower(cfg, group)
        follower.run()
        group.close()
        return follower.steps


class RankGroup:
    """Started from the replica's constructor: the N - 1 rank actors, and this process as rank 0 of their group."""

    def __init__(self, engine_config: dict[str, Any]) -> None:
        cfg = EngineConfig(**engine_config)
        size = cfg.world_size
        pg = ray.util.get_current_placement_group()
        if pg is None or len(pg.bundle_specs) < size:
            raise ValueError(f"tensor_parallel_size {cfg.tensor_parallel_size} x pipeline_parallel_size "
                             f"{cfg.pipeline_parallel_size} needs a placement group of {size} bundles for the worker "
                             "replica (deploy/app.py sets placement_group_bundles)")
        bundles = rank_bundles(_bundle_nodes(pg, size), cfg.tensor_parallel_size)
        host = ray.util.get_node_ip_address()
        self.address = f"{host}:{free_port(host)}"
        # Named by placement group and rank, so `ray list actors` shows whose rank each is.
        self.actors = [RankActor.options(  # type: ignore[attr-defined]
            name=f"{RANK_PREFIX}{pg.id.hex()}:{r}", **_resources(pg.bundle_specs[bundles[r]]),
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundles[r])).remote()
            for r in range(1, size)]
        self.runs = [a.serve.remote(engine_config, r, size, self.address) for r, a in enumerate(self.actors, start=1)]
        # Blocks until every rank has joined (a rank that cannot start makes this time out with the reason).
        self.group = TPGroup(0, size, resolve_device(cfg.device), self.address, stages=cfg.pipeline_parallel_size)

    def check(self) -> None:
        """Raises when a rank has left: its actor died (or its loop ended), so this replica cannot compute."""
        done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for ref in done:
            ray.get(ref)  # a dead actor raises RayActorError here, with its cause
            raise RuntimeError("a tensor-parallel rank of this worker left its loop")

    def actor_ids(self) -> list[str]:
        return [a._actor_id.hex() for a in self.actors]


def end_replica(error: BaseException) -> None:
    """A split worker's engine loop died: its group is broken (a rank lost, or a step failed on some ranks only),
    so no step can run again. The process ends at once, before any waiting request is answered: Ray reports the
    replica dead to its callers, the ingress runs again each request of which no byte was sent (ingress/retry.py),
    Serve replaces the replica with its placement group, and the rank actors, owned by this process, die with it."""
    log.error("split worker: engine loop died (%s: %s); ending the replica", type(error).__name__, error)
    for handler in logging.getLogger().handlers:  # flush only: shutting logging down could wait on another thread
        handler.flush()
    os._exit(1)


def rank_bundles(nodes: list[str], tp: int) -> list[int]:
    """World rank -> bundle index, from each bundle's node (nodes[b]): bundle 0 (the replica) is rank 0; bundles on
    its node come first, then each other node's in bundle order, so the `tp` consecutive ranks of a stage share a
    node wherever the placement put that many together (a stage that straddles nodes is logged: it runs, with its
    all-reduces over the network)."""
    order: list[str] = []
    for node in nodes:
        if node not in order:
            order.append(node)
    ranks = [b for node in order for b, n in enumerate(nodes) if n == node]
    for s in range(0, len(ranks), tp):
        if len({nodes[b] for b in ranks[s:s + tp]}) > 1:
            log.warning("pipeline stage %d's %d ranks are on more than one node (bundles %s)", s // tp, tp,
                        ranks[s:s + tp])
    return ranks


def _bundle_nodes(pg: Any, size: int) -> list[str]:
    """The node id of each of the placement group's first `size` bundles (it is placed: this replica runs in it)."""
    table = ray.util.placement_group_table(pg)
    where = table.get("bundles_to_node_id") or {}
    return [str(where.get(b, "")) for b in range(size)]


def _resources(bundle: dict[str, float]) -> dict[str, Any]:
    """Actor options asking for exactly a bundle's resources."""
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory") and not k.startswith("bundle")}
    return {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0), "resources": custom}
