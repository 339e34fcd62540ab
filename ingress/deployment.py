"""The Ray Serve ingress deployment: the FastAPI app of app.py over the worker deployment's handle.

Bound by deploy/ (never here): `Ingress.options(...).bind(worker_app)`.
Constructor: `Ingress(worker: DeploymentHandle, ready_timeout_s: float = 5.0)`, where `worker` is the
worker deployment (methods `generate` streaming GenerateChunk, `model_info`, `stats`) and
`ready_timeout_s` bounds how long GET /health waits for a worker's `stats` before answering 503.
"""

from __future__ import annotations

from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from ingress.app import build_fastapi_app
from ingress.backend import HandleBackend
from ingress.metrics import IngressMetrics, replica_label


# `serve.ingress()` without an app is Serve's late-bound form: the app is built on the replica, after
# __init__, by __serve_build_asgi_app__. The routes thus stay plain closures over a backend (the same
# app the unit tests drive with a fake) instead of methods wired to Serve's class-based views.
# max_ongoing_requests: a streamed generation holds its slot for its whole length, so Serve's default
# of 5 would queue the sixth client behind the first five; the workers do the real admission control.
@serve.deployment(max_ongoing_requests=256, ray_actor_options={"num_cpus": 0.5})
@serve.ingress()
class Ingress:
    def __init__(self, worker: DeploymentHandle, ready_timeout_s: float = 5.0) -> None:
        self._backend = HandleBackend(worker, ready_timeout_s=ready_timeout_s)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return build_fastapi_app(self._backend, on_request=IngressMetrics(replica_label()).observe)
