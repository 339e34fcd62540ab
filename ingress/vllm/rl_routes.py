"""vLLM's RL control routes (vllm/entrypoints/rl/online/api_router.py), on the typed control plane: POST /pause with
its three modes, POST /resume, GET /is_paused, POST /abort_requests (no ids: every live request). They reach every
worker replica through the weight registry (Backend.control), as SGLang's control routes do, and are admin routes
(ingress/edge/auth.py). vLLM's modes map onto the engine's pause (engine/core/pause.py):
- abort: every request in flight ends now with finish_reason abort and what it produced;
- wait: requests in flight finish while new ones wait, then generation pauses (the call returns once drained);
- keep: requests in flight keep their KV cache and resume where they were (the engine's in_place).
`clear_cache` (default true; vLLM deprecates it) empties the prefix cache after an abort or wait pause.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from ingress.backend import Backend
from ingress.edge.openapi import error_responses
from ingress.errors import InvalidRequest, JSONAnswer
from ingress.openai.render.common import error_json
from ingress.openai.schemas.common import OpenAIErrorBody
from ingress.vllm.parse import RID_PREFIX
from protocol import WeightUpdateResult
from protocol.control import Abort, FlushCache, Pause, Resume
from rulebook import vllm_generate as vg

# vLLM's mode -> the engine's pause.
PAUSES = {"abort": Pause("abort"), "wait": Pause("in_place", drain=True), "keep": Pause("in_place")}


def _refused(exc: InvalidRequest) -> Response:
    return JSONAnswer(error_json(exc), status_code=exc.status)


def _failed(result: WeightUpdateResult) -> Response:
    """vLLM answers a failed operation {"error": ...}; here no worker answered (or controls are off): 503."""
    return JSONAnswer({"error": result.message}, status_code=503)


def _flag(value: str | None, name: str) -> bool:
    if value is None or value.lower() in ("true", "1"):
        return True
    if value.lower() in ("false", "0"):
        return False
    raise InvalidRequest(vg.QUERY_BOOL.format(name=name, value=value[:20]), param=name)


def rl_router(backend: Backend) -> APIRouter:
    router = APIRouter(tags=["vLLM RL"])

    async def pause(request: Request) -> Response:
        mode = request.query_params.get("mode", "abort")
        if mode not in PAUSES:
            return _refused(InvalidRequest(vg.PAUSE_MODE.format(mode=mode[:20]), param="mode"))
        try:
            clear = _flag(request.query_params.get("clear_cache"), "clear_cache")
        except InvalidRequest as exc:
            return _refused(exc)
        result = await backend.control(PAUSES[mode])
        if not result.success:
            return _failed(result)
        if clear and mode != "keep":
            await backend.control(FlushCache())
        return JSONAnswer({"status": "paused"})

    async def resume() -> Response:
        result = await backend.control(Resume())
        return JSONAnswer({"status": "resumed"}) if result.success else _failed(result)

    async def is_paused() -> Response:
        return JSONAnswer({"is_paused": await backend.paused() is not None})

    async def abort_requests(request: Request) -> Response:
        """vLLM's: the named requests (any route's request id; /inference/v1/generate's with or without its prefix),
        or every live request when `request_ids` is missing or empty."""
        try:
            body: Any = await request.json()
        except ValueError:
            return _refused(InvalidRequest(vg.INVALID_JSON))
        if not isinstance(body, dict):
            return _refused(InvalidRequest(vg.NOT_OBJECT))
        ids = body.get("request_ids")
        if ids is not None and (not isinstance(ids, list) or not all(isinstance(i, str) for i in ids)):
            return _refused(InvalidRequest(vg.IDS_NOT_STRINGS, param="request_ids"))
        if not ids:
            result = await backend.control(Abort(None))
            return JSONAnswer({"status": "aborted", "aborted": result.num_paused_requests}) if result.success \
                else _failed(result)
        aborted = 0
        for rid in ids:
            for name in dict.fromkeys((rid, rid if rid.startswith(RID_PREFIX) else RID_PREFIX + rid)):
                result = await backend.control(Abort(name))
                if not result.success:
                    return _failed(result)
                aborted += result.num_paused_requests
        return JSONAnswer({"status": "aborted", "aborted": aborted})

    errors: dict[int | str, dict[str, Any]] = error_responses(OpenAIErrorBody, body=True, own_422=False)
    router.add_api_route("/pause", pause, methods=["POST"], response_model=None, responses=errors,
                         summary="Pause generation on every worker (vLLM's modes: abort, wait, keep)")
    router.add_api_route("/resume", resume, methods=["POST"], response_model=None, responses=errors,
                         summary="Resume paused generation on every worker")
    router.add_api_route("/is_paused", is_paused, methods=["GET"], response_model=None,
                         responses=error_responses(OpenAIErrorBody), summary="Whether generation is paused")
    router.add_api_route("/abort_requests", abort_requests, methods=["POST"], response_model=None, responses=errors,
                         summary="Abort requests by id, or every live request (no ids)")
    return router
