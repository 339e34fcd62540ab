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
    cfg = AppConfig.model_validate(app_args(num_workers=1))
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
        # Long enough to still run when the refused requests arrive: seconds on any CPU. Ids, not text: the held
        # requests reach the worker without the ingress's tokenizer in between. The first is streamed and its
        # first event awaited, so it surely holds the worker's one slot before the second takes the queue place.
        long = {"input_ids": [504, 3458, 282, 4649, 314], "max_tokens": 250, "ignore_eos": True}
        held: list[int] = []
        running = threading.Event()

        def streamed() -> None:
            with httpx.stream("POST", url + "/generate", json={**long, "stream": True}, timeout=300) as r:
                for _ in r.iter_lines():
                    running.set()
                held.append(r.status_code)

        def unary() -> None:
            held.append(httpx.post(url + "/generate", json=long, timeout=300).status_code)

        threads = [threading.Thread(target=streamed), threading.Thread(target=unary)]
        threads[0].start()
        assert running.wait(120), "the first held request never started"
        threads[1].start()
        time.sleep(1.0)  # the second reaches Serve's queue (the ingress forwards ids at once)
        refused = []
        for path, body in (("/generate", long), ("/v1/completions", {"prompt": "Count:", "max_tokens": 5})):
            t0 = time.monotonic()
            r = httpx.post(url + path, json=body, timeout=60)
            refused.append((r, time.monotonic() - t0))
        for t in threads:
            t.join(300)
        (g, g_s), (o, o_s) = refused
        assert g.status_code == 503 and g.headers.get("retry-after") == "1", g.text
        assert g.json()["code"] == 503 and "max_queued_requests" in g.json()["message"]
        assert o.status_code == 503 and o.headers["retry-after"] == "1" and o.json()["error"]["code"] == 503
        assert g_s < 5 and o_s < 5  # refused at once, not after queuing (a generous bound for a loaded CI box)
        assert held == [200, 200]
    finally:
        serve.delete(app)
