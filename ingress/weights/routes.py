"""SGLang's weight routes: POST /update_weights_from_disk, POST /flush_cache, GET /model_info.

Every worker replica loads the new weights or none does (workers/weights.py); requests in flight finish on the
weights they started with, or are aborted with abort_all_requests; every cache is emptied. A failure answers 400
with SGLang's body, and the old weights keep serving. When keys are set, the two POST routes need an admin key
(edge/auth.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import Response

from ingress.backend import Backend
from ingress.edge.openapi import error_responses
from ingress.errors import InvalidRequest, JSONAnswer
from ingress.openai.render.common import error_json
from ingress.openai.schemas.common import OpenAIErrorBody
from protocol import WeightUpdate, WeightUpdateResult
from protocol.control import FlushCache
from rulebook.sglang import UPDATE_REFUSED, update_refusal


class UpdateWeightsBody(BaseModel):
    """SGLang's UpdateWeightFromDiskReqInput. Its fields that change nothing here are declared and unused; those that
    would change what happens are refused unless neutral (rulebook/sglang.py's UPDATE_REFUSED); any other field is a
    422 naming it (extra="forbid"): an update request must never half-apply what it asked for."""

    model_config = ConfigDict(strict=True, extra="forbid")

    model_path: str = Field(description="A checkpoint folder (config.json + *.safetensors) every worker can read, "
                            "with the served model's config and shapes.")
    weight_version: str | None = Field(None, description="The new weights' name, reported in meta_info."
                                       "weight_version and GET /model_info; null keeps the current name.")
    flush_cache: bool = Field(True, description="Accepted for SGLang's clients: the caches are emptied whatever it "
                              "says, since they were built on the old weights.")
    abort_all_requests: bool = Field(False, description="Abort the requests in flight instead of letting them "
                                     "finish on the old weights.")
    load_format: str | None = Field(None, description="null or \"auto\" (safetensors): other formats are a 400.")
    keep_pause: bool = Field(False, description="Only false: the server resumes after an update.")
    manifest: dict[str, Any] | None = Field(None, description="Only null: tensor manifests are not read.")
    # Change nothing here: the update returns when every worker serves the new weights, CUDA graphs read the weights
    # in place, and the caching allocator is this server's to manage.
    is_async: bool = Field(False, description="Accepted, unused: the call returns once the update is done.")
    torch_empty_cache: bool = Field(False, description="Accepted, unused.")
    recapture_cuda_graph: bool = Field(False, description="Accepted, unused: graphs read the weights in place.")
    token_step: int = Field(0, description="Accepted, unused (the trainer's step id).")
    rid: str | None = Field(None, description="Accepted, unused.")


class ModelInfoAnswer(BaseModel):
    model_path: str
    tokenizer_path: str
    is_generation: bool
    weight_version: str


class UpdateWeightsAnswer(BaseModel):
    success: bool
    message: str
    num_paused_requests: int


def _answer(result: WeightUpdateResult) -> Response:
    body = {"success": result.success, "message": result.message, "num_paused_requests": result.num_paused_requests}
    return JSONAnswer(body, status_code=200 if result.success else 400)


def weights_router(backend: Backend) -> APIRouter:
    router = APIRouter()

    async def update_weights_from_disk(body: UpdateWeightsBody) -> Response:
        refused = update_refusal(body.model_dump(include=set(UPDATE_REFUSED)))
        if refused is not None:
            return JSONAnswer(error_json(InvalidRequest(refused.message, param=refused.param)), status_code=400)
        return _answer(await backend.update_weights(
            WeightUpdate(body.model_path, body.weight_version, body.abort_all_requests)))

    async def flush_cache() -> Response:
        return _answer(await backend.control(FlushCache()))

    async def model_info() -> Response:
        info = await backend.model_info()
        return JSONAnswer({"model_path": info.model_name, "tokenizer_path": info.model_name,
                           "is_generation": not info.classifier, "weight_version": await backend.weight_version()})

    def responses(body: bool) -> dict[int | str, dict[str, Any]]:
        out = error_responses(OpenAIErrorBody, body=body, own_422=False)
        # SGLang's failure body (the update failed, the old weights serve), or the edge's for a body it cannot read.
        out[400] = {"model": UpdateWeightsAnswer | OpenAIErrorBody,
                    "description": "The update failed and the old weights keep serving, or the body is not JSON."}
        return out

    router.add_api_route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"],
                         response_model=UpdateWeightsAnswer, responses=responses(True),
                         summary="Load new weights from disk on every worker (SGLang's route)")
    router.add_api_route("/flush_cache", flush_cache, methods=["POST"], response_model=UpdateWeightsAnswer,
                         responses=responses(False), summary="Empty every worker's prefix cache")
    router.add_api_route("/model_info", model_info, methods=["GET"], response_model=ModelInfoAnswer,
                         responses=error_responses(OpenAIErrorBody), summary="The served model and weight_version")
    return router
