"""The seed /generate dialect's parse: the body -> its canonical request (to_request), checked by the contract's 400
rules on that request (ingress/request_checks.py, in the contract's order: first failure wins).

Pure functions of the body and the worker's ModelInfo: no I/O, so they are tested exactly and alone.
The rules the engine checks too are the rulebook's (rulebook/rules.py), with its messages; rule 12 (sampling
values) is its table, checked on the carrier's SamplingParams.
A batch (a list of prompts or of id lists) is validated item by item with the same rules: the first failing
item's message is the single request's, prefixed with `Item {i}: `.
"""

from __future__ import annotations

import uuid

from ingress.edge.request_record import current_request_id
from ingress.errors import InvalidRequest, enforce
from ingress.generate.schemas import GenerateBody
from ingress.request_checks import check_prompt
from protocol import GenerateRequest, ModelInfo, SamplingParams
from protocol.sampling import split_token_ids, stop_list
from rulebook import rules


def validate(body: GenerateBody, info: ModelInfo, prompt_len: int | None = None) -> None:
    """Raise InvalidRequest with the first failing rule's message; return when the body is valid: the body's
    prompt and parameters against the contract's rules (ingress/request_checks.py), image input at rule 7's place.

    `prompt_len` is the token count of a text prompt when the caller knows it. The seed route does not before it
    tokenizes the checked text (ingress/generate/routes.py), so it checks rule 11 on the ids then
    (request_checks.check_tokenized).
    """
    enforce(rules.token_id_shapes_mixed(body.token_ids_logprob))
    # A single body's prompt (a batch's lists reach here only beside the other form, which rule 4 refuses first).
    ids: list[int] | None = list(body.input_ids) if body.input_ids is not None else None  # type: ignore[arg-type]
    text: str | None = body.prompt  # type: ignore[assignment]
    check_prompt(sampling_params(body), info, ids=ids, text=text, images=body.image_data is not None,
                 prompt_len=prompt_len)


def split_batch(body: GenerateBody) -> list[GenerateBody] | None:
    """A batch body's items, each a single body with its own rid; None when the body is not a batch.

    Bodies with both or neither prompt form are left to rule 4, and `input_ids: []` to rule 6.
    """
    items: list[str] | list[list[int]]
    if isinstance(body.prompt, list) and body.input_ids is None:
        items, key = body.prompt, "prompt"
    elif body.prompt is None and body.input_ids and isinstance(body.input_ids[0], list):
        items, key = body.input_ids, "input_ids"  # type: ignore[assignment]  # a list of id lists
    else:
        if isinstance(body.rid, list):
            raise InvalidRequest(rules.RID_NOT_STRING)
        return None
    if not items:
        raise InvalidRequest(rules.EMPTY_BATCH)
    # Without the client's ids, item i's is the HTTP request's id (or a new one) with `-i`: one per worker request.
    base = current_request_id() or uuid.uuid4().hex
    rids = body.rid if body.rid is not None else [f"{base}-{i}" for i in range(len(items))]
    if not isinstance(rids, list) or len(rids) != len(items):
        raise InvalidRequest(rules.RID_PER_ITEM.format(n=len(items)))
    if len(set(rids)) != len(rids):  # two items under one id would be one request to the worker
        raise InvalidRequest(rules.RID_REPEATED)
    other = "input_ids" if key == "prompt" else "prompt"
    return [body.model_copy(update={key: item, other: None, "rid": rid}) for item, rid in zip(items, rids, strict=True)]


def validate_batch(items: list[GenerateBody], info: ModelInfo) -> None:
    """Each item against the rules; the first failure's message names its item."""
    for i, item in enumerate(items):
        try:
            validate(item, info)
        except InvalidRequest as exc:
            raise InvalidRequest(rules.ITEM.format(i=i, message=exc.message)) from exc


def sampling_params(body: GenerateBody) -> SamplingParams:
    """The body's parameters as the worker takes them (a lone stop string becomes a list, null k is 0, a list of
    lists of token ids is the per-row field)."""
    flat_ids, row_ids = split_token_ids(body.token_ids_logprob)
    return SamplingParams(
        max_tokens=body.max_tokens, temperature=body.temperature, top_p=body.top_p, top_k=body.top_k,
        min_p=body.min_p, seed=body.seed, stop=stop_list(body.stop),
        stop_token_ids=list(body.stop_token_ids or []), ignore_eos=body.ignore_eos,
        skip_special_tokens=body.skip_special_tokens, include_stop_str_in_output=body.include_stop_str_in_output,
        return_logprob=bool(body.return_logprob), logprob_start_len=body.logprob_start_len,
        top_logprobs_num=body.top_logprobs_num or 0, input_logprob_temperature=body.input_logprob_temperature,
        token_ids_logprob=flat_ids, token_id_rows=row_ids)


def to_request(body: GenerateBody, input_ids: list[int] | None = None) -> GenerateRequest:
    """The worker's carrier for a validated body, its prompt's ids `input_ids` (a text prompt's, tokenized) or the
    body's own; the request id is the body's `rid`, else the HTTP request's (X-Request-ID or made by the
    middleware), else a new one."""
    assert not isinstance(body.rid, list), "a batch is split into single bodies first"
    ids = input_ids if input_ids is not None else body.input_ids
    assert ids is not None, "a text prompt is tokenized first"
    return GenerateRequest(rid=body.rid or current_request_id() or uuid.uuid4().hex,
                           input_ids=list(ids),  # type: ignore[arg-type]  # a single body's ids
                           params=sampling_params(body))
