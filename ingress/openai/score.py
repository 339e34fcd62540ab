"""POST /v1/score: SGLang's decoder-only scoring. For each item, the next-token probabilities of the label
tokens after query+item (item+query with `item_first`).

Request and answer as SGLang's: `query` and `items` both text (the pair is concatenated, then tokenized) or
both token ids (concatenated), `label_token_ids`, `apply_softmax`, `item_first`, `model`; the answer is
`{"scores": [[p per label] per item], "model", "usage", "object": "scoring"}`. Without `apply_softmax` a
score is the label's probability under the full next-token distribution; with it, the softmax over the label
tokens' logits alone (so an item's scores sum to 1).

Exact by construction, on the engine's scoring path, as SGLang computes it: an item is one worker request,
query+item+[first label] scored at its last position but one, whose single row is the next-token distribution after
query+item; every label's value is read off that row (token_ids_logprob), the same value /generate's scoring returns.
So an item costs one scoring row however many labels it has: the label count is bounded by `max_token_ids_logprob`
(the ids one row reports), the items by `max_batch_items`. Every item shares the query: the prefix router sends them
to one worker, whose prefix cache (with the hidden-state store) computes the shared tokens once.
"""

from __future__ import annotations

import math
import uuid

from fastapi import Request
from starlette.responses import Response

from ingress.adapters.select import served_model
from ingress.backend import Backend
from ingress.edge.request_record import current_request_id
from ingress.errors import InvalidRequest, JSONAnswer, enforce
from ingress.lifecycle import Exchange, Lifecycle
from ingress.openai.schemas.score import ScoreBody
from ingress.openai.validation import check_text
from ingress.request_checks import check_causal
from protocol import GenerateRequest, ModelInfo, RequestOutput, SamplingParams, compact
from rulebook import limits
from rulebook import openai as msg
from rulebook.rules import TOKEN_OUT_OF_RANGE


def validate_score(body: ScoreBody, info: ModelInfo) -> tuple[str | list[int], list[str] | list[list[int]]]:
    """The body's query and items (a lone text item as a list of one), or InvalidRequest (its `model` is served_model's
    to check)."""
    labels = body.label_token_ids
    if not labels:
        raise InvalidRequest(msg.NO_LABELS, param="label_token_ids")
    _check_ids(labels, info, "label_token_ids")
    logprobs = info.logprobs_mode in ("raw_logprobs", "processed_logprobs")  # label rows are at T = 1 in both
    if not logprobs and not (body.apply_softmax and info.logprobs_mode == "raw_logits"):
        raise InvalidRequest(msg.SOFTMAX_MODE.format(value=body.apply_softmax, mode=info.logprobs_mode),
                             param="apply_softmax")
    if body.query is None or body.items is None:
        raise InvalidRequest(msg.QUERY_AND_ITEMS, param="query" if body.query is None else "items")
    items = [body.items] if isinstance(body.items, str) else body.items
    text_query = isinstance(body.query, str)
    if any(isinstance(item, str) != text_query for item in items):
        raise InvalidRequest(msg.MIXED_ITEMS, param="items")
    if not text_query:
        _check_ids(body.query, info, "query")  # type: ignore[arg-type]  # ids, as just checked
        for item in items:
            _check_ids(item, info, "items")  # type: ignore[arg-type]  # ids, as just checked
    return body.query, items


def _check_ids(ids: list[int], info: ModelInfo, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < info.vocab_size), None)
    if bad is not None:
        raise InvalidRequest(TOKEN_OUT_OF_RANGE.format(token_id=bad, vocab_size=info.vocab_size), param=param)


def check_prompt_len(i: int, ids: list[int], info: ModelInfo) -> None:
    """Item i's prompt has a token to predict from, and room for a label token after it."""
    if not ids:
        raise InvalidRequest(msg.PAIR_NO_TOKENS.format(i=i), param="items")
    if len(ids) + 1 > info.max_model_len:
        raise InvalidRequest(msg.PAIR_TOO_LONG.format(i=i, n=len(ids), limit=info.max_model_len), param="items")


