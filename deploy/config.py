"""The one typed application config: what `args:` in a Serve YAML file may hold.

The engine's fields come from engine/config.py's EngineConfig itself (type, default and description), and the
ingress's from ingress/settings.py's IngressSettings, so a new field or default needs no edit here; this file
adds only what the deploy edge decides: the KV budget in MiB, threads from the worker's CPUs, API keys as
secrets, and the deployments' shapes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, SecretStr, create_model, model_validator

from engine.config import EngineConfig
from ingress.deployment import INGRESS_NUM_CPUS
from ingress.live_app import runtime_settings
from ingress.settings import IngressSettings

MIB = 1024 * 1024
# Engine fields set differently at this edge: the KV budget in MiB (kv_cache_mb), and the thread count,
# whose default here is the worker's CPU count rather than torch's own.
_EDGE_FIELDS = {"kv_cache_bytes", "num_threads"}


# IngressSettings fields this edge does not take from it: the logprob limits are the engine's fields (the same
# values go to both), and API keys arrive as secrets.
_INGRESS_OWN = {"max_top_logprobs", "max_logprob_entries", "api_keys", "admin_api_keys"}


def _fields(cls: type, skip: set[str]) -> dict[str, Any]:
    """A frozen dataclass's fields as pydantic fields: their types, defaults and `doc` descriptions."""
    hints = get_type_hints(cls)
    return {f.name: (hints[f.name], Field(f.default, description=f.metadata["doc"]))
            for f in dataclasses.fields(cls) if f.name not in skip}


# Values are checked by EngineConfig and IngressSettings themselves (AppConfig._configs_are_valid), with their
# own messages. mypy cannot type a model made at run time: create_model's overloads want literal field kwargs,
# and a base class held in a variable is not a valid type to it.
DerivedFields: type[BaseModel] = create_model(  # type: ignore[call-overload]
    "DerivedFields", __config__=ConfigDict(extra="forbid"), **_fields(EngineConfig, _EDGE_FIELDS),
    **_fields(IngressSettings, _INGRESS_OWN))


