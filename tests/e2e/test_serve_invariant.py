"""Batch-invariant mode over HTTP: configs/invariant.yaml's application on the session's real Ray
cluster. A scoring request with top-k and a greedy generation return the same bits, as served in JSON, alone (cold
and warm), streamed, and amid concurrent random load (two clients), from another worker process than the first answer's.

The first answers come from a one-worker app; the rest from a second one-worker app (another process), while
random scoring and generation requests hit it and share its batches (a second worker there would only take half the
load away from the needles' batches and cost one more replica start). Resources are scaled down to the test
machine (one thread per worker: bits are the same for the same thread count and CPU)."""

from __future__ import annotations

import json
import random
import threading

import httpx
import pytest
import yaml
from ray import serve

from tests.helpers.reference import hf_scores
from tests.helpers.serve import deploy, ids_of, sse_events

NEEDLE = ids_of(300, 1717)  # longer than one attention key block
SCORE = {"input_ids": NEEDLE, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 3,
         "top_logprobs_num": 4}
GREEDY = {"input_ids": NEEDLE, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "return_logprob": True,
          "top_logprobs_num": 2}
VALUES = ("input_token_logprobs", "input_top_logprobs", "output_token_logprobs", "output_top_logprobs")


def invariant_args(**overrides: object) -> dict:
    args = yaml.safe_load(open("configs/invariant.yaml"))["applications"][0]["args"]
    assert args["batch_invariant"] is True
    args.update({"kv_cache_mb": 96, "worker_num_cpus": 0.5, "num_threads": 1, "ingress_num_cpus": 0.1, **overrides})
    return args


def served(url: str, body: dict, stream: bool = False) -> str:
    """The answer's values as JSON text (streamed: the events' values concatenated, as the contract promises)."""
    r = httpx.post(url + "/generate", json={**body, "stream": stream}, timeout=300)
    assert r.status_code == 200, r.text
    events = [e for e in sse_events(r) if e != "[DONE]"] if stream else [r.json()]
    ids = [i for e in events for i in e["output_ids"]]
    values = {k: None for k in VALUES}
    for e in events:
        for k in VALUES:
            if e["meta_info"][k] is not None:
                values[k] = (values[k] or []) + e["meta_info"][k]
    return json.dumps([ids, *values.values()])


@pytest.fixture(scope="module")
def first(serve_url: str) -> dict[str, str]:
    """The needles' first answers, from a one-worker app, on a cold cache."""
    deploy("invariant-a", "/inv-a", invariant_args(num_workers=1))
    url = serve_url + "/inv-a"
    try:
        yield {"score": served(url, SCORE), "greedy": served(url, GREEDY),
               "score warm": served(url, SCORE), "greedy warm": served(url, GREEDY),
               "score streamed": served(url, SCORE, stream=True), "greedy streamed": served(url, GREEDY, stream=True)}
    finally:
        serve.delete("invariant-a")


def test_alone_cold_warm_and_streamed(first: dict[str, str], smollm2_path) -> None:  # noqa: ANN001
    for name in ("score", "greedy"):
        assert first[f"{name} warm"] == first[name]
        assert first[f"{name} streamed"] == first[name]
    ids, _, _, out_rows, out_top = json.loads(first["greedy"])
    assert len(ids) == len(out_rows) == len(out_top) == 8 and all(len(top) == 2 for top in out_top)
    # And exact: within 1e-4 of transformers.
    _, rows, top, _, _ = json.loads(first["score"])
    assert len(top) == len(rows) and all(len(t) == 4 for t in top)
    assert [t for _, t in rows] == NEEDLE[4:]
    assert max(abs(v - w) for (v, _), w in zip(rows, hf_scores(smollm2_path, NEEDLE, 3), strict=True)) <= 1e-4


def _load(url: str, stop: threading.Event, seed: int, errors: list[str]) -> None:
    """Random scoring and generation requests, one at a time, until stopped (a bounded client)."""
    rng = random.Random(seed)
    while not stop.is_set():
        ids = (NEEDLE[:rng.randrange(1, len(NEEDLE))] if rng.random() < 0.5 else []) + ids_of(rng.randint(2, 150),
                                                                                              rng.randrange(10**6))
        if rng.random() < 0.5:
            body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True,
                    "logprob_start_len": rng.randrange(len(ids) - 1), "top_logprobs_num": rng.choice([0, 3])}
        else:
            body = {"input_ids": ids, "max_tokens": rng.randint(1, 8), "temperature": rng.choice([0.0, 1.0])}
        r = httpx.post(url + "/generate", json=body, timeout=300)
        if r.status_code != 200:
            errors.append(r.text)


def test_amid_concurrent_load_on_other_workers(first: dict[str, str], serve_url: str) -> None:
    deploy("invariant-b", "/inv-b", invariant_args(num_workers=1))
    url = serve_url + "/inv-b"
    stop, errors = threading.Event(), []
    load = [threading.Thread(target=_load, args=(url, stop, seed, errors)) for seed in range(2)]
    try:
        for t in load:
            t.start()
        got = []
        for i in range(2):  # cold on its worker first, then warm; streamed or not
            got += [("score", served(url, SCORE, stream=i == 1)), ("greedy", served(url, GREEDY, stream=i == 0))]
    finally:
        stop.set()
        for t in load:
            t.join()
        serve.delete("invariant-b")
    assert errors == []
    assert [name for name, text in got if text != first[name]] == []


# A short scoring request and a short greedy generation: alone their steps have few rows; beside 60-180-token
# prompts, 57-255 rows (where MKL computed a row otherwise on an AVX-512 Xeon at 2 threads), or over 256.
SHORT = ids_of(24, 2424)
SHORT_SCORE = {"input_ids": SHORT, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0,
               "top_logprobs_num": 3}
SHORT_GREEDY = {"input_ids": SHORT, "max_tokens": 8, "temperature": 0.0, "ignore_eos": True, "return_logprob": True,
                "top_logprobs_num": 2}


def test_short_requests_beside_mid_sized_prefills_at_two_threads(serve_url: str) -> None:
    deploy("invariant-c", "/inv-c", invariant_args(num_workers=1, num_threads=2, max_num_batched_tokens=2048))
    url = serve_url + "/inv-c"
    rng = random.Random(60)
    try:
        alone = {"score": served(url, SHORT_SCORE), "greedy": served(url, SHORT_GREEDY)}
        got, errors = [], []
        for sizes in ([60], [120], [180], [60, 90], [150, 170, 120]):
            def prefill(n: int, seed: int) -> None:
                body = ({"input_ids": ids_of(n, seed), "max_tokens": 0, "return_logprob": True,
                         "logprob_start_len": 0} if seed % 2 else
                        {"input_ids": ids_of(n, seed), "max_tokens": 4, "temperature": 0.0, "ignore_eos": True})
                r = httpx.post(url + "/generate", json=body, timeout=300)
                if r.status_code != 200:
                    errors.append(r.text)

            def needle(name: str, body: dict) -> None:
                got.append((name, served(url, body)))

            threads = [threading.Thread(target=prefill, args=(n, rng.randrange(10**6))) for n in sizes]
            threads += [threading.Thread(target=needle, args=("score", SHORT_SCORE)),
                        threading.Thread(target=needle, args=("greedy", SHORT_GREEDY))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        serve.delete("invariant-c")
    assert errors == []
    assert len(got) == 10 and [name for name, text in got if text != alone[name]] == []
