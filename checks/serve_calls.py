"""Worker calls per HTTP request, read from Serve's own counters on the Prometheus page of Ray's metrics agent
(`ray.init(_metrics_export_port=...)`): the check behind "one HTTP request, one worker call".

Serve counts each call a replica finishes in `serve_deployment_request_counter` (and the ones that raised, or were
cancelled, in `serve_deployment_error_counter`), tagged with the deployment, the application and the `route` of the
request context the call was made in; Prometheus shows them with Ray's `ray_` prefix and the `_total` suffix.
Serve's proxy counts the HTTP requests in `serve_num_http_requests`. A worker call the ingress makes while serving
an HTTP request carries that request's route (behind Serve's proxy: the app's route prefix; behind HAProxy: the
matched path); the ingress's own traffic (the model-info refresh, the tokenizer warm-up) runs outside any request
context and carries route "", as does a driver's handle call. So "calls for requests" are the calls of every route
but "", and "other calls" the rest; the bound counts both (`Counts.all_calls`): the model-info refresh happens only
when an answer's model-info version differs from the ingress's copy, or after long without answers.

The replicas hand their counts to the agent every `metrics_report_interval_ms` (a Ray system config; the test
cluster lowers it to 1 s), so a read waits until the page has stopped moving.
"""

from __future__ import annotations

import json
import re
import time
import urllib.request
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import httpx

WORKER = "EngineWorker"
CALLS = ("ray_serve_deployment_request_counter_total", "ray_serve_deployment_error_counter_total")
HTTP = "ray_serve_num_http_requests_total"
COUNTED = (*CALLS, HTTP)  # what `counts` reads
_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

Samples = dict[str, list[tuple[dict[str, str], float]]]
# The routes of issue 41's bound (at most 1.05 worker calls per HTTP request), by name: the tests and the bench send
# these bodies.
BOUND = ("/v1/completions, 8 text prompts, echo + logprobs", "/v1/chat/completions, streamed, 32 tokens",
         "/generate (SGLang), text, 8 tokens", "/v1/score, 3 items x 2 labels")
# A streamed request of several prompts: one generate_many call (workers/many.py).
STREAMED_MANY = "/v1/completions, streamed, 4 text prompts, 16 tokens"


def routes(model: str, text: str, ids48: list[int]) -> dict[str, tuple[str, dict[str, Any]]]:
    """Route name -> (path, body): BOUND's routes, then the two shapes of the bench's 48-token requests (`text`
    its 48 tokens as text to /v1/completions, `ids48` as ids to /generate)."""
    return {
        BOUND[0]: ("/v1/completions", {
            "model": model, "prompt": [f"{text[:80]} ({i})" for i in range(8)], "max_tokens": 2, "echo": True,
            "logprobs": 2, "temperature": 0}),
        BOUND[1]: ("/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": text[:120]}], "max_tokens": 32,
            "ignore_eos": True, "stream": True, "logprobs": True, "top_logprobs": 2, "temperature": 0}),
        BOUND[2]: ("/generate", {
            "text": text[:120], "sampling_params": {"max_new_tokens": 8, "temperature": 0},
            "return_logprob": True, "return_text_in_logprobs": True}),
        BOUND[3]: ("/v1/score", {
            "query": text[:80], "items": [" yes", " no", " maybe"], "label_token_ids": [1, 2]}),
        STREAMED_MANY: ("/v1/completions", {
            "model": model, "prompt": [f"{text[:80]} ({i})" for i in range(4)], "max_tokens": 16,
            "ignore_eos": True, "stream": True, "logprobs": 1, "temperature": 0}),
        "/v1/completions, 48-token text, scoring": ("/v1/completions", {
            "model": model, "prompt": text, "max_tokens": 0, "echo": True, "logprobs": 0}),
        "/generate, 48 ids, scoring": ("/generate", {
            "input_ids": ids48, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}),
    }


def post(client: httpx.Client, url: str, body: dict[str, Any]) -> Any:
    """One request, read to its end (a stream's every event); its JSON answer (a stream's last event). A failure
    raises."""
    if body.get("stream"):
        with client.stream("POST", url, json=body) as r:
            r.raise_for_status()
            events = [line for line in r.iter_lines() if line.startswith("data: {")]
        assert events, "a stream without events"
        return json.loads(events[-1][6:])
    r = client.post(url, json=body)
    r.raise_for_status()
    return r.json()


def scrape(url: str, names: tuple[str, ...] = ("",)) -> Samples:
    """A Prometheus text page as {metric name: [(labels, value), ...]}; with `names`, of the metrics whose names
    start so only (a page late in a session holds every replica's series since it began: `settled` reads it twice a
    second and parses only the counters it needs)."""
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: Samples = defaultdict(list)
    for line in text.splitlines():
        if not line.startswith(names):
            continue
        m = _SAMPLE.match(line)
        if m and not line.startswith("#"):
            out[m.group(1)].append((dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))))
    return out


@dataclass(frozen=True)
class Counts:
    """Serve's counters of one application at one moment."""

    request_calls: int  # worker calls made while serving an HTTP request (route tag not empty)
    other_calls: int  # worker calls made outside any request (route tag ""): the ingress's own traffic
    http_requests: int  # HTTP requests Serve's proxy answered (0 behind HAProxy, whose proxy is not Serve's)

    @property
    def all_calls(self) -> int:
        """Every worker call, the ingress's own included: what the bound of at most 1.05 per HTTP request counts."""
        return self.request_calls + self.other_calls

    def minus(self, before: Counts) -> Counts:
        return Counts(self.request_calls - before.request_calls, self.other_calls - before.other_calls,
                      self.http_requests - before.http_requests)


def counts(samples: Samples, app: str, deployment: str = WORKER) -> Counts:
    calls = {True: 0.0, False: 0.0}
    for name in CALLS:
        for labels, value in samples.get(name, []):
            if labels.get("application") == app and labels.get("deployment") == deployment:
                calls[labels.get("route", "") != ""] += value
    http = sum(v for lab, v in samples.get(HTTP, []) if lab.get("application") == app)
    return Counts(int(calls[True]), int(calls[False]), int(http))


def settled(url: str, app: str, interval_s: float, http_requests: int = 0, timeout_s: float = 120.0) -> Counts:
    """The app's counts once the proxy has counted at least `http_requests` and the page has then shown the same
    counts for a report interval and a second: a worker call ends before its HTTP request does, so once the proxy's
    count shows a request, the worker's call shows within an interval (and 0.1 s: Serve's own batching of counts)."""
    deadline = time.monotonic() + timeout_s
    last, since = counts(scrape(url, COUNTED), app), time.monotonic()
    while time.monotonic() - since < interval_s + 1.0 or last.http_requests < http_requests:
        if time.monotonic() > deadline:
            raise TimeoutError(f"Serve's counters of {app} still moving after {timeout_s:.0f} s: {last}")
        time.sleep(min(0.5, interval_s / 2))
        now = counts(scrape(url, COUNTED), app)
        if now != last:
            last, since = now, time.monotonic()
    return last


def report_interval_s() -> float:
    """The export interval of this Ray (the driver's copy of the cluster's system config); Ray exports at most once
    a second."""
    import ray

    return max(1.0, ray._config.metrics_report_interval_ms() / 1000)
