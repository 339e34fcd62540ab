"""The e2e behaviours through the front door `make serve` starts (Ray Serve's HAProxy ingress, throughput-optimized
data plane, the header guard), on a real local Ray of its own (tests/helpers/haproxy_cluster.py in a subprocess:
a process holds one Ray): exact scoring, request ids, API keys, streaming, a request longer than the header timeout,
abort on disconnect; no 5xx for header bytes; headers bounded; an idle connection and a trickled header cut within
header_timeout_s; Serve's /-/routes closed without a key, /-/healthz open; one X-Request-ID in every answer;
a 414 and a 431 in JSON for a path and headers over their limits within HAProxy's buffer; and after a reload and the
stop, no HAProxy process left and no port listening."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.haproxy_cluster import HEADER_TIMEOUT_S, after_stop


@pytest.fixture(scope="module")
def facts(smollm2_path: Path) -> dict:
    env = {**os.environ, "RAYSCORE_MODEL_PATH": str(smollm2_path), "RAYSCORE_CACHE_DIR": str(smollm2_path.parent),
           "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ["PYTHONPATH"]])}
    for name in ("RAY_ADDRESS", "RAYSCORE_FRONT_DOOR"):
        env.pop(name, None)
    run = subprocess.run([sys.executable, "-m", "tests.helpers.haproxy_cluster"], env=env, capture_output=True,
                         text=True, timeout=600)
    line = next((x for x in run.stdout.splitlines() if x.startswith("FACTS ")), None)
    assert line is not None, f"rc={run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-5000:]}"
    got = json.loads(line[len("FACTS "):])
    got["lifetime"] = _lifetime(run)
    print(got)
    return got


def _lifetime(run: subprocess.CompletedProcess) -> dict | str:
    """The script's own look at what outlived Serve and Ray; when Ray's shutdown ended the script before it looked
    (its core worker may end the process there), the same look taken here, on the config and ports it announced."""
    lines = run.stdout.splitlines()
    after = next((x for x in lines if x.startswith("LIFETIME ")), None)
    if after is not None:
        return json.loads(after[len("LIFETIME "):])
    stopping = next((x for x in lines if x.startswith("STOPPING ")), None)
    if stopping is None:
        return f"rc={run.returncode}\n{run.stderr[-3000:]}"
    known = json.loads(stopping[len("STOPPING "):])
    ray_pids = {int(p): start for p, start in known["ray_pids"].items()}
    left = after_stop(known["config"], known["ports"], known["ray_dir"], ray_pids)
    return {"haproxy_started": known["haproxy_started"], **left, "script_rc": run.returncode}


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
        # A request id Serve could not decode is replaced by the guard (one id in the answer), others are a 400.
        assert (" 200 " if name == "X-Request-ID" else " 400 ") in status + " ", (name, status)
    # Refused (HAProxy's 400 once its buffer is full), or the connection reset while the client was still sending.
    assert facts["big_headers"] == "reset" or facts["big_headers"].split(" ")[1] in ("400", "431")


def test_idle_connection_cut_within_the_header_timeout(facts: dict) -> None:
    status, seconds = facts["idle"]
    assert "408" in status and seconds <= HEADER_TIMEOUT_S + 2


def test_a_trickled_header_is_cut_at_the_header_timeout_in_total(facts: dict) -> None:
    # One header line every 1.5 s: each gap inside the client timeout, the whole header phase bounded by the shim's
    # `timeout http-request` (deploy/haproxy_shim.py).
    status, seconds = facts["trickle"]
    assert "408" in status and HEADER_TIMEOUT_S - 0.5 <= seconds <= HEADER_TIMEOUT_S + 2, (status, seconds)


def test_serve_routes_need_a_key_the_health_probe_does_not(facts: dict) -> None:
    # HAProxy answers /-/routes itself: the shim's rule in front of it asks for a key; /-/healthz stays open.
    assert facts["routes"] == 401 and facts["routes_wrong_key"] == 401 and facts["routes_key"] == 200
    assert " 401 " in facts["routes_bad_bytes"] + " "
    assert facts["healthz"] == 200


def test_an_oversized_path_gets_an_answer(facts: dict) -> None:
    """HAProxy's buffer (max(64 KiB, max_url_bytes + max_header_bytes + 2 KiB), deploy/front_door.py) holds the
    abuse probe's 60,000-byte path: the guard answers a target over max_url_bytes (8,192) with its JSON 414 naming the
    field; a request line past the buffer is HAProxy's own 400 (it has no 414), an answer either way."""
    paths = facts["long_paths"]
    assert paths["8000"][0].startswith("HTTP/1.1 401 "), paths["8000"]  # within the limit: the app's key check
    for n in ("15000", "60000"):
        status, body = paths[n]
        assert status.startswith("HTTP/1.1 414 "), (n, status, body[:200])
        message = json.loads(body)["error"]["message"]
        assert "`max_url_bytes`" in message and "aaaa" not in message, message
    assert paths["200000"][0].startswith("HTTP/1.1 400 "), paths["200000"]


def test_oversized_headers_within_the_buffer_are_the_guards_431(facts: dict) -> None:
    status, body = facts["headers_431"]
    assert status.startswith("HTTP/1.1 431 ") and "`max_header_bytes`" in json.loads(body)["error"]["message"], (
        status, body[:200])


def test_one_request_id_in_every_answer(facts: dict) -> None:
    """The client's id when short and plain; otherwise one made id in its place, never the raw value beside it."""
    for value, (status, ids) in facts["request_ids"].items():
        assert " 200 " in status + " " and len(ids) == 1, (value, status, ids)
        assert (ids[0] == "front-2") if value == "b'front-2'" else (len(ids[0]) == 32 and ids[0] not in value)


def test_nothing_of_haproxy_outlives_the_app(facts: dict) -> None:
    """HAProxy reloaded once (a second ingress replica), then Serve shut down and Ray stopped: no HAProxy of this run
    (first start or reload) is alive and none of its ports listens, so a next start binds them; and no process of
    that Ray is left, found by its temp dir or by the pids it had before the stop (its agents rename themselves and
    outlive a driver that ends inside `ray.shutdown`: the stop ends them, `ray_left_by_ray` lists them)."""
    life = facts["lifetime"]
    assert isinstance(life, dict), life
    assert life["haproxy_started"] >= 2 and len(life["recorded"]) >= 2, life
    assert life["alive"] == [] and life["listening"] == [] and life["ray_left"] == [], life
