"""build_app's worker placement (no Ray cluster: the bound application's options): tensor_parallel_size N gives each
worker replica N bundles of its per-rank resources, STRICT_PACK; N = 1 leaves the deployment as it was."""

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
