"""What a worker reports about itself (its stats carrier: queue, KV, memory, progress) for the ingress and tools;
Serve's health check is the worker's check_health, which reads the same engine."""

from __future__ import annotations

import os

from engine.async_engine import AsyncEngine
from protocol import WorkerStats


def process_memory() -> tuple[int, int]:
    """(resident bytes now, peak resident bytes) of this process, from /proc (0, 0 where there is none)."""
    try:
        with open("/proc/self/status") as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
    except OSError:
        return 0, 0

    def kib(name: str) -> int:
        return int(fields.get(name, "0 kB").split()[0]) * 1024

    return kib("VmRSS"), kib("VmHWM")


def worker_stats(engine: AsyncEngine, whole_calls: int = 0, whole_requests: int = 0,
                 stream_calls: int = 0) -> WorkerStats:
    s = engine.stats()
    rss, peak = process_memory()
    return WorkerStats(pid=os.getpid(), waiting=s.waiting, running=s.running, kv_blocks_total=s.kv_blocks_total,
                       kv_blocks_free=s.kv_blocks_free, kv_blocks_used=s.kv_blocks_used,
                       requests_finished=s.requests_finished, prefix_cache_hit_tokens=s.prefix_cache_hit_tokens,
                       prefix_cache_query_tokens=s.prefix_cache_query_tokens,
                       prefix_cache_evictions=s.prefix_cache_evictions, device=str(engine.engine.device),
                       cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
                       queued=s.queued, queued_tokens=s.queued_tokens, refused=s.refused,
                       rss_bytes=rss, peak_rss_bytes=peak, stalled_s=engine.stalled_for(),
                       weight_version=engine.engine.weight_version, whole_calls=whole_calls, stream_calls=stream_calls,
                       whole_requests=whole_requests, paused=engine.paused_mode,
                       vision_tower_runs=s.vision_tower_runs)
