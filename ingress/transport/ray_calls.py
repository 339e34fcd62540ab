"""Calls through the worker deployment's handle: Ray's and Serve's errors as the ingress's, and the handle a call of
one LoRA adapter goes through. Ray is imported only when an error is translated: the ingress's unit tests never
need it."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from ingress.errors import Overloaded, WorkerLost, worker_failed
from protocol import GenerateRequest

if TYPE_CHECKING:  # Ray is only needed once a handle exists; tests of the routes never import it.
    from ray.serve.handle import DeploymentHandle


def translated(exc: Exception) -> Exception:
    """Ray's error for a replica that died or became unreachable (RayActorError: ActorDiedError,
    ActorUnavailableError, also when a RayTaskError carries one) -> WorkerLost; Serve's BackPressureError
    (max_queued_requests) -> Overloaded with its Retry-After; anything else unchanged."""
    from ray.exceptions import RayActorError
    from ray.serve.exceptions import BackPressureError

    cause = getattr(exc, "cause", None)
    if isinstance(exc, RayActorError) or isinstance(cause, RayActorError):
        return WorkerLost(worker_failed(exc))
    if isinstance(exc, BackPressureError):
        overloaded = Overloaded(f"The server is at capacity: {exc.message} Try again shortly "
                                "(config field `worker_max_queued_requests`).")
        if exc.retry_after_s is not None:
            # An instance refines its class's default (a ClassVar to mypy): Serve's own hint, in whole seconds.
            overloaded.retry_after_s = max(1, round(exc.retry_after_s))  # type: ignore[misc]
        return overloaded
    return exc


async def call(method: Any, *args: Any) -> Any:
    """`method.remote(*args)`'s answer, Ray's errors translated (Serve may refuse at `.remote()` already)."""
    try:
        return await method.remote(*args)
    except Exception as exc:
        raise translated(exc) from exc


async def awaited(response: object) -> object:
    # asyncio.wait_for needs a coroutine or future; a DeploymentResponse is only awaitable.
    return await response  # type: ignore[misc]  # typed `object` here: Serve's response type is not imported


def cancel(response: Any) -> None:
    """Cancelling the response cancels the replica's task: the worker sees asyncio.CancelledError at its current
    await and aborts its requests in the engine, which frees their KV blocks."""
    # A call Serve refused, or whose replica died, has nothing left to cancel: its cancel() fetches the routing
    # result and re-raises that error, which must not replace the one raised by the caller.
    with contextlib.suppress(Exception):
        response.cancel()


def multiplexed(worker: DeploymentHandle, reqs: list[GenerateRequest]) -> DeploymentHandle:
    """The handle for a call whose requests share one LoRA adapter: Serve's model multiplexing routes it to a replica
    holding that adapter (a call mixing adapters, as coalescing may make, goes anywhere: every replica loads on
    demand)."""
    names = {r.params.adapter and r.params.adapter.name for r in reqs}
    if len(names) == 1 and (name := names.pop()) is not None:
        return worker.options(multiplexed_model_id=name)
    return worker
