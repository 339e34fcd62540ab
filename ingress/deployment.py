"""The Ray Serve ingress deployment: the FastAPI app of app.py over the worker deployment's handle.

Bound by deploy/ (never here): `Ingress.options(...).bind(worker_app, settings=..., allow_unauthenticated=...,
weight_updates=...)`. Constructor: `Ingress(worker: DeploymentHandle, ready_timeout_s: float = 5.0,
settings: IngressSettings | None, allow_unauthenticated: bool = False, weight_updates: bool = False)`,
where `worker` is the worker deployment (methods `generate` streaming RequestOutput, `model_info`, `stats`),
`ready_timeout_s` bounds how long GET /health waits for a worker's `stats` before answering 503, `settings` holds
the limits, deadlines and config keys (settings.py), and `weight_updates` says whether the worker deployment keeps a
weight registry (workers/weights.py). Serve's `user_config` on this deployment ({field: value} of IngressSettings
but the keys and the workers' logprob limits: live_app.py) replaces those settings in place through `reconfigure`,
without restarting the replica.
Handle method: `stats()` -> IngressStats (requests run again after their worker was lost).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, fields
from typing import Any

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle
from ray.util.metrics import Counter

from ingress.app import build_fastapi_app
from ingress.edge.auth import with_keys
from ingress.edge.metrics import IngressMetrics
from ingress.live_app import LiveApp, runtime_settings
from ingress.retry import RetryCounter
from ingress.settings import IngressSettings
from ingress.transport import HandleBackend
from workers.replica import replica_label

logger = logging.getLogger("ray.serve")

# Logical CPUs per ingress replica: it parses, validates and relays; the workers do the compute. AppConfig's
# `ingress_num_cpus` defaults to this.
INGRESS_NUM_CPUS = 0.5


def serve_http_host() -> str | None:
    """The address Serve's HTTP proxies bind (the Serve YAML's `http_options.host`), from the controller;
    None when it cannot be found out (the caller then assumes the worst)."""
    try:
        from ray.serve.context import _get_global_client

        return _get_global_client().http_config.host
    except Exception as exc:  # an API that moved must not pass for a loopback bind
        logger.warning("could not read Serve's http_options.host: %s", type(exc).__name__)
        return None


@dataclass(frozen=True)
class IngressStats:
    """What an ingress replica reports through its handle: a small dataclass crosses the process boundary."""

    retries: int  # requests run again after their worker was lost, since the replica started

    def __getitem__(self, name: str) -> int:
        """A counter by its name, for tools and tests that name it."""
        if name not in {f.name for f in fields(self)}:
            raise KeyError(name)
        value: int = getattr(self, name)
        return value


# `serve.ingress()` without an app is Serve's late-bound form: the app is built on the replica, after
# __init__, by __serve_build_asgi_app__. The routes thus stay plain closures over a backend (the same
# app the unit tests drive with a fake) instead of methods wired to Serve's class-based views.
# max_ongoing_requests: a request holds its slot from its headers on (a streamed generation for its whole length, a
# slow body until body_timeout_s), so Serve's default of 5 would queue the sixth client behind the first five; the
# workers do the real admission control. deploy/ sets it from AppConfig.ingress_max_ongoing_requests.
@serve.deployment(max_ongoing_requests=1024, ray_actor_options={"num_cpus": INGRESS_NUM_CPUS})
@serve.ingress()
class Ingress:
    def __init__(self, worker: DeploymentHandle, ready_timeout_s: float = 5.0,
                 settings: IngressSettings | None = None, allow_unauthenticated: bool = False,
                 weight_updates: bool = False) -> None:
        # Keys from $RAYSCORE_API_KEYS are read here, where the ingress runs, and never leave this process.
        # Raising here fails the deployment: a server reachable from other machines without keys never starts.
        self._settings = with_keys(settings or IngressSettings(), os.environ, serve_http_host(), allow_unauthenticated)
        self._base_settings = self._settings  # what `args` gave; user_config (reconfigure) is laid over it
        self._app: LiveApp | None = None
        self._metrics: IngressMetrics | None = None  # made on the replica (Serve's context), kept across rebuilds
        self._backend = HandleBackend(worker, ready_timeout_s=ready_timeout_s, weight_updates=weight_updates,
                                      coalesce_max_in_flight=self._settings.coalesce_max_in_flight,
                                      coalesce_max_tokens=self._settings.coalesce_max_tokens,
                                      model_info_ttl_s=self._settings.model_info_ttl_s)
        metric = Counter("rayscore_retries_total",
                         description="Requests run again because their worker was lost before any byte was sent.")
        self._retries = RetryCounter(on_retry=metric.inc)
        logger.info("rayscore ingress: %d API key(s), %s", len(self._settings.api_keys), self._settings)

    def __serve_build_asgi_app__(self) -> LiveApp:
        self._app = LiveApp(self._build())
        return self._app

    def reconfigure(self, user_config: dict[str, Any] | None) -> None:
        """Serve's user_config (`deployments: [{name: Ingress, user_config: {...}}]` in the YAML): IngressSettings
        fields set in place, no restart; the next request runs on them. Called after __init__ at every start too."""
        self._settings = runtime_settings(self._base_settings, user_config)
        self._backend.coalescer.resize(self._settings.coalesce_max_in_flight, self._settings.coalesce_max_tokens)
        if self._app is not None:
            self._app.replace(self._build())
        logger.info("rayscore ingress reconfigured: %s", self._settings)

    def _build(self) -> FastAPI:
        if self._metrics is None:
            self._metrics = IngressMetrics(replica_label())
        return build_fastapi_app(self._backend, self._settings, self._retries, on_request=self._metrics.observe)

    async def check_health(self) -> None:
        """Serve's periodic health check: never fails the replica (a worker's absence is /health's 503), and
        loads the tokenizer once the workers answer (HandleBackend.warm)."""
        self._backend.warm()

    async def stats(self) -> IngressStats:
        """This replica's counters (handle method; HTTP routes are the app's)."""
        return IngressStats(retries=self._retries.total)
