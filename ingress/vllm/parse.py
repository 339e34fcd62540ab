"""POST /inference/v1/generate's body -> one canonical request (protocol's GenerateRequest) and what its answer
renders: a parse, checked by vLLM's rules (rulebook/vllm_generate.py) and then by the contract's rules on the
canonical request (ingress/request_checks.py), as every dialect is.

How vLLM's scoring fields map onto the canonical request:
- prompt_logprobs k: rows from position 0 (logprob_start_len 0) with ranks and k alternatives (-1: the vocabulary);
- prompt_logprob_token_ids rows from prompt_logprob_start s: the engine's per-row candidate ids (token_id_rows), the
  `-1` pads taken out here and put back (as -inf) by the render; when prompt_logprobs also starts the rows at 0, the
  s rows before get empty lists;
- logprob_token_ids: the flat token_ids_logprob, reported at every generated token;
- logprobs k: the generated tokens' values and k alternatives (top_logprobs_num is the wider of the two asks; each
  answer field keeps its own k).

Images (content_parts, decoded by the route): token_ids' placeholder runs are expanded to the images' token counts
first, so every position above (prompt_logprob_start, the rows, prompt_token_ids) counts the expanded prompt.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ingress.errors import InvalidRequest, enforce
from ingress.images import expanded
from ingress.request_checks import check_request
from ingress.vllm.schemas import TokenGenerateBody
from protocol import GenerateRequest, ImageData, ModelInfo, SamplingParams
from protocol.images import placeholder_runs
from protocol.sampling import stop_list
from rulebook import images as img
from rulebook import vllm_generate as vg

# The prefix vLLM gives the engine's request id (and the answer's request_id).
RID_PREFIX = "generate-tokens-"


@dataclass(frozen=True)
class TokenRequest:
    """A parsed body: the worker request and how its answer renders."""

    request: GenerateRequest
    stream: bool
    include_usage: bool
    continuous_usage: bool
    return_token_ids: bool
    logprobs: int | None  # per generated token: k alternatives; None: no `logprobs`
    logprob_token_ids: list[int] | None
    prompt_logprobs: int | None  # k per prompt position (the vocabulary for -1); None: not asked
    # prompt_logprob_token_ids as sent ([rows][k], -1 pads) and the row offset of its first row in the engine's rows.
    id_rows: list[list[int]] | None
    id_rows_offset: int
    flat: bool
    detokenize: bool
    # (offset, length) of each image's placeholder run in the expanded prompt: vLLM's mm_placeholders["image"].
    image_runs: tuple[tuple[int, int], ...] = ()


def check_fields(raw: Mapping[str, Any]) -> None:
    """Every field of the raw body and of its sampling_params: honoured, neutral, or a 400 naming it."""
    for name, value in raw.items():
        enforce(vg.field_violation(name, value, vg.HONOURED_BODY, vg.REFUSED_BODY))
    sp = raw.get("sampling_params")
    if isinstance(sp, Mapping):
        for name, value in sp.items():
            enforce(vg.field_violation(name, value, vg.HONOURED_SAMPLING, vg.REFUSED_SAMPLING, "sampling_params."))


def parse(body: TokenGenerateBody, info: ModelInfo, max_logprobs: int,
          images: list[ImageData] | None = None) -> TokenRequest:
    """The body's canonical request; raise InvalidRequest with the first rule it breaks. images: content_parts'
    images, decoded."""
    sp = body.sampling_params
    if any(t < 0 for t in body.token_ids):
        raise InvalidRequest(vg.NEGATIVE_IDS, param="token_ids")
    enforce(vg.sampling_violation(sp.model_dump(exclude_none=True)))
    stream = bool(body.stream)
    images = images or []
    ids = expanded(list(body.token_ids), images, info, "content_parts")
    vocab = info.vocab_size
    k_out = vocab if sp.logprobs == -1 else sp.logprobs
    k_prompt = vocab if sp.prompt_logprobs == -1 else sp.prompt_logprobs
    for what, k in (("sample logprobs", k_out), ("prompt logprobs", k_prompt)):
        if k is not None and k > max_logprobs:
            raise InvalidRequest(vg.OVER_MAX.format(what=what, value=k, limit=max_logprobs),
                                 param="logprobs" if what.startswith("sample") else "prompt_logprobs")
    enforce(vg.logprob_ids_violation(sp.logprob_token_ids, sp.logprobs, vocab))
    enforce(vg.rows_violation(sp.prompt_logprob_token_ids, sp.prompt_logprob_start, len(ids), max_logprobs, vocab))
    rows = sp.prompt_logprob_token_ids
    if rows is not None and stream:
        raise InvalidRequest(vg.PROMPT_IDS_STREAM, param="prompt_logprob_token_ids")
    # vLLM's stream schema has no field for prompt logprobs: a stream does not compute them.
    k_prompt = None if stream else k_prompt
    scores_prompt = (k_prompt is not None or rows is not None) and len(ids) >= 2
    start = 0 if k_prompt is not None else (sp.prompt_logprob_start or 0)
    offset = (sp.prompt_logprob_start or 0) - start if rows is not None else 0
    id_rows = None if rows is None else [[] for _ in range(offset)] + [[t for t in r if t >= 0] for r in rows]
    max_tokens = sp.max_tokens if sp.max_tokens is not None else max(info.max_model_len - len(ids), 0)
    if sp.max_tokens is None:
        enforce(vg.sampling_violation({"max_tokens": max_tokens}))
    if images:
        enforce(img.image_context(len(ids), [im.num_tokens for im in images], max_tokens, info.max_model_len,
                                  "content_parts"))
    params = SamplingParams(
        max_tokens=max_tokens, temperature=1.0 if sp.temperature is None else sp.temperature,
        top_p=1.0 if sp.top_p is None else sp.top_p, top_k=-1 if sp.top_k is None else sp.top_k,
        min_p=0.0 if sp.min_p is None else sp.min_p, seed=None if sp.seed in (None, -1) else sp.seed,
        stop=stop_list(sp.stop),
        stop_token_ids=list(dict.fromkeys(sp.stop_token_ids or [])), ignore_eos=bool(sp.ignore_eos),
        skip_special_tokens=sp.skip_special_tokens is not False,
        include_stop_str_in_output=bool(sp.include_stop_str_in_output),
        return_logprob=k_out is not None or sp.logprob_token_ids is not None or scores_prompt,
        logprob_start_len=start if scores_prompt else -1,
        top_logprobs_num=max(k_out or 0, k_prompt or 0),
        token_ids_logprob=list(sp.logprob_token_ids) if sp.logprob_token_ids is not None else None,
        token_id_rows=id_rows if scores_prompt else None,
        return_input_ranks=k_prompt is not None and scores_prompt, return_output_ranks=k_out is not None)
    rid = RID_PREFIX + (body.request_id or uuid.uuid4().hex)
    request = GenerateRequest(rid=rid, input_ids=ids, params=params, images=images or None)
    check_request(request, info, with_generation=True)
    opts = body.stream_options
    return TokenRequest(
        request=request, stream=stream, include_usage=bool(stream and opts is not None and opts.include_usage),
        continuous_usage=bool(stream and opts is not None and opts.continuous_usage_stats),
        return_token_ids=bool(body.return_token_ids), logprobs=k_out,
        logprob_token_ids=sp.logprob_token_ids, prompt_logprobs=k_prompt,
        id_rows=rows if scores_prompt else None, id_rows_offset=offset, flat=bool(sp.flat_logprobs),
        detokenize=sp.detokenize is not False,
        image_runs=tuple(placeholder_runs(ids, info.image_token_id))
        if images and info.image_token_id is not None else ())  # an id, 0 too: never its truth value


def engine_rid(request_id: str) -> str:
    """The engine's id of a request named by its body's request_id or by the answer's (prefixed) one."""
    return request_id if request_id.startswith(RID_PREFIX) else RID_PREFIX + request_id
