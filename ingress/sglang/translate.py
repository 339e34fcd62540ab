"""SGLang's /generate body -> one canonical request per prompt (x n), checked by the contract's rules.

SGLang normalizes a body the way its GenerateReqInput.normalize_batch_and_arguments does: a single prompt or a batch
(`text` list, `input_ids` list of lists), per-prompt or shared `sampling_params` and logprob fields, `n` samples
per prompt (the batch repeated n times, in order). Each item becomes a canonical GenerateRequest (protocol/), checked
by the rules every dialect's requests are (ingress/request_checks.py) with one difference, SGLang's: input rows may come
together with generated tokens. No other dialect's body shape is involved. The boundary maps exactly: SGLang's
entries are input_ids[s:] with entry 0 null, the engine's rows are input_ids[s+1:], so the engine is asked
logprob_start_len = s; s = len - 1 scores no row (entry 0 only).
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from ingress.edge.request_record import current_request_id
from ingress.errors import InvalidRequest, enforce, located
from ingress.images import ImageBlob, expanded, from_image_data
from ingress.request_checks import check_request
from ingress.sglang.schemas import SGLangBody, SGLangSampling
from protocol import GenerateRequest, ImageData, ModelInfo, SamplingParams
from protocol.sampling import split_token_ids, stop_list
from rulebook import images as img
from rulebook import rules
from rulebook import sglang as sg

Tokenize = Callable[[str], Awaitable[list[int]]]


@dataclass
class Item:
    """One prompt (one of its n samples) of an SGLang body: the worker request and how its answer is written."""

    request: GenerateRequest
    # SGLang's boundary: -1 = output tokens only; else entry 0 of input_* is input_ids[start] (null).
    start: int
    input_ids: list[int] | None
    return_logprob: bool
    top_logprobs_num: int
    token_ids_logprob: bool
    return_text: bool


@dataclass
class Parsed:
    """A validated SGLang body: its items in answer order, and whether the answer is a list."""

    body: SGLangBody
    samplings: list[SGLangSampling]
    single: bool
    items: list[Any]  # prompts: str or list[int]


def parse(raw: dict[str, Any]) -> Parsed:
    """The body's types (a pydantic ValidationError: the route's 422) and its shape rules (InvalidRequest)."""
    enforce(sg.mixed_shapes(raw))
    enforce(sg.unsupported_field(raw))
    enforce(sg.unknown_field(raw, SGLangBody.model_fields))
    body = SGLangBody.model_validate(raw)
    if (body.text is None) == (body.input_ids is None):
        raise InvalidRequest(sg.ONE_PROMPT, param="text")
    prompts: Any = body.text if body.text is not None else body.input_ids
    if isinstance(prompts, list) and not prompts:
        field = "input_ids" if body.text is None else "text"
        raise InvalidRequest(sg.EMPTY_LIST.format(field=field), param=field)
    single = isinstance(prompts, str) or isinstance(prompts[0], int)
    items = [prompts] if single else list(prompts)
    raw_sampling = body.sampling_params
    dicts = raw_sampling if isinstance(raw_sampling, list) else [raw_sampling or {}] * len(items)
    enforce(sg.per_item_length("sampling_params", raw_sampling, len(items)))
    samplings = []
    for i, d in enumerate(dicts):
        enforce(sg.unsupported_sampling(d))
        try:
            samplings.append(SGLangSampling.model_validate(d))
        except ValidationError as exc:
            where = ("sampling_params", i) if isinstance(raw_sampling, list) else ("sampling_params",)
            raise SamplingTypeError(located(exc.errors(include_url=False), *where)) from exc
    return Parsed(body, samplings, single, items)


class SamplingTypeError(Exception):
    """A type error inside sampling_params: the route answers it as its 422 (errors located in the body)."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__("sampling_params")
        self.errors = errors


