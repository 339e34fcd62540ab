"""The peer bench's bodies (bench/serving/peer_load.py) on the session's shared app: each rayscore route it times
scores every prompt row, and the three routes' rows are the same values; an answer short of rows fails the phase
(the bench never times a route that skipped work)."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from bench.serving import peer_load
from bench.serving.peer_load import ROUTES
from tests.helpers.serve import ids_of, shared_app


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    return shared_app(serve_url)


def test_every_route_scores_every_row_alike(url: str) -> None:
    ids = ids_of(24, 51)
    with httpx.Client(timeout=120) as client:
        model = client.get(url + "/v1/models").json()["data"][0]["id"]
        rows = {}
        for key, route in ROUTES.items():
            r = client.post(url + route.path, json=route.body(ids, model, 0))
            assert r.status_code == 200, (key, r.text)
            rows[key] = route.rows(r.json())
    assert all(len(v) == len(ids) - 1 for v in rows.values()), {k: len(v) for k, v in rows.items()}
    for key in ("completions", "token"):
        assert max(abs(a - b) for a, b in zip(rows[key], rows["generate"], strict=True)) <= 1e-4, key
    # A phase on 2 clients: every answer checked; a route whose answers fall short of the rows fails it.
    warm, timed = [ids_of(12, 1)], [ids_of(12, s) for s in (2, 3, 4)]
    phase = peer_load.run_phase(url, ROUTES["token"], model, warm, timed, 2, lambda: {"x": 0.0})
    assert phase.tokens_per_s > 0 and phase.cpu_ms == {"x": 0.0}
    short = dataclasses.replace(ROUTES["generate"], rows=lambda answer: [0.0])
    with pytest.raises(RuntimeError, match="1 prompt rows scored of a 12-token prompt's 11"):
        peer_load.run_phase(url, short, model, [], timed[:1], 1, dict)
