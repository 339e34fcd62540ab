"""Autoscaling the workers on token load (workers/autoscaling.py) on the session's real local cluster: a burst
of scoring work scales the workers up, they come back down after it, and no request is lost on the way down.
The policy's arithmetic is tested alone first."""

from __future__ import annotations

import random
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
from ray import serve

from tests.helpers.reference import hf_scores
from tests.helpers.serve import app_args, deploy
from workers.autoscaling import ONGOING_METRIC, TOKEN_LOAD_METRIC, TokenLoadPolicy, desired_workers

APP, PREFIX = "autoscale", "/autoscale"
TARGET_TOKENS = 500
PROMPT_LEN = 300  # tokens per scoring request of the burst


@dataclass
class Ctx:
    """The fields of Serve's AutoscalingContext that the policy reads."""

    aggregated_metrics: dict
    total_queued_requests: float = 0.0
    target_num_replicas: int = 1


def test_policy_scales_on_tokens_not_requests() -> None:
    policy = TokenLoadPolicy(target_tokens_per_worker=1000)
    # One 8,000-token request is 8 workers' work; forty 40-token requests are 2.
    assert policy(Ctx({TOKEN_LOAD_METRIC: {"r1": 8000.0}, ONGOING_METRIC: {"r1": 1.0}}))[0] == 8
    assert policy(Ctx({TOKEN_LOAD_METRIC: {"r1": 1600.0}, ONGOING_METRIC: {"r1": 40.0}}))[0] == 2
    # Requests queued at the handles count at the mean tokens per request the workers hold.
    assert policy(Ctx({TOKEN_LOAD_METRIC: {"r1": 900.0, "r2": 900.0}, ONGOING_METRIC: {"r1": 3.0, "r2": 3.0}},
                      total_queued_requests=4))[0] == 3
    # No report yet: keep the current target. Idle: as few as Serve's min_replicas allows.
    assert policy(Ctx({}, target_num_replicas=3))[0] == 3
    assert desired_workers(0, 1000) == 0
    with pytest.raises(ValueError):
        TokenLoadPolicy(0)


@dataclass
class Burst:
    url: str
    ok: int = 0
    failures: list[str] = field(default_factory=list)
    answers: list[tuple[list[int], list[float]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def client(self, stop: threading.Event, seed: int, pause_s: float = 0.0) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=180) as c:
            while not stop.is_set():
                ids = [rng.randrange(10, 40000) for _ in range(PROMPT_LEN)]
                body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0}
                try:
                    r = c.post(self.url + "/generate", json=body)
                    rows = r.json()["meta_info"]["input_token_logprobs"] if r.status_code == 200 else None
                except Exception as exc:  # a lost request: the connection or the answer broke
                    rows, r = None, exc
                with self.lock:
                    if rows is not None and len(rows) == PROMPT_LEN - 1:
                        self.ok += 1
                        self.answers.append((ids, [v for v, _ in rows]))
                    else:
                        self.failures.append(repr(r))
                stop.wait(pause_s)


def _workers() -> tuple[int, int]:
    """(running, starting) worker replicas of the app."""
    states = serve.status().applications[APP].deployments["EngineWorker"].replica_states
    count = {str(k).split(".")[-1]: v for k, v in states.items()}
    return count.get("RUNNING", 0), count.get("STARTING", 0)


def _wait_for(cond, timeout_s: float, timeline: list, t0: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running, starting = _workers()
        timeline.append((round(time.monotonic() - t0, 1), running, starting))
        if cond(running):
            return True
        time.sleep(1)
    return False


def test_burst_scales_up_then_down_without_losing_requests(serve_url: str, smollm2_path) -> None:
    # Up to 2 is the point (up on tokens, back down, nothing lost); a third replica only adds a model load and its
    # wait to the suite.
    autoscaling = {"min_replicas": 1, "max_replicas": 2, "initial_replicas": 1, "metrics_interval_s": 0.5,
                   "look_back_period_s": 2, "upscale_delay_s": 1, "downscale_delay_s": 2,
                   "policy": {"policy_function": "workers.autoscaling:TokenLoadPolicy",
                              "policy_kwargs": {"target_tokens_per_worker": TARGET_TOKENS}}}
    deploy(APP, PREFIX, app_args(worker_autoscaling=autoscaling, worker_num_cpus=0.5,
                                 worker_graceful_shutdown_timeout_s=60))
    burst, timeline, t0 = Burst(serve_url + PREFIX), [], time.monotonic()
    try:
        heavy, light = threading.Event(), threading.Event()
        # 4 clients keep ~4 x 300 tokens queued: 2.4 workers' worth at the target, so the workers go to max (2); more
        # clients only take CPU from the second replica's start and leave more queued work to drain before the way
        # down.
        threads = [threading.Thread(target=burst.client, args=(heavy, i), daemon=True) for i in range(4)]
        # One slow client keeps requests in flight while the workers scale down: none may be lost.
        threads.append(threading.Thread(target=burst.client, args=(light, 99, 0.5), daemon=True))
        for t in threads:
            t.start()
        _wait_for(lambda n: n >= 2, 150, timeline, t0)  # to max_replicas, or as far as 150 s get
        heavy.set()
        assert max(n for _, n, _ in timeline) >= 2, f"workers never scaled up: {timeline}"
        scaled_down = _wait_for(lambda n: n == 1, 120, timeline, t0)
        light.set()
        for t in threads:
            t.join(timeout=200)
        print(f"\nworker replicas over time (s, running, starting): {_compact(timeline)}")
        assert scaled_down, f"workers never came back down: {timeline}"
        assert burst.failures == [], burst.failures[:3]
        assert burst.ok > 0
        for ids, values in random.Random(0).sample(burst.answers, 2):  # exact, whichever worker answered
            assert max(abs(a - b) for a, b in zip(values, hf_scores(smollm2_path, ids, 0), strict=True)) < 1e-4
    finally:
        serve.delete(APP)


def _compact(timeline: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """Only the samples where the replica counts changed."""
    out: list[tuple[float, int, int]] = []
    for sample in timeline:
        if not out or out[-1][1:] != sample[1:]:
            out.append(sample)
    return out
