"""The name a Serve replica goes by in metrics, for both deployments (ingress and worker): no engine here, so
the ingress may import it beside the carriers."""

from __future__ import annotations

import os


def replica_label() -> str:
    """`app#deployment#id` of the Serve replica this runs in; the pid outside Serve (tests, scripts)."""
    try:
        from ray import serve

        rid = serve.get_replica_context().replica_id
        return f"{rid.deployment_id.app_name}#{rid.deployment_id.name}#{rid.unique_id}"
    except Exception:  # not inside a replica
        return f"pid-{os.getpid()}"
