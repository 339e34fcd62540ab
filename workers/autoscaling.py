"""Autoscaling the workers on work, not on request counts: a Ray Serve custom autoscaling policy.

Serve's default policy counts ongoing requests, but a 40-token and an 8,000-token scoring request are not the
same load. Each worker reports its token load (`record_autoscaling_stats` in workers/worker.py: the tokens of
every request its engine holds, queued or running); this policy asks for enough workers that each carries
about `target_tokens_per_worker` of them:

    autoscaling_config:
      min_replicas: 1
      max_replicas: 8
      upscale_delay_s: 30
      downscale_delay_s: 300
      policy:
        policy_function: workers.autoscaling:TokenLoadPolicy
        policy_kwargs: {target_tokens_per_worker: 16384}

Serve applies min/max_replicas, the up/downscale delays and factors around the number returned here, and
drains a replica it removes (no new requests; the running ones finish within graceful_shutdown_timeout_s).

Serve pickles this module by value into its controller: it imports nothing from the project.
"""

from __future__ import annotations

import math
from typing import Any

from ray.serve.config import AutoscalingContext

# Keys of the dict a worker's record_autoscaling_stats returns.
TOKEN_LOAD_METRIC = "rayscore_token_load"  # queued + running tokens in the engine
ONGOING_METRIC = "rayscore_engine_ongoing"  # requests in the engine (queued + running)


class TokenLoadPolicy:
    """desired workers = ceil(total token load / target_tokens_per_worker).

    The token load is the workers' reports (averaged by Serve over look_back_period_s), plus requests still
    queued at the handles (not yet on any worker, so their length is unknown), each counted at the mean
    tokens per request the workers hold now.
    """

    def __init__(self, target_tokens_per_worker: float = 16384.0) -> None:
        if target_tokens_per_worker <= 0:
            raise ValueError(f"target_tokens_per_worker must be positive, got {target_tokens_per_worker}")
        self.target_tokens_per_worker = float(target_tokens_per_worker)

    def __call__(self, ctx: AutoscalingContext) -> tuple[float, dict[str, Any]]:
        metrics = ctx.aggregated_metrics or {}
        loads = metrics.get(TOKEN_LOAD_METRIC, {})
        if not loads:  # no report yet (replicas starting): keep the current target
            return ctx.target_num_replicas, {}
        load = float(sum(loads.values()))
        held = float(sum(metrics.get(ONGOING_METRIC, {}).values()))
        queued = float(ctx.total_queued_requests or 0.0)
        if queued > 0:
            load += queued * (load / held if held > 0 else self.target_tokens_per_worker)
        return desired_workers(load, self.target_tokens_per_worker), {"token_load": load}


def desired_workers(token_load: float, target_tokens_per_worker: float) -> int:
    """Workers for `token_load` at `target_tokens_per_worker` each; 0 when idle (Serve's min_replicas rules)."""
    return math.ceil(token_load / target_tokens_per_worker) if token_load > 0 else 0
