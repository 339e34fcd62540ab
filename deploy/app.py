"""Builder: the only module that binds deployments. Serve's `import_path: deploy.app:build_app`."""

from __future__ import annotations

from typing import Any

import ray
from ray.serve import Application
from ray.serve.config import DeploymentActorConfig, RequestRouterConfig

from deploy.config import AppConfig
from ingress.deployment import Ingress
from workers.adapter_registry import ADAPTERS_ACTOR, AdapterRegistry
from workers.weight_sync import REGISTRY_ACTOR
from workers.weights import WeightRegistry
from workers.worker import EngineWorkerDeployment


def _scaling(replicas: int, autoscaling: dict[str, Any] | None) -> dict[str, Any]:
    return {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}


def _routing(cfg: AppConfig) -> dict[str, Any]:
    if not cfg.prefix_aware_routing:
        return {}
    kwargs = {"block_size": cfg.router_block_size or cfg.block_size,
              "imbalance_threshold": cfg.router_imbalance_threshold}
    return {"request_router_config": RequestRouterConfig(
        request_router_class="workers.router:PrefixAwareRouter", request_router_kwargs=kwargs)}


def _ranks(cfg: AppConfig) -> dict[str, Any]:
    """tensor_parallel_size x pipeline_parallel_size = N > 1: one bundle per rank; Serve puts the replica (rank 0) in
    bundle 0 and the replica starts the other ranks in the others (workers/ranks.py). One stage: STRICT_PACK, one
    node. Several: PACK, which fills a node before the next, so the stages may sit on different nodes, each on one
    where a node fits its ranks (Ray has no per-bundle-group constraint; the ranks are numbered by node)."""
    ranks = cfg.tensor_parallel_size * cfg.pipeline_parallel_size
    if ranks == 1:
        return {}
    bundle = {"CPU": cfg.worker_num_cpus, **({"GPU": cfg.worker_num_gpus} if cfg.worker_num_gpus else {})}
    strategy = "PACK" if cfg.pipeline_parallel_size > 1 else "STRICT_PACK"
    return {"placement_group_bundles": [bundle] * ranks, "placement_group_strategy": strategy}


def _actors(cfg: AppConfig) -> dict[str, Any]:
    """The weight registry (workers/weights.py) and the adapter registry (workers/adapter_registry.py) as
    deployment-scoped actors of the workers: Serve starts them before the replicas and stops them with the
    deployment, so nothing of a deploy outlives it (`serve shutdown`, `serve delete`), and no per-deploy name
    reaches the replicas' arguments (which would make every redeploy restart them)."""
    seeded = dict(cfg.lora_adapters or {})  # the config's adapters; the load route adds more
    actors = [DeploymentActorConfig(name=ADAPTERS_ACTOR, actor_class=ray.remote(AdapterRegistry), init_args=(seeded,),
                                    actor_options={"num_cpus": 0})]
    if cfg.weight_updates:
        actors.append(DeploymentActorConfig(name=REGISTRY_ACTOR, actor_class=ray.remote(WeightRegistry),
                                            actor_options={"num_cpus": 0}))
    return {"deployment_actors": actors}


# How often a stopping replica (ingress or worker) looks whether its requests are done: Serve's 2 s makes every idle
# replica wait 2 s before it exits (each delete, redeploy and scale-down); this ends it in a fifth of that, for the
# cost of a check of a counter.
SHUTDOWN_LOOP_S = 0.2


def build_app(args: dict[str, Any] | AppConfig | None = None) -> Application:
    cfg = args if isinstance(args, AppConfig) else AppConfig.model_validate(args or {})
    worker = EngineWorkerDeployment.options(
        ray_actor_options={"num_cpus": cfg.worker_num_cpus, "num_gpus": cfg.worker_num_gpus},
        max_ongoing_requests=cfg.worker_max_ongoing_requests, max_queued_requests=cfg.worker_max_queued_requests,
        # The event loop answers health checks in milliseconds even under a large request (carriers are built in
        # the engine thread); a stuck engine fails check_health itself after stuck_engine_timeout_s.
        health_check_period_s=5, health_check_timeout_s=30,
        graceful_shutdown_timeout_s=cfg.worker_graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=SHUTDOWN_LOOP_S,
        **_routing(cfg), **_ranks(cfg), **_actors(cfg), **_scaling(cfg.num_workers, cfg.worker_autoscaling),
    ).bind(cfg.engine_config(), cfg.model_name, cfg.weight_updates)
    return Ingress.options(
        ray_actor_options={"num_cpus": cfg.ingress_num_cpus}, max_ongoing_requests=cfg.ingress_max_ongoing_requests,
        graceful_shutdown_timeout_s=cfg.worker_graceful_shutdown_timeout_s,
        graceful_shutdown_wait_loop_s=SHUTDOWN_LOOP_S,
        **_scaling(cfg.ingress_num_replicas, cfg.ingress_autoscaling),
    ).bind(worker, settings=cfg.ingress_settings(), allow_unauthenticated=cfg.allow_unauthenticated,
           weight_updates=cfg.weight_updates)
