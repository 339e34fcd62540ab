"""build_app's worker placement (no Ray cluster: the bound application's options): tensor_parallel_size N gives each
worker replica N bundles of its per-rank resources, STRICT_PACK (PACK with pipeline stages); N = 1 leaves the
deployment as it was."""

from __future__ import annotations

from typing import Any

from deploy.app import build_app


def _worker_replica_config(args: dict[str, Any]) -> Any:
    ingress = build_app(args)._bound_deployment
    return ingress.init_args[0]._bound_deployment._replica_config


def test_one_rank_reserves_no_placement_group() -> None:
    assert _worker_replica_config({}).placement_group_bundles is None


def test_ranks_reserve_one_bundle_each_on_one_node() -> None:
    cpu = _worker_replica_config({"tensor_parallel_size": 3, "worker_num_cpus": 0.5})
    assert cpu.placement_group_bundles == [{"CPU": 0.5}] * 3 and cpu.placement_group_strategy == "STRICT_PACK"
    gpu = _worker_replica_config({"tensor_parallel_size": 2, "worker_num_cpus": 4, "worker_num_gpus": 1})
    assert gpu.placement_group_bundles == [{"CPU": 4, "GPU": 1}] * 2
    # The replica (rank 0) sits in bundle 0: its own options are one bundle's resources.
    assert gpu.ray_actor_options["num_gpus"] == 1 and gpu.ray_actor_options["num_cpus"] == 4


def test_stages_may_sit_on_other_nodes() -> None:
    """TP 2 x PP 2: four bundles, PACK (a node filled before the next: a stage per node where one fits it)."""
    pp = _worker_replica_config({"tensor_parallel_size": 2, "pipeline_parallel_size": 2, "worker_num_cpus": 4,
                                 "worker_num_gpus": 1})
    assert pp.placement_group_bundles == [{"CPU": 4, "GPU": 1}] * 4 and pp.placement_group_strategy == "PACK"


def test_ranks_are_numbered_by_node() -> None:
    """A stage's consecutive ranks on one node: the replica's node first, whatever order Ray placed the bundles."""
    from workers.ranks import rank_bundles

    assert rank_bundles(["a", "b", "a", "b"], 2) == [0, 2, 1, 3]
    assert rank_bundles(["b", "a", "a", "b"], 2) == [0, 3, 1, 2]
    assert rank_bundles(["a", "b"], 1) == [0, 1]
