"""The worker deployment's deployment-scoped actors (Ray Serve's `deployment_actors`: deploy/app.py declares them),
found by name from inside the deployment: the weight registry and the adapter registry."""

from __future__ import annotations

import time
from typing import Any

# How long a replica looks for one: Serve starts deployment actors before replicas, and recreates one that failed
# its health checks within seconds.
FIND_TIMEOUT_S = 60.0


def deployment_actor(name: str, timeout_s: float = FIND_TIMEOUT_S) -> Any:
    """A fresh handle on the actor `name` (one held across Serve's recreation of it would point at the old one)."""
    from ray import serve

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return serve.get_deployment_actor(name)
        except ValueError:  # not created yet, or being recreated
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)
