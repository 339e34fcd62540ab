"""The other ranks of a tensor-parallel worker replica: one Ray actor per rank in the replica's own placement group
(Serve reserves it from placement_group_bundles, deploy/app.py: one bundle per rank, the replica in bundle 0,
STRICT_PACK on one node). Rank 0 is the replica itself, whose engine drives the others over torch.distributed
(engine/parallel/); Ray only places and watches them, nothing per step goes through Ray.

The actors are created by the replica, so they are owned by it: when Serve removes the replica (scale-down,
redeploy, `serve shutdown`, a failed health check), Ray kills them with it."""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from engine.config import EngineConfig
from engine.loading.loader import resolve_device
from engine.parallel.group import TPGroup, free_port

# Rank actors' names: this prefix, the placement group's id, the rank.
RANK_PREFIX = "rayscore-rank:"


@ray.remote
class RankActor:
    """Rank r > 0: joins the group, loads its shard, then runs rank 0's broadcasts until told to stop."""

    def serve(self, engine_config: dict[str, Any], rank: int, size: int, address: str) -> int:
        """Blocks for the replica's life; returns the forwards it ran once rank 0 says stop."""
        from engine.parallel.follower import Follower

        cfg = EngineConfig(**engine_config)
        group = TPGroup(rank, size, resolve_device(cfg.device), address)
        follower = Follower(cfg, group)
        follower.run()
        group.close()
        return follower.steps


class RankGroup:
    """Started from the replica's constructor: the N - 1 rank actors, and this process as rank 0 of their group."""

    def __init__(self, engine_config: dict[str, Any]) -> None:
        cfg = EngineConfig(**engine_config)
        size = cfg.tensor_parallel_size
        pg = ray.util.get_current_placement_group()
        if pg is None or len(pg.bundle_specs) < size:
            raise ValueError(f"tensor_parallel_size {size} needs a placement group of {size} bundles for the worker "
                             "replica (deploy/app.py sets placement_group_bundles)")
        host = ray.util.get_node_ip_address()
        address = f"{host}:{free_port(host)}"
        # Named by placement group and rank, so `ray list actors` shows whose rank each is.
        self.actors = [RankActor.options(  # type: ignore[attr-defined]
            name=f"{RANK_PREFIX}{pg.id.hex()}:{r}", **_resources(pg.bundle_specs[r]),
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=r)).remote()
            for r in range(1, size)]
        self.runs = [a.serve.remote(engine_config, r, size, address) for r, a in enumerate(self.actors, start=1)]
        # Blocks until every rank has joined (a rank that cannot start makes this time out with the reason).
        self.group = TPGroup(0, size, resolve_device(cfg.device), address)

    def check(self) -> None:
        """Raises when a rank has left: its actor died (or its loop ended), so this replica cannot compute."""
        done, _ = ray.wait(self.runs, num_returns=len(self.runs), timeout=0)
        for ref in done:
            ray.get(ref)  # a dead actor raises RayActorError here, with its cause
            raise RuntimeError("a tensor-parallel rank of this worker left its loop")

    def actor_ids(self) -> list[str]:
        return [a._actor_id.hex() for a in self.actors]


def _resources(bundle: dict[str, float]) -> dict[str, Any]:
    """Actor options asking for exactly a bundle's resources."""
    custom = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU", "memory") and not k.startswith("bundle")}
    return {"num_cpus": bundle.get("CPU", 0), "num_gpus": bundle.get("GPU", 0), "resources": custom}
