"""API keys: where they come from, how a request proves one, and when a server may run without any.

Keys come from the config (`api_keys`) and from the environment variable RAYSCORE_API_KEYS (comma-separated,
so secrets can stay out of YAML); either or both. A request proves a key with `Authorization: Bearer <key>`
(what OpenAI clients and lm-eval send). Keys are compared in constant time, and no message or log line of
this module ever holds a key or the header's value.
"""

from __future__ import annotations

import dataclasses
import hmac
import ipaddress
from collections.abc import Iterable, Mapping

from ingress.errors import Unauthorized
from ingress.settings import IngressSettings

ENV_VAR = "RAYSCORE_API_KEYS"
ADMIN_ENV_VAR = "RAYSCORE_ADMIN_API_KEYS"
MISSING = "This server requires an API key: send `Authorization: Bearer <key>`."
INVALID = "The API key is not valid for this server."


# Routes that change what every worker serves (ingress/weights/routes.py, ingress/weights/control.py and the adapter
# routes).
ADMIN_PATHS = frozenset({"/update_weights_from_disk", "/flush_cache", "/pause_generation", "/continue_generation",
                         "/abort_request", "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/load_lora_adapter",
                         "/unload_lora_adapter"})
ADMIN_ONLY = ("This route changes the served weights, adapters, caches or generation: it needs an admin key "
              "(config field `admin_api_keys` or $RAYSCORE_ADMIN_API_KEYS); an API key does not open it.")
ADMIN_CLOSED = ("This route changes the served weights, adapters, caches or generation, and this server has no admin "
                "key: set `admin_api_keys` (or $RAYSCORE_ADMIN_API_KEYS) and send one, or set `open_admin_routes: "
                "true` to open the admin routes on a trusted network.")


def resolve_keys(config_keys: Iterable[str] | None, environ: Mapping[str, str], var: str = ENV_VAR
                 ) -> tuple[str, ...]:
    """The config's keys and the environment's, without blanks or duplicates, in order."""
    from_env = environ.get(var, "").split(",")
    keys = [k.strip() for k in [*(config_keys or ()), *from_env]]
    return tuple(dict.fromkeys(k for k in keys if k))


def check_authorization(header: str | None, keys: tuple[str, ...]) -> None:
    """Return when `header` (the Authorization value) holds one of `keys`; raise Unauthorized otherwise.

    Every key is compared, whatever matched, so the time taken tells nothing about which key or how much
    of one matched; hmac.compare_digest does each comparison in constant time.
    """
    if not keys:
        return
    scheme, _, token = (header or "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise Unauthorized(MISSING)
    given = token.strip().encode()
    matched = False
    for key in keys:
        matched |= hmac.compare_digest(given, key.encode())
    if not matched:
        raise Unauthorized(INVALID)


def check_admin(header: str | None, settings: IngressSettings) -> None:
    """The admin routes: an admin key opens them, never a plain API key (401 naming the field). With no admin key
    configured they are closed, unless `open_admin_routes` opens them to whoever passes the API-key check."""
    if not settings.admin_api_keys:
        if not settings.open_admin_routes:
            raise Unauthorized(ADMIN_CLOSED)
        check_authorization(header, settings.api_keys)
        return
    try:
        check_authorization(header, settings.admin_api_keys)
    except Unauthorized as exc:
        raise Unauthorized(ADMIN_ONLY) from exc


def is_loopback(host: str) -> bool:
    """Whether binding `host` exposes the server to this machine only (127.0.0.0/8, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a hostname or an interface name: it may well be reachable from elsewhere


def check_exposure(host: str | None, keys: tuple[str, ...], allow_unauthenticated: bool) -> None:
    """Refuse to serve a non-loopback address without keys unless the config says so explicitly.

    `host` None means the bind address could not be found out: treated as exposed (fail closed).
    """
    if keys or allow_unauthenticated or (host is not None and is_loopback(host)):
        return
    where = f"binds {host}" if host is not None else "binds an address that could not be determined"
    raise RuntimeError(
        f"rayscore refuses to start: the server {where}, which other machines can reach, and has no API key. "
        f"Set `api_keys` in the app's args or the environment variable {ENV_VAR} (comma-separated), or declare "
        "`allow_unauthenticated: true` in the app's args to serve without authentication on purpose.")


def with_keys(settings: IngressSettings, environ: Mapping[str, str], host: str | None,
              allow_unauthenticated: bool) -> IngressSettings:
    """`settings` with the environment's keys added, once the exposure rule allows serving at all (raises
    RuntimeError otherwise). Run where the ingress runs: the keys of its environment stay in its process."""
    keys = resolve_keys(settings.api_keys, environ)
    admin = resolve_keys(settings.admin_api_keys, environ, ADMIN_ENV_VAR)
    check_exposure(host, keys, allow_unauthenticated)
    return dataclasses.replace(settings, api_keys=keys, admin_api_keys=admin)
