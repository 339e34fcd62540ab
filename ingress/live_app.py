"""The ingress's ASGI app, replaceable while it serves: Serve's `reconfigure` (a changed `user_config`) swaps in an
app built on the new settings without restarting the replica. Requests already in the old app finish there.

The settings are frozen data threaded through every route, middleware and lifecycle at build time (app.py), so a
change is a rebuild rather than a mutation; a rebuild costs a few milliseconds and happens only on a redeploy.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

from fastapi import FastAPI
from starlette.types import Receive, Scope, Send

from ingress.settings import IngressSettings

# Not settable through the ingress's user_config: the keys are secrets (args or the environment, read at start) and
# who may use the admin routes is decided with them, and
# the two logprob limits are the workers' runtime settings (their user_config: one place), which the ingress checks
# as the workers report them (ModelInfo).
WORKERS_FIELDS = frozenset({"max_top_logprobs", "max_logprob_entries"})
NOT_RUNTIME = frozenset({"api_keys", "admin_api_keys", "open_admin_routes"}) | WORKERS_FIELDS
RUNTIME_FIELDS = tuple(f.name for f in dataclasses.fields(IngressSettings) if f.name not in NOT_RUNTIME)
UNKNOWN_FIELD = ("user_config field `{name}` is not a runtime setting of the ingress; these are: {fields} (every "
                 "other setting is an `args` field, and changing it restarts the replicas).")
WORKERS_FIELD = ("user_config field `{name}` is a runtime setting of the workers: set it in the EngineWorker "
                 "deployment's user_config (the ingress checks requests against the workers' value).")


def runtime_settings(base: IngressSettings, user_config: Mapping[str, Any] | None) -> IngressSettings:
    """`base` (the app's `args`) with user_config's fields in its place; ValueError for an unknown or invalid field
    (Serve then reports the deploy as failed and the replicas keep their settings)."""
    changes = dict(user_config or {})
    for name in changes:
        if name in WORKERS_FIELDS:
            raise ValueError(WORKERS_FIELD.format(name=name))
        if name not in RUNTIME_FIELDS:
            raise ValueError(UNKNOWN_FIELD.format(name=name, fields=", ".join(RUNTIME_FIELDS)))
    return dataclasses.replace(base, **changes)


class LiveApp:
    """Calls the current FastAPI app. Serve adds its exception handlers through `add_exception_handler` once; they
    are kept and added to every later app too."""

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self._handlers: list[tuple[Any, Callable[..., Any]]] = []

    def add_exception_handler(self, exc: Any, handler: Callable[..., Any]) -> None:
        self._handlers.append((exc, handler))
        self.app.add_exception_handler(exc, handler)

    def replace(self, app: FastAPI) -> None:
        for exc, handler in self._handlers:
            app.add_exception_handler(exc, handler)
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)
