"""Loading and unloading LoRA adapters at run time, admin-key protected like the weight routes (edge/auth.py):

- vLLM: POST /v1/load_lora_adapter {lora_name, lora_path} -> 200 "Success: LoRA adapter '<name>' added
  successfully." (text); POST /v1/unload_lora_adapter {lora_name} -> "... removed successfully.", 404 when no
  adapter has the name; a refused adapter is a 400 in OpenAI's error body.
- SGLang: POST /load_lora_adapter {lora_name, lora_path} and /unload_lora_adapter {lora_name} -> {success,
  error_message, loaded_adapters} (400 when success is false).

A load is checked on a worker first (rank, modules, shapes: engine/loading/lora.py), then recorded in the
deployment's registry; every worker replica loads it on demand when a request names it."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field
from starlette.responses import PlainTextResponse, Response

from ingress.backend import Backend
from ingress.edge.openapi import error_responses
from ingress.errors import InvalidRequest, JSONAnswer, NotFound
from ingress.openai.render.common import error_json
from ingress.openai.schemas.common import OpenAIErrorBody

_BODY = ConfigDict(strict=True, extra="forbid")


class LoadAdapterBody(BaseModel):
    model_config = _BODY

    lora_name: str = Field(description="The adapter's name: what requests put in `model` (OpenAI), `lora_path` "
                           "(SGLang) or `adapter` (/generate).")
    lora_path: str = Field(description="A PEFT adapter folder (adapter_config.json + adapter_model.safetensors) "
                           "every worker can read.")
    load_inplace: bool = Field(False, description="vLLM's: must be false (unload first to replace an adapter).")
    pinned: bool = Field(False, description="SGLang's: accepted; adapters are evicted least recently used.")


class SGLangAdapterAnswer(BaseModel):
    success: bool
    error_message: str
    loaded_adapters: dict[str, str]


class UnloadAdapterBody(BaseModel):
    model_config = _BODY

    lora_name: str
    lora_int_id: int | None = Field(None, description="vLLM's: accepted, unused (adapters go by name).")


def adapters_router(backend: Backend) -> APIRouter:
    router = APIRouter(tags=["LoRA adapters"])

    async def load(body: LoadAdapterBody) -> str | None:
        if body.load_inplace:
            return "load_inplace is not supported: unload the adapter, then load it again."
        return await backend.load_adapter(body.lora_name, body.lora_path)

    async def vllm_load(body: LoadAdapterBody) -> Response:
        refused = await load(body)
        if refused is not None:
            return JSONAnswer(error_json(InvalidRequest(refused, param="lora_path")), status_code=400)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' added successfully.")

    async def vllm_unload(body: UnloadAdapterBody) -> Response:
        if not await backend.unload_adapter(body.lora_name):
            error = NotFound(f"The lora adapter '{body.lora_name}' cannot be found.", param="lora_name")
            return JSONAnswer(error_json(error), status_code=404)
        return PlainTextResponse(f"Success: LoRA adapter '{body.lora_name}' removed successfully.")

    async def sglang_answer(refused: str | None) -> Response:
        body = {"success": refused is None, "error_message": refused or "",
                "loaded_adapters": await backend.adapters()}
        return JSONAnswer(body, status_code=200 if refused is None else 400)

    async def sglang_load(body: LoadAdapterBody) -> Response:
        return await sglang_answer(await load(body))

    async def sglang_unload(body: UnloadAdapterBody) -> Response:
        removed = await backend.unload_adapter(body.lora_name)
        return await sglang_answer(None if removed else f"The adapter {body.lora_name!r} is not loaded.")

    errors = error_responses(OpenAIErrorBody, body=True, own_422=False)
    text = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Success: ..."}}
    router.add_api_route("/v1/load_lora_adapter", vllm_load, methods=["POST"], response_model=None,
                         responses={**text, **errors},
                         summary="vLLM's: serve a PEFT LoRA adapter under a name (admin key)")
    router.add_api_route("/v1/unload_lora_adapter", vllm_unload, methods=["POST"], response_model=None,
                         responses={**text, **errors, 404: {"model": OpenAIErrorBody,
                                                            "description": "No adapter has the name."}},
                         summary="vLLM's: stop serving an adapter (admin key)")
    sglang = {**errors, 400: {"model": SGLangAdapterAnswer | OpenAIErrorBody,
                              "description": "Refused (success false, the reason in error_message)."}}
    router.add_api_route("/load_lora_adapter", sglang_load, methods=["POST"], response_model=SGLangAdapterAnswer,
                         responses=sglang, summary="SGLang's: serve a PEFT LoRA adapter under a name (admin key)")
    router.add_api_route("/unload_lora_adapter", sglang_unload, methods=["POST"], response_model=SGLangAdapterAnswer,
                         responses=sglang, summary="SGLang's: stop serving an adapter (admin key)")
    return router
