"""HandleBackend: the one real Backend (ingress/backend.py), over the worker deployment's handle: the worker client,
this replica's text side and the admin side, each its own class, joined here."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingress.transport.admin_client import AdminClient
from ingress.transport.text_client import TextClient
from ingress.transport.worker_client import WorkerClient

if TYPE_CHECKING:
    from ray.serve.handle import DeploymentHandle


class HandleBackend(WorkerClient, TextClient, AdminClient):
    """Backend over the worker deployment: one worker call per HTTP request; text never costs one."""

    def __init__(self, worker: DeploymentHandle, ready_timeout_s: float = 5.0, weight_updates: bool = False,
                 coalesce_max_in_flight: int = 0, coalesce_max_tokens: int = 2048,
                 model_info_ttl_s: float | None = None) -> None:
        WorkerClient.__init__(self, worker, self.tokenizer, ready_timeout_s, coalesce_max_in_flight,
                              coalesce_max_tokens, model_info_ttl_s)
        TextClient.__init__(self, self.model_info)
        AdminClient.__init__(self, worker, weight_updates)

    async def ready(self) -> bool:
        """True when at least one worker answers (then the tokenizer loads in the background: TextClient.warm)."""
        if not await WorkerClient.ready(self):
            return False
        self.warm()
        return True
