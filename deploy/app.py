"""Builder: the only module that binds deployments. Serve's `import_path: deploy.app:build_app`."""

from __future__ import annotations

from typing import Any

from ray.serve import Application

from deploy.config import AppConfig
from ingress.deployment import Ingress
from workers.worker import EngineWorkerDeployment


def _scaling(replicas: int, autoscaling: dict[str, Any] | None) -> dict[str, Any]:
    return {"autoscaling_config": autoscaling} if autoscaling else {"num_replicas": replicas}


def build_app(args: dict[str, Any] | AppConfig | None = None) -> Application:
    cfg = args if isinstance(args, AppConfig) else AppConfig.model_validate(args or {})
    worker = EngineWorkerDeployment.options(
        ray_actor_options={"num_cpus": cfg.worker_num_cpus, "num_gpus": cfg.worker_num_gpus},
        max_ongoing_requests=cfg.worker_max_ongoing_requests,
        # Loading (or converting) the model takes a while on first start.
        health_check_period_s=5, health_check_timeout_s=30, graceful_shutdown_timeout_s=5,
        **_scaling(cfg.num_workers, cfg.worker_autoscaling),
    ).bind(cfg.engine_config(), cfg.model_name)
    return Ingress.options(
        ray_actor_options={"num_cpus": cfg.ingress_num_cpus},
        **_scaling(cfg.ingress_num_replicas, cfg.ingress_autoscaling),
    ).bind(worker)