class AppConfig(DerivedFields):  # type: ignore[misc,valid-type]
    # --- model and engine: EngineConfig's fields (DerivedFields), and ---------------------------------
    model_name: str | None = Field(None, description="Name the server reports for the model; default: `model`.")
    kv_cache_mb: int = Field(EngineConfig.kv_cache_bytes // MIB, gt=0,
                             description="KV-cache budget per worker, MiB (K and V of all layers).")
    num_threads: int | None = Field(None, gt=0, description="torch threads per worker; default: the worker's "
                                    "CPU count (Ray sets OMP_NUM_THREADS=1 in small actors).")

    # --- self-protection; the engine's limits and queue bounds, and the ingress's, are DerivedFields --
    worker_max_queued_requests: int = Field(128, description="Serve's max_queued_requests for the workers: requests "
                                            "one ingress replica holds for lack of a worker slot; beyond it the "
                                            "handle raises BackPressureError at once (503). -1: unbounded.")

    # --- workers ---------------------------------------------------------------------------------
    num_workers: int = Field(1, gt=0, description="Worker replicas when not autoscaling.")
    worker_autoscaling: dict[str, Any] | None = Field(None, description="Serve autoscaling_config for workers "
                                                      "(min_replicas, max_replicas, target_ongoing_requests, ...).")
    worker_num_cpus: float = Field(1.0, ge=0, description="Logical CPUs per worker replica; per rank with "
                                   "tensor_parallel_size or pipeline_parallel_size > 1 (one placement-group bundle "
                                   "each).")
    worker_num_gpus: float = Field(0.0, ge=0, description="GPUs per worker replica (1 on a GPU cluster); per rank "
                                   "with tensor_parallel_size or pipeline_parallel_size > 1.")
    worker_max_ongoing_requests: int = Field(64, gt=0, description="Requests Serve sends one worker at once; "
                                             "the engine batches them.")
    # 60 s: scoring requests and typical generations finish; the ingress replicas get the same grace period.
    worker_graceful_shutdown_timeout_s: float = Field(60.0, ge=0, description="How long a worker (and an ingress "
                                                      "replica) that Serve removes (scale-down, redeploy, shutdown) "
                                                      "may finish its in-flight requests, receiving no new ones, "
                                                      "before it is killed.")

    weight_updates: bool = Field(True, description="Serve POST /update_weights_from_disk and /flush_cache: each "
                                 "deploy gets a weight registry actor (workers/weights.py) its workers follow.")

    prefix_aware_routing: bool = Field(False, description="Send each input_ids request to the worker that was sent "
                                       "the longest prefix of it (workers/router.py); else Serve's power of two.")
    router_block_size: int | None = Field(None, gt=0, description="Tokens per block the router hashes; default: "
                                          "block_size.")
    router_imbalance_threshold: int = Field(8, ge=0, description="Route by prefix only while that worker's queue "
                                            "is at most this many requests longer than the shortest.")

    # --- ingress ---------------------------------------------------------------------------------
    ingress_num_replicas: int = Field(1, gt=0, description="Ingress replicas when not autoscaling.")
    ingress_autoscaling: dict[str, Any] | None = Field(None, description="Serve autoscaling_config for the ingress.")
    ingress_num_cpus: float = Field(INGRESS_NUM_CPUS, ge=0, description="Logical CPUs per ingress replica.")
    # Large: a request holds its slot from its headers on (a streamed generation for its whole length, a slow
    # client's body until body_timeout_s), and an ingress slot costs a coroutine; the workers do the real admission.
    ingress_max_ongoing_requests: int = Field(1024, gt=0, description="Requests Serve sends one ingress replica at "
                                              "once (a slow client's body holds one until body_timeout_s).")

    # --- the front door (deploy/launch.py applies these when it starts Ray: HAProxy's settings and the guard in
    # front of Serve's own request handling are per cluster, read from the environment of Ray's processes) -----
    header_timeout_s: float = Field(30.0, gt=0, description="HAProxy's client timeout and header-phase timeout: "
                                    "a connection that sends nothing (no request yet, or between chunks of its "
                                    "request) for this long, or whose headers are not complete this long after its "
                                    "request began, is answered 408 and closed. Python proxy: not enforced (Serve's "
                                    "proxy has no such timer).")
    max_url_bytes: int = Field(8 * 1024, gt=0, description="Most bytes of a request's target (path and query "
                               "string): 414 (front-door guard) above it. Behind HAProxy, whose buffer holds "
                               "max(64 KiB, max_url_bytes + max_header_bytes + 2 KiB) per request, a request line "
                               "and headers past that buffer are HAProxy's own 400.")
    max_header_bytes: int = Field(16 * 1024, gt=0, description="Most bytes of request headers: 431 (front-door "
                                  "guard) above it; behind HAProxy, past its buffer (see max_url_bytes), HAProxy's "
                                  "own 400.")

    # --- enforced by the ingress, each named in the error it causes: IngressSettings' fields (DerivedFields;
    # max_top_logprobs and max_logprob_entries are the engine's), and -----------------------------------
    # SecretStr: a config printed or logged shows '**********', never a key.
    api_keys: list[SecretStr] | None = Field(None, description="Accepted `Authorization: Bearer` keys (every route but "
                                       "/health and the API docs); also from $RAYSCORE_API_KEYS, comma-separated.")
    admin_api_keys: list[SecretStr] | None = Field(None, description="Keys that open the admin routes (weight "
                                             "updates, cache flush, pause, continue, abort, adapter loading), which "
                                             "no `api_keys` key opens; also from $RAYSCORE_ADMIN_API_KEYS.")
    allow_unauthenticated: bool = Field(False, description="Serve without API keys on a non-loopback address on "
                                        "purpose; otherwise such a config refuses to start.")

    def ingress_settings(self) -> IngressSettings:
        """What the ingress enforces (the keys of $RAYSCORE_API_KEYS are added where it runs)."""
        secret = {"api_keys", "admin_api_keys"}
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(IngressSettings) if f.name not in secret}
        return IngressSettings(**values, api_keys=tuple(k.get_secret_value() for k in self.api_keys or ()),
                               admin_api_keys=tuple(k.get_secret_value() for k in self.admin_api_keys or ()))

    @model_validator(mode="after")
    def _configs_are_valid(self) -> AppConfig:
        # A ValueError here is a validation error of the YAML's args.
        EngineConfig(**self.engine_config())
        self.ingress_settings()
        return self

    def engine_config(self) -> dict[str, Any]:
        """Plain kwargs for engine.config.EngineConfig (built inside the worker process)."""
        values = {f.name: getattr(self, f.name) for f in dataclasses.fields(EngineConfig) if f.name not in _EDGE_FIELDS}
        threads = self.num_threads or (max(1, int(self.worker_num_cpus)) if self.worker_num_gpus == 0 else None)
        return {**values, "kv_cache_bytes": self.kv_cache_mb * MIB, "num_threads": threads}


def check_user_configs(app: dict[str, Any]) -> None:
    """ValueError naming the field when a Serve config's application (`applications:` entry) gives a deployment a
    `user_config` its replicas would refuse. Serve stops a replica whose reconfigure raises, so a bad field pushed
    to running replicas takes them down; deploy/launch.py checks the file first."""
    cfg = AppConfig.model_validate(app.get("args") or {})
    for deployment in app.get("deployments") or ():
        user_config = deployment.get("user_config")
        if deployment.get("name") == "Ingress" and user_config:
            runtime_settings(cfg.ingress_settings(), user_config)
        elif deployment.get("name") == "EngineWorker" and user_config:
            EngineConfig(**cfg.engine_config()).with_runtime(user_config)

