"""Metrics on the session's real Ray cluster: after known requests, its Prometheus page shows the `rayscore_`
metrics with matching counts, and every metric the shipped Grafana dashboard queries is exported."""

from __future__ import annotations

import asyncio
import json
import re
import time
from pathlib import Path

import httpx
import pytest
from ray import serve

from checks.serve_calls import Samples, scrape
from tests.helpers.serve import app_args, deploy

APP, PREFIX = "opsmetrics", "/opsmetrics"
DASHBOARD = Path("configs/grafana-rayscore.json")


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of `name`'s series of this test's app whose labels match."""
    return sum(v for lab, v in samples.get(name, []) if lab.get("replica", "").startswith(f"{APP}#")
               and all(lab.get(k) == x for k, x in labels.items()))


def dashboard_metrics() -> set[str]:
    exprs = [t["expr"] for p in json.loads(DASHBOARD.read_text())["panels"] for t in p.get("targets", [])]
    assert exprs, "the dashboard queries nothing"
    return {name for e in exprs for name in re.findall(r"\bray_[a-z0-9_]+", e)}


@pytest.fixture(scope="module")
def url(serve_url: str):
    # A KV cache of 5 blocks of 16 tokens (SmolLM2 float32: 720 KiB a block) so that two generations
    # preempt each other and a new prompt evicts cached blocks: every engine counter moves.
    deploy(APP, PREFIX, app_args(num_workers=1, kv_cache_mb=4, max_num_seqs=4))
    yield serve_url + PREFIX
    serve.delete(APP)


async def _traffic(url: str) -> dict[str, int]:
    """Known requests; returns what the metrics must then count."""
    score = {"input_ids": list(range(100, 140)), "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}

    def gen(first: int) -> dict:
        return {"input_ids": list(range(first, first + 20)), "max_tokens": 40, "ignore_eos": True, "temperature": 0}

    async with httpx.AsyncClient(base_url=url, timeout=120) as c:
        for _ in range(2):  # the second is served from the prefix cache and the hidden-state store
            r = await c.post("/generate", json=score, headers={"X-Request-ID": "metrics-score"})
            assert r.status_code == 200 and r.headers["x-request-id"] == "metrics-score"
            assert r.headers.get_list("x-request-id") == ["metrics-score"]
        a, b = await asyncio.gather(c.post("/generate", json=gen(200)), c.post("/generate", json=gen(300)))
        assert a.status_code == b.status_code == 200
        bad = await c.post("/generate", json={"input_ids": [1, 2], "max_tokens": -1})
        assert bad.status_code == 400
        comp = await c.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 2, "temperature": 0})
        assert comp.status_code == 200
    return {"generate_ok": 4, "score_rows": 2 * 39, "prompt_tokens": 2 * 40 + 2 * 20 + 3, "generated": 2 * 40 + 2}


def test_counts_match_requests_and_dashboard_metrics_exported(url: str, metrics_url: str) -> None:
    want = asyncio.run(_traffic(url))
    names = dashboard_metrics()
    deadline = time.monotonic() + 60  # the agent exports what replicas flushed a few seconds ago
    while True:
        s = scrape(metrics_url)
        missing = sorted(n for n in names if n not in s)
        # Every count the asserts below read, so none is read before the replicas' last flush reached the agent
        # (the completion is the last request sent: its count can arrive a flush after the /generate ones).
        counted = (total(s, "ray_rayscore_requests_total", route="/generate", status="200"),
                   total(s, "ray_rayscore_scored_rows_total"), total(s, "ray_rayscore_prompt_tokens_total"),
                   total(s, "ray_rayscore_generated_tokens_total"),
                   total(s, "ray_rayscore_requests_total", route="/v1/completions", status="200"),
                   total(s, "ray_rayscore_request_latency_seconds_count", route="/generate"))
        expected = (want["generate_ok"], want["score_rows"], want["prompt_tokens"], want["generated"], 1, 5)
        if not missing and counted == expected and total(s, "ray_rayscore_preemptions_total") > 0:
            break
        assert time.monotonic() < deadline, f"missing {missing}; counted {counted}, expected {expected}"
        time.sleep(1)
    assert total(s, "ray_rayscore_requests_total", route="/generate", status="400") == 1
    assert total(s, "ray_rayscore_rejections_total", reason="invalid_request") == 1
    assert total(s, "ray_rayscore_requests_total", route="/v1/completions", status="200") == 1
    assert total(s, "ray_rayscore_hidden_store_rows_total") > 0
    assert total(s, "ray_rayscore_prefix_cache_hit_tokens_total") >= 32
    assert total(s, "ray_rayscore_kv_evictions_total") > 0
    assert total(s, "ray_rayscore_kv_blocks_total") == 5
    assert total(s, "ray_rayscore_request_latency_seconds_count", route="/generate") == 5
