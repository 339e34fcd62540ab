"""SGLang's control routes that RL frameworks call (AReaL's remote engine, slime): /pause_generation,
/continue_generation, /abort_request (admin routes, like the weight routes), /get_model_info, /get_server_info and
/health_generate. The first three reach every worker replica through the weight registry (Backend.control), so a
pause holds the whole deployment; what a pause does to the requests in flight is engine/core/pause.py's."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any, cast

from fastapi import APIRouter, Body
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from ingress.backend import Backend
from ingress.edge.openapi import error_responses
from ingress.errors import InvalidRequest, JSONAnswer
from ingress.generate.schemas import HealthBody
from ingress.openai.render.common import error_json
from ingress.openai.schemas.common import OpenAIErrorBody
from protocol import GenerateRequest, SamplingParams, WeightUpdateResult
from protocol.control import Abort, Pause, PauseMode, Resume
from rulebook import sglang as sg

HEALTH_TIMEOUT_S = 20.0


class PauseBody(BaseModel):
    """SGLang's PauseGenerationReqInput (any other field: a 422 naming it)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    mode: str = Field("abort", description="abort: in-flight requests end now (finish_reason abort) with their "
                      "output; retract: they give back their KV cache and recompute after continue; in_place: they "
                      "keep it. Requests that arrive while paused wait (at most pause_timeout_s).")


class ContinueBody(BaseModel):
    """SGLang's ContinueGenerationReqInput (any other field: a 422 naming it)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    torch_empty_cache: bool = Field(True, description="On CUDA, each worker hands the blocks PyTorch's allocator "
                                    "caches back to the driver (torch.cuda.empty_cache) before it resumes; on CPU "
                                    "there is no such cache and the field changes nothing.")


class AbortBody(BaseModel):
    """SGLang's AbortReq (any other field: a 422 naming it)."""

    model_config = ConfigDict(strict=True, extra="forbid")

    rid: str = Field("", description="The request to abort (its rid, or meta_info.id).")
    abort_all: bool = Field(False, description="Abort every request in every worker.")


class ControlAnswer(BaseModel):
    success: bool
    message: str
    num_paused_requests: int = Field(description="Requests the operation touched, over every replica.")


def _answer(result: WeightUpdateResult, message: str) -> Response:
    body = {"success": result.success, "message": message if result.success else result.message,
            "num_paused_requests": result.num_paused_requests}
    return JSONAnswer(body, status_code=200 if result.success else 503)


def _refused(exc: InvalidRequest) -> Response:
    return JSONAnswer(error_json(exc), status_code=exc.status)


def control_router(backend: Backend) -> APIRouter:
    router = APIRouter()

    async def pause_generation(body: PauseBody | None = Body(None)) -> Response:
        mode = (body or PauseBody()).mode
        if (broken := sg.pause_mode(mode)) is not None:
            return _refused(InvalidRequest(broken.message, param=broken.param))
        return _answer(await backend.control(Pause(cast(PauseMode, mode))), "Generation paused successfully.")

    async def continue_generation(body: ContinueBody | None = Body(None)) -> Response:
        empty_cache = (body or ContinueBody()).torch_empty_cache
        return _answer(await backend.control(Resume(empty_cache)), "Generation continued successfully.")

    async def abort_request(body: AbortBody) -> Response:
        if (broken := sg.abort_target(body.rid, body.abort_all)) is not None:
            return _refused(InvalidRequest(broken.message, param=broken.param))
        result = await backend.control(Abort(None if body.abort_all else body.rid))
        return _answer(result, f"Aborted {result.num_paused_requests} request(s).")

    async def get_model_info() -> Response:
        info = await backend.model_info()
        return JSONAnswer({"model_path": info.model_name, "tokenizer_path": info.model_name, "is_generation": True,
                           "preferred_sampling_params": None, "weight_version": await backend.weight_version(),
                           "has_image_understanding": False, "has_audio_understanding": False})

    async def get_server_info() -> Response:
        info = await backend.model_info()
        return JSONAnswer({"model_path": info.model_name, "served_model_name": info.model_name,
                           "context_length": info.max_model_len, "vocab_size": info.vocab_size,
                           "logprobs_mode": info.logprobs_mode, "max_total_num_tokens": info.kv_capacity_tokens,
                           "weight_version": await backend.weight_version(), "version": "rayscore"})

    async def health_generate() -> Response:
        """SGLang's: one generated token through a worker, within HEALTH_TIMEOUT_S."""
        req = GenerateRequest(rid=f"HEALTH_CHECK_{uuid.uuid4().hex}", input_ids=[0],
                              params=SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True))
        try:
            (whole,) = await asyncio.wait_for(backend.answers([req]), HEALTH_TIMEOUT_S)
            ok = whole.finished and whole.finish_reason is not None and whole.finish_reason.type != "error"
        except Exception:  # noqa: BLE001  # any failure means "not healthy", never a 5xx of its own
            ok = False
        return JSONAnswer({"status": "ok" if ok else "unavailable"}, status_code=200 if ok else 503)

    post_errors: dict[int | str, dict[str, Any]] = error_responses(OpenAIErrorBody, body=True, own_422=False)
    post_errors[503] = {"model": ControlAnswer, "description": "No worker replica answered (success false)."}
    router.add_api_route("/pause_generation", pause_generation, methods=["POST"], response_model=ControlAnswer,
                         responses=post_errors, summary="Pause generation on every worker (SGLang's modes)")
    router.add_api_route("/continue_generation", continue_generation, methods=["POST"], response_model=ControlAnswer,
                         responses=post_errors, summary="Continue paused generation on every worker")
    router.add_api_route("/abort_request", abort_request, methods=["POST"], response_model=ControlAnswer,
                         responses=post_errors, summary="Abort a request by rid, or every request (abort_all)")
    router.add_api_route("/get_model_info", get_model_info, methods=["GET"], response_model=None,
                         responses=error_responses(OpenAIErrorBody), summary="The served model (SGLang's route)")
    router.add_api_route("/get_server_info", get_server_info, methods=["GET"], response_model=None,
                         responses=error_responses(OpenAIErrorBody), summary="The server's settings (SGLang's route)")
    health: dict[int | str, dict[str, Any]] = {
        200: {"model": HealthBody, "description": "A token was generated."},
        503: {"model": HealthBody, "description": "No worker generated a token in time."},
        401: error_responses(OpenAIErrorBody)[401], 413: error_responses(OpenAIErrorBody)[413]}
    router.add_api_route("/health_generate", health_generate, methods=["GET"], response_model=None,
                         responses=health, summary="Healthy when a worker generates a token (SGLang's route)")
    return router

