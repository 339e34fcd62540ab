"""Which LoRA adapter a request runs with: the OpenAI `model` field naming an adapter (as vLLM), SGLang's
`lora_path` and our `adapter` field on /generate. Resolved against the deployment's registry (Backend.adapters),
so the request carries the adapter's folder and any worker replica can serve it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ingress.backend import Backend
from ingress.errors import InvalidRequest, NotFound
from protocol import ModelInfo
from rulebook.adapters import UNKNOWN_ADAPTER, UNKNOWN_MODEL
from rulebook.sglang import LORA_PATHS_DIFFER

if TYPE_CHECKING:
    from ingress.lifecycle import Exchange


async def served_model(backend: Backend, exchange: Exchange, model: str | None) -> ModelInfo:
    """The one preamble of the routes whose body names a `model` (OpenAI's and vLLM's shapes): the served model's
    info, with the adapter `model` names set on the exchange (a 404 naming what is served for any other name)."""
    info = await backend.model_info()
    exchange.adapter = await adapter_for_model(backend, model, info)
    return info


async def adapter_for_model(backend: Backend, model: str | None, info: ModelInfo) -> tuple[str, str] | None:
    """The OpenAI `model` field: the served model's name (or none) -> the base model; an adapter's name -> that
    adapter (name, folder); anything else -> 404 naming what is served."""
    if model is None or model == info.model_name:
        return None
    paths = await backend.adapters()
    if model in paths:
        return model, paths[model]
    raise NotFound(UNKNOWN_MODEL.format(model=model, served=info.model_name, loaded=sorted(paths)), param="model")


def lora_name(lora_path: str | list[str | None] | None) -> str | None:
    """SGLang's lora_path: one name, or one per item (which must all be the same: a request runs with one)."""
    if lora_path is None or isinstance(lora_path, str):
        return lora_path
    names = set(lora_path)
    if len(names) > 1:
        raise InvalidRequest(LORA_PATHS_DIFFER, param="lora_path")
    return names.pop() if names else None


async def adapter_by_name(backend: Backend, name: str | None, param: str) -> tuple[str, str] | None:
    """/generate's `adapter` or SGLang's `lora_path`: an adapter's name (400 naming the field when unknown)."""
    if name is None:
        return None
    paths = await backend.adapters()
    if name not in paths:
        raise InvalidRequest(UNKNOWN_ADAPTER.format(param=param, name=name, loaded=sorted(paths)), param=param)
    return name, paths[name]
