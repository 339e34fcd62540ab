"""The e2e behaviours through the front door `make serve` starts (Ray Serve's HAProxy ingress, throughput-optimized
data plane, the header guard), on a real local Ray of its own (tests/helpers/haproxy_cluster.py in a subprocess:
a process holds one Ray): exact scoring, request ids, API keys, streaming, a request longer than the header timeout,
abort on disconnect; no 5xx for header bytes; headers bounded; an idle connection cut within header_timeout_s."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.haproxy_cluster import HEADER_TIMEOUT_S


@pytest.fixture(scope="module")
def facts(smollm2_path: Path) -> dict:
    env = {**os.environ, "RAYSCORE_MODEL_PATH": str(smollm2_path), "RAYSCORE_CACHE_DIR": str(smollm2_path.parent),
           "PYTHONPATH": os.getcwd()}
    for name in ("RAY_ADDRESS", "RAYSCORE_FRONT_DOOR"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, "-m", "tests.helpers.haproxy_cluster"], env=env, capture_output=True,
                         text=True, timeout=600)
    line = next((x for x in run.stdout.splitlines() if x.startswith("FACTS ")), None)
    assert line is not None, f"rc={run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    got = json.loads(line[len("FACTS "):])
    print(got)
    return got


def test_the_front_door_is_haproxy(facts: dict) -> None:
    assert "HAProxy ingress" in facts["front_door"]


def test_scoring_ids_keys_and_streaming_hold(facts: dict) -> None:
    status, rid, err = facts["score"]
    assert status == 200 and rid == "front-1" and err <= 1e-4
    assert facts["no_key"] == 401 and facts["weight_version"] == "default"
    assert facts["stream"][:2] == [True, True]
    assert facts["long_request"][0] == 200 and facts["long_request"][1] > HEADER_TIMEOUT_S
    assert facts["aborted"]


def test_no_header_value_is_a_5xx(facts: dict) -> None:
    for name, status in facts["headers"].items():
        assert " 400 " in status + " ", (name, status)
    # Refused (HAProxy's 400 once its buffer is full), or the connection reset while the client was still sending.
    assert facts["big_headers"] == "reset" or facts["big_headers"].split(" ")[1] in ("400", "431")


def test_idle_connection_cut_within_the_header_timeout(facts: dict) -> None:
    status, seconds = facts["idle"]
    assert "408" in status and seconds <= HEADER_TIMEOUT_S + 2


def test_serve_routes(facts: dict) -> None:
    # HAProxy answers /-/routes itself (a map of route prefixes to app names) whatever the keys: documented in
    # docs/operating-front-door.md; the guard closes it on the Python proxy.
    assert facts["healthz"] == 200 and facts["routes"] == 200