def image_blobs(parsed: Parsed) -> list[list[ImageBlob]]:
    """Each prompt's images as sent (SGLang's forms: a single prompt's string or list, a batch's entry per prompt);
    only data: URLs and base64 bytes are read (ingress/images.py)."""
    value, n_items = parsed.body.image_data, len(parsed.items)
    if value is None or value == []:
        return [[] for _ in range(n_items)]
    if parsed.single:
        if isinstance(value, list) and not all(isinstance(v, str) for v in value):
            raise InvalidRequest(sg.IMAGE_DATA_SHAPE, param="image_data")
        entries: list[Any] = [value]
    else:
        if not isinstance(value, list):
            raise InvalidRequest(sg.IMAGE_DATA_SHAPE, param="image_data")
        enforce(sg.per_item_length("image_data", value, n_items))
        entries = value
    out = []
    for i, entry in enumerate(entries):
        strings = [] if entry is None else [entry] if isinstance(entry, str) else entry
        where = "image_data" if parsed.single else f"image_data[{i}]"
        out.append([from_image_data(v, f"{where} image {j}", "image_data") for j, v in enumerate(strings)])
    return out


async def build(parsed: Parsed, info: ModelInfo, tokenize: Tokenize,
                images: list[list[ImageData]] | None = None) -> list[Item]:
    """The items' worker requests, validated by the seed's rules; a text prompt is tokenized first when its answer
    needs its ids: input rows, and max_new_tokens bounded by the context left, as SGLang's scheduler bounds it.
    `images`: each prompt's images, preprocessed; its placeholder runs are expanded to them."""
    body, n_items = parsed.body, len(parsed.items)
    per_item = images or [[] for _ in range(n_items)]
    ns = [s.n if s.n is not None else 1 for s in parsed.samplings]
    enforce(sg.parallel_samples(ns))
    n = ns[0]
    for name in ("return_logprob", "logprob_start_len", "top_logprobs_num"):
        value = getattr(body, name)
        enforce(sg.per_item_length(name, value, n_items))
        if n > 1 and isinstance(value, list):
            raise InvalidRequest(sg.N_WITH_LISTS.format(name=name), param=name)
    if body.token_ids_logprob_positions is not None:
        if body.token_ids_logprob is not None:
            raise InvalidRequest(sg.POSITIONS_WITH_FLAT, param="token_ids_logprob_positions")
        if not parsed.single or n > 1:
            raise InvalidRequest(sg.POSITIONS_SINGLE, param="token_ids_logprob_positions")
    token_ids = _token_ids_per_item(body.token_ids_logprob, parsed.single, n_items)
    per_prompt = body.token_ids_logprob is not None and token_ids[0] is not body.token_ids_logprob
    if n > 1 and per_prompt:
        raise InvalidRequest(sg.N_WITH_LISTS.format(name="token_ids_logprob"), param="token_ids_logprob")
    rids = _rids(body.rid, n_items, n, parsed.single)
    out: list[Item] = []
    for copy in range(n):
        for i, prompt in enumerate(parsed.items):
            j = copy * n_items + i
            try:
                out.append(await _item(parsed, i, prompt, token_ids[i], rids[j], info, tokenize, per_item[i]))
            except InvalidRequest as exc:
                if parsed.single and n == 1:
                    raise
                raise InvalidRequest(rules.ITEM.format(i=j, message=exc.message), param=exc.param) from exc
    return out


def _pick(value: Any, i: int, default: Any) -> Any:
    if value is None:
        return default
    return value[i] if isinstance(value, list) else value


def _token_ids_per_item(value: Any, single: bool, n_items: int) -> list[Any]:
    """SGLang's forms: one list for every prompt, or (a batch) one per prompt; a single prompt's list of lists is
    per scored row (rayscore's on-policy distillation form), as is a batch's list of lists of lists per prompt."""
    if not value:
        return [None] * n_items
    if single or not isinstance(value[0], list):
        return [value] * n_items
    enforce(sg.per_item_length("token_ids_logprob", value, n_items))
    return list(value)


def _rids(rid: str | list[str] | None, n_items: int, n: int, single: bool) -> list[str]:
    """SGLang's ids: a single prompt's own; a batch's string becomes `{rid}_{i}`, a list one per prompt; n > 1 adds
    the copy's number, so every worker request has its own id."""
    if single and n == 1:
        if isinstance(rid, list):
            raise InvalidRequest(rules.RID_NOT_STRING, param="rid")
        return [rid or current_request_id() or uuid.uuid4().hex]
    if isinstance(rid, list):
        if len(rid) != n_items:
            raise InvalidRequest(rules.RID_PER_ITEM.format(n=n_items), param="rid")
        base = rid
    else:
        stem = rid or current_request_id() or uuid.uuid4().hex
        base = [f"{stem}_{i}" for i in range(n_items)]
    ids = base if n == 1 else [f"{r}_{c}" for c in range(n) for r in base]
    if len(set(ids)) != len(ids):
        raise InvalidRequest(rules.RID_REPEATED, param="rid")
    return ids


