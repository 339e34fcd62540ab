"""Builder: the only module that binds deployments. Serve's `import_path: deploy.app:build_app`."""

from __future__ import annotations

import uuid
from typing import Any

from ray.serve import Application
from ray.serve.config import RequestRouterConfig

from deploy.config import AppConfig
from ingress.deployment import Ingress
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
    """tensor_parallel_size N > 1: one bundle per rank on one node; Serve puts the replica (rank 0) in bundle 0 and
    the replica starts the other ranks in the others (workers/ranks.py)."""
    if cfg.tensor_parallel_size == 1:
        return {}
    bundle = {"CPU": cfg.worker_num_cpus, **({"GPU": cfg.worker_num_gpus} if cfg.worker_num_gpus else {})}
    return {"placement_group_bundles": [bundle] * cfg.tensor_parallel_size, "placement_group_strategy": "STRICT_PACK"}


def build_app(args: dict[str, Any] | AppConfig | None = None) -> Application:
    cfg = args if isinstance(args, AppConfig) else AppConfig.model_validate(args or {})
    # The weight registry (workers/weights.py) is named per deploy: a new deploy starts on the config's weights,
    # and an update reaches this deploy's workers only.
    registry = f"rayscore-weights-{uuid.uuid4().hex[:16]}" if cfg.weight_updates else None
    # The LoRA adapters' registry (workers/adapter_registry.py), named per deploy likewise.
    adapters = f"rayscore-adapters-{uuid.uuid4().hex[:16]}"
    worker = EngineWorkerDeployment.options(
        ray_actor_options={"num_cpus": cfg.worker_num_cpus, "num_gpus": cfg.worker_num_gpus},
        max_ongoing_requests=cfg.worker_max_ongoing_requests, max_queued_requests=cfg.worker_max_queued_requests,
        # The event loop answers health checks in milliseconds even under a large request (carriers are built in
        # the engine thread); a stuck engine fails check_health itself after stuck_engine_timeout_s.
        health_check_period_s=5, health_check_timeout_s=30,
        graceful_shutdown_timeout_s=cfg.worker_graceful_shutdown_timeout_s,
        **_routing(cfg), **_ranks(cfg), **_scaling(cfg.num_workers, cfg.worker_autoscaling),
    ).bind(cfg.engine_config(), cfg.model_name, registry, adapters)
    return Ingress.options(
        ray_actor_options={"num_cpus": cfg.ingress_num_cpus}, max_ongoing_requests=cfg.ingress_max_ongoing_requests,
        graceful_shutdown_timeout_s=cfg.worker_graceful_shutdown_timeout_s,
        **_scaling(cfg.ingress_num_replicas, cfg.ingress_autoscaling),
    ).bind(worker, settings=cfg.ingress_settings(), allow_unauthenticated=cfg.allow_unauthenticated,
           weights_registry=registry, adapters_registry=adapters)