def label_request(rid: str, ids: list[int], labels: list[int]) -> GenerateRequest:
    """ids+[first label], scored from its last position but one: its one row is the distribution after `ids`, and
    it reports log p(t | ids) of every label t (token_ids_logprob)."""
    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=len(ids) - 1,
                            token_ids_logprob=list(labels))
    return GenerateRequest(rid=rid, input_ids=[*ids, labels[0]], params=params)


def label_values(whole: RequestOutput, labels: list[int]) -> list[float]:
    """The labels' values from the item's one row, in the body's order (a label may repeat)."""
    row = whole.input_token_ids_logprobs[0]  # type: ignore[index]  # one scored row, with token_ids_logprob
    by_id = {int(t): float(v) for v, t in row}
    return [by_id[t] for t in labels]


def probabilities(values: list[float], apply_softmax: bool) -> list[float]:
    """Label values (logprobs, or raw logits with apply_softmax) -> the answer's probabilities."""
    if not apply_softmax:
        return [math.exp(v) for v in values]
    top = max(values)
    weights = [math.exp(v - top) for v in values]
    total = sum(weights)
    return [w / total for w in weights]


class ScoreRoutes:
    """The /v1/score handler bound to one backend (router.py wires it)."""

    def __init__(self, backend: Backend, lifecycle: Lifecycle) -> None:
        self._backend = backend
        self._lifecycle = lifecycle

    async def score(self, body: ScoreBody, request: Request) -> Response:
        return await self._lifecycle.run(request, lambda exchange: self._score(body, exchange))

    async def _score(self, body: ScoreBody, exchange: Exchange) -> Response:
        info = await served_model(self._backend, exchange, body.model)
        query, items = validate_score(body, info)
        check_causal(info, "/v1/score")
        labels = body.label_token_ids or []
        # Counted from the body, before any text is tokenized: one worker request per item, one row reporting every
        # label.
        enforce(limits.field_over("number of label_token_ids", len(labels), exchange.settings.max_token_ids_logprob,
                                  "max_token_ids_logprob"), param="label_token_ids")
        exchange.check_fan_out(len(items))
        prompts = await self._prompts(query, items, body.item_first, info)
        for i, ids in enumerate(prompts):
            check_prompt_len(i, ids, info)
        sid = f"score-{current_request_id() or uuid.uuid4().hex}"
        answers = await exchange.answers([label_request(f"{sid}-{i}", ids, labels)  # one unary worker call
                                      for i, ids in enumerate(prompts)], info)
        scores = [probabilities(label_values(whole, labels), body.apply_softmax) for whole in answers]
        n = sum(len(ids) for ids in prompts)
        usage = {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}
        out: dict = {"scores": scores, "model": info.model_name, "usage": usage, "object": "scoring"}
        if body.return_flat_logprobs_b64:  # the probabilities are computed here in float64: written as float64
            out.pop("scores")
            out.update(compact.flat_values("scores", [p for row in scores for p in row], [len(scores), len(labels)],
                                           "float64"))
        return JSONAnswer(out)

    async def _prompts(self, query: str | list[int], items: list[str] | list[list[int]], item_first: bool,
                       info: ModelInfo) -> list[list[int]]:
        """Each pair's ids: texts are joined, then tokenized as a text prompt is (SGLang's order of steps), by the
        ingress's tokenizer in one thread call; the worker gets ids."""
        pairs = [(item, query) if item_first else (query, item) for item in items]
        if not isinstance(query, str):
            return [[*first, *second] for first, second in pairs]  # type: ignore[misc]  # both ids (validate_score)
        texts = [first + second for first, second in pairs]  # type: ignore[operator]  # both text
        for text in texts:
            check_text(text, info, "items")
        return await self._backend.tokenize_many(texts) if texts else []
