"""Nothing lost when a worker dies, on the session's real Ray cluster: a worker SIGKILLed under 32 in-flight
scoring requests, every one answered 200 and exact."""

from __future__ import annotations

import os
import signal
import threading
import time

import httpx
import pytest
from ray import serve

from tests.helpers.reference import hf_scores
from tests.helpers.serve import app_args, deploy, ids_of, score_body, worker_stats

# --- real Ray: SIGKILL a worker under load -----------------------------------------------------------


def _in_flight_kill(url: str, app: str, n_workers: int, smollm2_path) -> None:
    """32 concurrent scoring requests; once both/the worker(s) hold work, SIGKILL one; all must be 200 and
    exact. Returns nothing: asserts."""
    prompts = [ids_of(96, seed) for seed in range(4)]
    results: dict[int, httpx.Response | BaseException] = {}

    def send(i: int) -> None:
        try:
            results[i] = httpx.post(url + "/generate", json=score_body(prompts[i % 4], 2), timeout=300)
        except BaseException as exc:  # noqa: BLE001 - reported below
            results[i] = exc

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(32)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    while True:
        stats = worker_stats(app, samples=8)
        busy = [s for s in stats.values() if s.running + s.waiting > 0]
        if len(stats) == n_workers and busy:
            break
        assert time.monotonic() < deadline, "no work in flight"
    victim = busy[0].pid
    os.kill(victim, signal.SIGKILL)
    for t in threads:
        t.join(300)
    statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in results.values()]
    assert statuses == [200] * 32, statuses
    for i, r in results.items():
        rows = r.json()["meta_info"]["input_token_logprobs"]
        expected = hf_scores(smollm2_path, prompts[i % 4], 2)
        assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= 1e-4
    retries = serve.get_deployment_handle("Ingress", app_name=app).stats.remote().result(timeout_s=30)["retries"]
    assert retries >= 1
    assert victim not in worker_stats(app, samples=8)


@pytest.mark.parametrize("n_workers", [2, 1])
def test_a_killed_worker_loses_no_scoring_request(serve_url: str, smollm2_path, n_workers: int) -> None:
    app = f"retry{n_workers}"
    deploy(app, f"/{app}", app_args(num_workers=n_workers, retry_deadline_s=120.0))
    try:
        _in_flight_kill(f"{serve_url}/{app}", app, n_workers, smollm2_path)
    finally:
        serve.delete(app)