async def _item(parsed: Parsed, i: int, prompt: Any, token_ids: Any, rid: str, info: ModelInfo,
                tokenize: Tokenize, images: list[ImageData]) -> Item:
    body, sp = parsed.body, parsed.samplings[i]
    want = bool(_pick(body.return_logprob, i, False))
    start = int(_pick(body.logprob_start_len, i, -1))
    k = int(_pick(body.top_logprobs_num, i, 0))
    if start >= 0 and not want:
        raise InvalidRequest(rules.START_NEEDS_LOGPROB, param="logprob_start_len")
    if start < -1:
        enforce(sg.start_in_prompt(start, 0))
    if isinstance(prompt, list):
        ids: list[int] = list(prompt)
    else:  # SGLang's tokenizer manager tokenizes first: the ids give the input rows and bound max_new_tokens
        enforce(rules.untokenizable(prompt, info.max_model_len, info.prompt_chars_per_token, "text"))
        ids = await tokenize(prompt)
        enforce(rules.empty_ids(ids))
    # Positions count in the expanded prompt (logprob_start_len, the rows): what the model sees.
    ids = expanded(ids, images, info, "image_data")
    if images:
        enforce(img.image_context(len(ids), [im.num_tokens for im in images], 0, info.max_model_len, "image_data"))
    if start >= 0:
        enforce(sg.start_in_prompt(start, len(ids)))
    positions = body.token_ids_logprob_positions
    if positions is not None:  # per position -> per scored row: row i (position start + i) scores ids[start + i + 1]
        enforce(sg.positions_violation(positions, start, len(ids)))
        token_ids = [list(row) for row in positions[start + 1:]] if start >= 0 else None
    scored_rows = len(ids) - start - 1 if start >= 0 else 0
    enforce(rules.context_too_long(len(ids), 0, info.max_model_len))
    if sp.max_new_tokens is None:  # "up to the context": what the KV cache of one request holds, too
        max_new = min(info.max_model_len, info.kv_capacity_tokens or info.max_model_len) - len(ids)
    else:
        enforce(sg.negative_max_new(sp.max_new_tokens))
        # SGLang's scheduler bounds max_new_tokens by the context left (init_req_max_new_tokens): never an error.
        max_new = min(sp.max_new_tokens, info.max_model_len - len(ids))
    max_new = max(0, max_new)
    enforce(sg.nothing_to_do(max_new, scored_rows))
    if token_ids and isinstance(token_ids[0], list) and max_new > 0:
        raise InvalidRequest(sg.TOKEN_IDS_ON_OUTPUT, param="token_ids_logprob")
    top_k = sp.top_k if sp.top_k is not None else -1
    enforce(rules.token_id_shapes_mixed(token_ids))
    flat_ids, row_ids = split_token_ids(token_ids if token_ids else None)
    params = SamplingParams(
        max_tokens=max_new, return_logprob=want, logprob_start_len=start if scored_rows > 0 else -1,
        top_logprobs_num=k, input_logprob_temperature=body.input_logprob_temperature,
        token_ids_logprob=flat_ids, token_id_rows=row_ids,
        temperature=sp.temperature if sp.temperature is not None else 1.0,
        top_p=sp.top_p if sp.top_p is not None else 1.0,
        top_k=-1 if top_k >= info.vocab_size else top_k,  # SGLang's "whole vocabulary" is 1 << 30
        min_p=sp.min_p if sp.min_p is not None else 0.0, seed=sp.sampling_seed,
        stop=stop_list(sp.stop),
        stop_token_ids=list(sp.stop_token_ids or []), ignore_eos=bool(sp.ignore_eos),
        skip_special_tokens=sp.skip_special_tokens is not False, include_stop_str_in_output=bool(sp.no_stop_trim))
    request = GenerateRequest(rid=rid, input_ids=ids, params=params, images=images or None)
    check_request(request, info, with_generation=True)
    return Item(request, start if want else -1, ids, want, k if want else 0, bool(token_ids) and want,
                body.return_text_in_logprobs)
