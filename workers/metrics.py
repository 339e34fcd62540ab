"""The worker's metrics, exported through Ray's metrics agent (`ray.util.metrics`), tagged by model and replica.

Two feeds: `on_output` sees every engine output of the replica's requests (per-request counters and queue
time), and a refresher thread reads the engine's counters once a second (gauges, cache and scheduler
counters, per-step histograms). The engine only counts; it never imports Ray. Prometheus sees every name
with Ray's `ray_` prefix: `rayscore_preemptions_total` is scraped as `ray_rayscore_preemptions_total`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ray.util.metrics import Counter, Gauge, Histogram

from engine.stats import EngineStats, ServingStats, StepRecord
from protocol.outputs import RequestOutput
from protocol.sampling import SamplingParams
from workers.autoscaling import ONGOING_METRIC, TOKEN_LOAD_METRIC

log = logging.getLogger("ray.serve")

TAGS = ("model", "replica")
SECONDS = [0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0]
TOKENS = [1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768]

# Engine stats exported as counters: metric name -> (the stats field it reads, meaning).
COUNTED_STATS: dict[str, tuple[Callable[[EngineStats], int], str]] = {
    "rayscore_prefix_cache_query_tokens_total": (
        lambda s: s.prefix_cache_query_tokens, "Prompt tokens looked up in the prefix cache."),
    "rayscore_prefix_cache_hit_tokens_total": (
        lambda s: s.prefix_cache_hit_tokens, "Prompt tokens served from the prefix cache."),
    "rayscore_hidden_store_rows_total": (
        lambda s: s.hidden_store_rows, "Scoring rows served from the hidden-state store (only the LM head ran)."),
    "rayscore_vision_tower_runs_total": (
        lambda s: s.vision_tower_runs, "Images put through the vision tower (a cached image adds none)."),
    "rayscore_preemptions_total": (
        lambda s: s.preemptions, "Requests preempted (KV blocks freed, recomputed later)."),
    "rayscore_kv_evictions_total": (
        lambda s: s.prefix_cache_evictions, "Cached KV blocks evicted for other content."),
}
# Engine stats exported as gauges: metric name -> (the stats field it reads, meaning).
GAUGED_STATS: dict[str, tuple[Callable[[EngineStats], int], str]] = {
    "rayscore_running_requests": (lambda s: s.running, "Requests in the engine's running batch."),
    "rayscore_waiting_requests": (lambda s: s.waiting, "Requests waiting for the engine (queued)."),
    "rayscore_queued_prompt_tokens": (lambda s: s.queued_tokens, "Tokens of the waiting requests, still to compute."),
    "rayscore_running_tokens": (lambda s: s.running_tokens, "Tokens (prompt + generated) of the running requests."),
    "rayscore_kv_blocks_used": (lambda s: s.kv_blocks_used, "KV-cache blocks in use."),
    "rayscore_kv_blocks_total": (lambda s: s.kv_blocks_total, "KV-cache blocks of the worker."),
}


def autoscaling_stats(stats: ServingStats) -> dict[str, float]:
    """What a worker reports to Serve's autoscaler (workers/autoscaling.py reads it): Serve's own format, a
    dict of metric name -> value."""
    return {TOKEN_LOAD_METRIC: float(stats.queued_tokens + stats.running_tokens),
            ONGOING_METRIC: float(stats.waiting + stats.running)}


class WorkerMetrics:
    def __init__(self, model: str, replica: str) -> None:
        kw: dict[str, Any] = {"tag_keys": TAGS}
        self._requests = Counter("rayscore_engine_requests_total", "Requests the engine finished, by kind "
                                 "(scoring: max_tokens 0; generation) and finish reason.",
                                 tag_keys=(*TAGS, "kind", "finish_reason"))
        self._prompt_tokens = Counter("rayscore_prompt_tokens_total", "Prompt tokens of finished requests.",
                                      tag_keys=(*TAGS, "kind"))
        self._scored_rows = Counter("rayscore_scored_rows_total", "Input-token logprob rows returned.", **kw)
        self._generated = Counter("rayscore_generated_tokens_total", "Tokens generated.", **kw)
        self._queue_time = Histogram("rayscore_queue_time_seconds", "Arrival in the engine to first schedule.",
                                     boundaries=SECONDS, **kw)
        self._step_time = Histogram("rayscore_engine_step_seconds", "Wall time of one engine step.",
                                    boundaries=SECONDS, **kw)
        self._step_tokens = Histogram("rayscore_tokens_per_step", "Tokens computed in one engine step.",
                                      boundaries=TOKENS, **kw)
        self._counters = {name: Counter(name, doc, **kw) for name, (_, doc) in COUNTED_STATS.items()}
        self._gauges = {name: Gauge(name, doc, **kw) for name, (_, doc) in GAUGED_STATS.items()}
        self._tags = {"model": model, "replica": replica}
        for m in (self._requests, self._prompt_tokens, self._scored_rows, self._generated, self._queue_time,
                  self._step_time, self._step_tokens, *self._counters.values(), *self._gauges.values()):
            m.set_default_tags(self._tags)
        self._last: dict[str, int] = {}  # each counter's stats value at the previous refresh, for its delta

    def on_output(self, params: SamplingParams, out: RequestOutput) -> None:
        """Count one engine output (a delta) of a request; its last output also counts the request."""
        if out.input_token_logprobs:
            self._scored_rows.inc(len(out.input_token_logprobs))
        if out.new_token_ids:
            self._generated.inc(len(out.new_token_ids))
        if not out.finished:
            return
        kind = "scoring" if params.max_tokens == 0 else "generation"
        reason = out.finish_reason.type if out.finish_reason is not None else "unknown"
        self._requests.inc(1, tags={"kind": kind, "finish_reason": reason})
        if out.prompt_tokens:
            self._prompt_tokens.inc(out.prompt_tokens, tags={"kind": kind})
        if out.arrival_time is not None and out.scheduled_time is not None:
            self._queue_time.observe(max(0.0, out.scheduled_time - out.arrival_time))

    def refresh(self, stats: EngineStats, steps: list[StepRecord]) -> None:
        """Publish one reading of the engine's stats and the steps run since the previous one."""
        for name, (read, _) in GAUGED_STATS.items():
            self._gauges[name].set(read(stats))
        for name, (read, _) in COUNTED_STATS.items():
            value = read(stats)
            delta = value - self._last.get(name, 0)
            if delta > 0:
                self._counters[name].inc(delta)
            self._last[name] = value
        for step in steps:
            self._step_time.observe(step.duration_s)
            self._step_tokens.observe(step.num_tokens)


class MetricsRefresher:
    """A daemon thread that calls `refresh(read_stats(), drain_steps())` every `interval_s` seconds."""

    def __init__(self, metrics: WorkerMetrics, read_stats: Callable[[], EngineStats],
                 drain_steps: Callable[[], list[StepRecord]], interval_s: float = 1.0) -> None:
        self._metrics, self._read, self._drain = metrics, read_stats, drain_steps
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rayscore-metrics", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        failed = False
        while not self._stop.wait(self._interval_s):
            try:
                self._metrics.refresh(self._read(), self._drain())
                failed = False
            except Exception:  # metrics must never take the worker down; say so once per failure streak
                if not failed:
                    log.exception("rayscore metrics refresh failed")
                failed = True

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
