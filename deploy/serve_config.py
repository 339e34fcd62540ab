"""The Serve config (what `serve run` / `serve deploy` read, and a RayService's serveConfigV2) for an application's
`args:`: configs/local.yaml's shape, on the host and port asked for. `rayscore config` prints it, `rayscore serve`
runs it, and deploy/kubernetes/rayservice.yaml embeds it (tests/deploy/test_kubernetes.py holds them equal)."""

from __future__ import annotations

import copy
import ipaddress
from typing import Any

import yaml

from deploy.config import AppConfig

APP_NAME = "rayscore"
IMPORT_PATH = "deploy.app:build_app"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
# Serve's proxy closes a keep-alive connection idle this long (its default, 90 s, lets idle clients pile up).
KEEP_ALIVE_TIMEOUT_S = 5


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def serve_config(args: dict[str, Any], host: str | None = None, port: int | None = None,
                 base: dict[str, Any] | None = None) -> dict[str, Any]:
    """`args` (AppConfig's fields; checked here, ValueError naming the field) as a Serve config: `base`'s (a Serve
    config file's, its first application's args updated) or a new one with one application at /. A proxy on every
    node unless the server listens on loopback only (then one, on the head, as configs/local.yaml)."""
    if base is None:
        host = host or DEFAULT_HOST
        config: dict[str, Any] = {
            "proxy_location": "HeadOnly" if _loopback(host) else "EveryNode",
            "http_options": {"host": host, "port": port or DEFAULT_PORT, "keep_alive_timeout_s": KEEP_ALIVE_TIMEOUT_S},
            "logging_config": {"enable_access_log": False},
            "applications": [{"name": APP_NAME, "route_prefix": "/", "import_path": IMPORT_PATH, "args": {}}],
        }
    else:
        config = copy.deepcopy(base)
        if not config.get("applications"):
            raise ValueError("the --config file has no `applications:`")
        http = config.setdefault("http_options", {})
        if host is not None:
            http["host"] = host
        if port is not None:
            http["port"] = port
    app = config["applications"][0]
    merged = {**(app.get("args") or {}), **args}
    AppConfig.model_validate(merged)  # pydantic's ValidationError (a ValueError) names the field
    app["args"] = merged
    return config


def dump(config: dict[str, Any]) -> str:
    """The config as YAML, keys in the order written (so a printed config reads like configs/*.yaml)."""
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)
