"""Prefix-aware routing end to end on the session cluster: the same context lands on the same worker."""

from __future__ import annotations

import random
from collections import Counter

import httpx
import pytest

from tests.helpers.serve import ids_of

# --- end to end on the session cluster --------------------------------------------------------------

APP, PREFIX = "router", "/router"
CTX_LEN = 80  # 5 blocks of 16


def score(url: str, ids: list[int]) -> dict:
    body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": CTX_LEN - 1}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def finished_by_pid() -> Counter:
    from tests.helpers.serve import worker_stats

    stats = worker_stats(APP)
    assert len(stats) == 2, stats
    return Counter({pid: s.requests_finished for pid, s in stats.items()})


@pytest.mark.timeout(300)
def test_same_context_lands_on_same_worker(serve_url: str) -> None:
    from ray import serve

    from tests.helpers.serve import app_args, deploy

    deploy(APP, PREFIX, app_args(num_workers=2, kv_cache_mb=64, worker_num_cpus=0.5, num_threads=1,
                                 prefix_aware_routing=True))
    url = serve_url + PREFIX
    try:
        contexts = [ids_of(CTX_LEN, 10 + c) for c in range(4)]
        endings = [ids_of(8, 20 + e) for e in range(4)]
        cached: list[int] = []
        # Pass 1, one context at a time: which worker took it, all four requests of it.
        placement: dict[int, int] = {}
        before = finished_by_pid()
        for c, ctx in enumerate(contexts):
            cached += [score(url, ctx + end)["cached_tokens"] for end in endings]
            after = finished_by_pid()
            grew = {pid: n for pid, n in (after - before).items() if n}
            assert list(grew.values()) == [len(endings)], f"context {c} spread over workers: {grew}"
            placement[c] = next(iter(grew))
            before = after
        assert len(set(placement.values())) == 2, placement  # new contexts go to the emptier worker

        # Pass 2, interleaved: every request follows its context.
        order = [c for c in range(4) for _ in range(2)]
        random.Random(1).shuffle(order)
        pass2 = [score(url, contexts[c] + ids_of(8, 30 + i))["cached_tokens"] for i, c in enumerate(order)]
        grew = finished_by_pid() - before
        assert grew == Counter(placement[c] for c in order)

        # Once the engine has a prefix cache, every follow-up reuses the context's blocks (scoring from
        # position 79 reuses what lies before it: 4 full blocks).
        if any(cached + pass2):
            assert all(n >= 64 for n in pass2), pass2
    finally:
        serve.delete(APP)
