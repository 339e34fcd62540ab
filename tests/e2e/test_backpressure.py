"""Serve's own backpressure (max_queued_requests on the worker deployment) reaches the client as a 503 with
Retry-After at once, in both error shapes, while the admitted requests are answered. Real Ray: an app bound
here with one worker slot and one queue place, so a burst overflows it for sure."""

from __future__ import annotations

import threading
import time

import httpx
from ray import serve

from deploy.config import AppConfig
from ingress.deployment import Ingress
from tests.helpers.serve import app_args, wait_ready
from workers.worker import EngineWorkerDeployment


def test_serve_backpressure_is_503_with_retry_after_at_once(serve_url: str) -> None:
    # No model-info refresh during the test: its worker call would take the one queue place (documented).
    cfg = AppConfig.model_validate(app_args(num_workers=1, model_info_ttl_s=3600))
    worker = EngineWorkerDeployment.options(
        num_replicas=1, max_ongoing_requests=1, max_queued_requests=1,
        ray_actor_options={"num_cpus": cfg.worker_num_cpus}).bind(cfg.engine_config(), cfg.model_name)
    app, url = "backpressure", serve_url + "/backpressure"
    serve.run(Ingress.options(ray_actor_options={"num_cpus": 0.1}).bind(worker, settings=cfg.ingress_settings()),
              name=app, route_prefix="/backpressure", blocking=False)
    wait_ready(app)
    try:
        # A warm ingress: its tokenizer loaded (/tokenize needs no worker), as after Serve's first health check.
        assert httpx.post(url + "/tokenize", json={"prompt": "Count:"}, timeout=120).status_code == 200
        # Long enough to still run while the others arrive: seconds on any CPU. Ids, not text: no tokenizer between
        # the client and the worker. The first is streamed and its first event awaited: it surely holds the worker's
        # one slot. Then two more go: one takes the one queue place and the other is refused at once, whichever
        # Serve sees first (a loaded machine may reorder them); once one is refused the queue is full for sure, and
        # a completion sent then is refused too.
        long = {"input_ids": [504, 3458, 282, 4649, 314], "max_tokens": 250, "ignore_eos": True}
        running = threading.Event()
        first: list[int] = []

        def streamed() -> None:
            with httpx.stream("POST", url + "/generate", json={**long, "stream": True}, timeout=300) as r:
                for _ in r.iter_lines():
                    running.set()
                first.append(r.status_code)

        answers: dict[str, tuple[httpx.Response, float]] = {}

        def unary(name: str) -> None:
            # Short: the one admitted waits in the queue place until the first ends, whatever its own length, so
            # generating 250 tokens after that would only add time.
            t0 = time.monotonic()
            r = httpx.post(url + "/generate", json={**long, "max_tokens": 8}, timeout=300)
            answers[name] = (r, time.monotonic() - t0)

        threads = [threading.Thread(target=streamed)]
        threads[0].start()
        assert running.wait(120), "the first request never started"
        for name in ("a", "b"):
            threads.append(threading.Thread(target=unary, args=(name,)))
            threads[-1].start()
            time.sleep(0.5)
        deadline = time.monotonic() + 60
        while not any(r.status_code == 503 for r, _ in answers.values()) and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        o = httpx.post(url + "/v1/completions", json={"prompt": "Count:", "max_tokens": 5}, timeout=60)
        o_s = time.monotonic() - t0
        for t in threads:
            t.join(300)
        assert sorted(r.status_code for r, _ in answers.values()) == [200, 503], answers
        (g, g_s), = [(r, s) for r, s in answers.values() if r.status_code == 503]
        assert g.headers.get("retry-after") == "1", g.text
        assert g.json()["code"] == 503 and "max_queued_requests" in g.json()["message"]
        assert o.status_code == 503 and o.headers["retry-after"] == "1" and o.json()["error"]["code"] == 503
        assert g_s < 5 and o_s < 5  # refused at once, not after queuing (a generous bound for a loaded CI box)
        assert first == [200]
    finally:
        serve.delete(app)
