"""POST /classify (vLLM's and SGLang's shapes) and POST /pooling (vLLM's) over the same Backend and request
lifecycle as every other route: limits, admission as one unit, batching with other requests in the worker's
engine, a client gone aborts its requests. Each prompt is one worker request with PoolingParams, whose
answer is the classifier's raw scores at transformers' pooled position (RequestOutput.pooled).

- vLLM /classify: `data[i] = {index, label, probs, num_classes}`; probs through vLLM's activation unless
  `use_activation` is false (activation.py); label = id2label of the largest.
- vLLM /pooling: `data[i] = {index, object: "pooling", data}`: the same values as /classify's probs.
- SGLang /classify: `{embedding, meta_info}` per prompt (a list for a batch): the raw scores (a reward)."""

from __future__ import annotations

import time
import uuid

from fastapi import Request
from starlette.responses import Response

from ingress.adapters.select import adapter_for_model, served_model
from ingress.backend import Backend
from ingress.classify.activation import activate, predicted
from ingress.classify.schemas import ClassifyBody, Input, PoolingBody
from ingress.classify.validation import (
    check_classifier,
    check_ids,
    is_sglang,
    sglang_prompts,
    sglang_rids,
    vllm_prompts,
)
from ingress.edge.request_record import current_request_id
from ingress.errors import InvalidRequest, JSONAnswer, enforce
from ingress.lifecycle import Exchange, Lifecycle, all_or_none
from protocol import GenerateRequest, ModelInfo, PoolingParams, RequestOutput, SamplingParams
from rulebook import pooling, rules

CLASSIFY = SamplingParams(max_tokens=0, pooling=PoolingParams())


class ClassifyRoutes:
    """The /classify and /pooling handlers bound to one backend (openai/router.py wires them)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def classify(self, body: ClassifyBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda exchange: self._classify(body, exchange))

    async def pooling(self, body: PoolingBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda exchange: self._pooling(body, exchange))

    async def _classify(self, body: ClassifyBody, exchange: Exchange) -> Response:
        info = await self._backend.model_info()
        if is_sglang(body):
            return await self._sglang(body, exchange, info)
        exchange.adapter = await adapter_for_model(self._backend, body.model, info)
        check_classifier(info, "/classify route")
        assert body.input is not None  # is_sglang: vLLM's shape has its input
        answers, ids = await self._run(body.input, body.add_special_tokens, exchange, info, "classify")
        data = []
        for i, whole in enumerate(answers):
            probs = _values(whole, info, body.use_activation)
            label = info.id2label.get(predicted(probs))
            data.append({"index": i, "label": label, "probs": probs, "num_classes": len(probs)})
        return JSONAnswer(_listing(f"classify-{_base()}", info, data, ids))

    async def _pooling(self, body: PoolingBody, exchange: Exchange) -> Response:
        info = await served_model(self._backend, exchange, body.model)
        check_classifier(info, "/pooling route")
        if body.task not in (None, "classify"):
            raise InvalidRequest(pooling.POOLING_TASK.format(task=body.task), param="task")
        if body.encoding_format != "float":
            raise InvalidRequest(pooling.ENCODING_FORMAT.format(value=body.encoding_format), param="encoding_format")
        answers, ids = await self._run(body.input, body.add_special_tokens, exchange, info, "pool")
        data = [{"index": i, "object": "pooling", "data": _values(whole, info, body.use_activation)}
                for i, whole in enumerate(answers)]
        return JSONAnswer(_listing(f"pool-{_base()}", info, data, ids))

    async def _sglang(self, body: ClassifyBody, exchange: Exchange, info: ModelInfo) -> Response:
        check_classifier(info, "/classify route")
        prompts, many = sglang_prompts(body)
        rids = sglang_rids(body.rid, len(prompts), many, _base())
        ids = await self._ids(prompts, True, info, "text" if body.text is not None else "input_ids")
        answers = await exchange.answers([GenerateRequest(rid=rid, input_ids=p, params=CLASSIFY)
                                          for rid, p in zip(rids, ids, strict=True)], info)
        bodies = [{"embedding": _raw(whole),
                   "meta_info": {"id": rid, "prompt_tokens": whole.prompt_tokens,
                                 "cached_tokens": whole.cached_tokens, "weight_version": whole.weight_version}}
                  for rid, whole in zip(rids, answers, strict=True)]
        return JSONAnswer(bodies if many else bodies[0])

    async def _run(self, value: Input, special: bool, exchange: Exchange, info: ModelInfo,
                   prefix: str) -> tuple[list[RequestOutput], list[list[int]]]:
        """vLLM's input -> one classify request per prompt, answered by one unary worker call."""
        ids = await self._ids(vllm_prompts(value), special, info, "input")
        base = f"{prefix}-{_base()}"
        reqs = [GenerateRequest(rid=f"{base}-{i}", input_ids=p, params=CLASSIFY) for i, p in enumerate(ids)]
        return await exchange.answers(reqs, info), ids

    async def _ids(self, prompts: list[str] | list[list[int]], special: bool, info: ModelInfo,
                   param: str) -> list[list[int]]:
        for i, prompt in enumerate(prompts):
            if isinstance(prompt, str):
                # "" is refused as every route refuses it, whatever the tokenizer adds (with a BOS it would classify
                # the BOS alone).
                if (empty := rules.empty_prompt(prompt)) is not None:
                    raise InvalidRequest(pooling.PROMPT_I.format(i=i, message=empty.message), param=param)
                enforce(rules.untokenizable(prompt, info.max_model_len, info.prompt_chars_per_token, param), param)
        ids = await all_or_none(self._tokens(p, special) for p in prompts)
        for i, p in enumerate(ids):
            check_ids(i, p, info, param)
        return ids

    async def _tokens(self, prompt: str | list[int], special: bool) -> list[int]:
        return await self._backend.tokenize(prompt, special) if isinstance(prompt, str) else list(prompt)


def _raw(whole: RequestOutput) -> list[float]:
    assert whole.pooled is not None, "a classify request's answer carries its scores"
    return whole.pooled


def _values(whole: RequestOutput, info: ModelInfo, use_activation: bool | None) -> list[float]:
    raw = _raw(whole)
    return raw if use_activation is False else activate(raw, info.problem_type)


def _base() -> str:
    return current_request_id() or uuid.uuid4().hex


def _listing(rid: str, info: ModelInfo, data: list[dict], prompts: list[list[int]]) -> dict:
    n = sum(len(p) for p in prompts)
    return {"id": rid, "object": "list", "created": int(time.time()), "model": info.model_name, "data": data,
            "usage": {"prompt_tokens": n, "total_tokens": n, "completion_tokens": 0, "prompt_tokens_details": None}}
