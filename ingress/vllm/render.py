"""Canonical answers -> vLLM 0.32's token-out bodies (GenerateTokensResponse and its stream chunks), field by field
as vLLM writes them (docs/vllm.md):

- `prompt_logprobs`: row 0 null (`{}` with flat_logprobs, vLLM's FlatLogprobs), then per prompt token a dict from
  token id (a string, as JSON writes vLLM's int keys) to `{logprob, rank, decoded_token}`: the prompt token with its
  true rank, then the k most likely with ranks 1..k; a token that is both takes the later entry's rank at the first
  entry's place (vLLM builds the dict by assignment). -inf is written -9999.0 (vLLM's clamp).
- `decoded_token`: each id decoded alone, and where that ends in U+FFFD (an incomplete UTF-8 sequence) vLLM's
  correction from up to 4 preceding prompt tokens, or "" when the sequence is still incomplete there.
- `prompt_token_id_logprobs`: base64 of a .npy float32 array [rows, width] (vLLM's numpy2base64), -1 pads at -inf.
- `choices[0].logprobs.content`: per generated token its id, value and rank, and `top_logprobs` the first max(k, 1)
  entries of [sampled, alternatives...] (the alternatives: the k most likely, ranks 1..k, or logprob_token_ids in
  their order, ranked 1..n as vLLM numbers them).
- `weight_versions`: one span over the generated tokens, from the weights the request ran on.
"""

from __future__ import annotations

import base64
import io
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import numpy as np

from ingress.finish import openai_finish, vllm_stop_reason
from ingress.vllm.parse import TokenRequest
from protocol import RequestOutput

FLOOR = -9999.0  # vLLM's stand-in for -inf, which JSON cannot write
REPLACEMENT = "\ufffd"
Decode = Callable[[list[int]], Awaitable[str]]


def _value(v: float) -> float:
    return FLOOR if v == float("-inf") else v


def needed_ids(tr: TokenRequest, chunk: RequestOutput) -> set[int]:
    """The ids whose text the prompt_logprobs of `chunk` names (nothing else of this route has text)."""
    if tr.prompt_logprobs is None or not tr.detokenize:
        return set()
    k = tr.prompt_logprobs
    ids = {t for _, t in chunk.input_token_logprobs or ()}
    for row in chunk.input_top_logprobs or ():
        ids.update(t for _, t in row[:k])
    return ids


async def _corrected(token: int, context: list[int], texts: Mapping[int, str], decode: Decode) -> str:
    """vLLM's _correct_decoded_token: the text `token` completes after up to 4 context tokens, else ""."""
    for n in range(1, min(len(context), 4) + 1):
        ctx = context[-n:]
        full = await decode([*ctx, token])
        if full.endswith(REPLACEMENT):
            continue
        clean_end = len(ctx)
        for j in range(len(ctx) - 1, -1, -1):
            if texts.get(ctx[j], "").endswith(REPLACEMENT):
                clean_end = j
            else:
                break
        prefix = await decode(ctx[:clean_end]) if clean_end > 0 else ""
        if full.startswith(prefix):
            return full[len(prefix):]
        common = 0
        for a, b in zip(prefix, full, strict=False):
            if a != b:
                break
            common += 1
        return full[common:]
    return ""


async def prompt_logprobs_json(tr: TokenRequest, chunk: RequestOutput, texts: Mapping[int, str],
                               decode: Decode) -> list[dict[str, dict[str, Any]] | None]:
    k = tr.prompt_logprobs or 0
    rows = chunk.input_token_logprobs or []
    tops = chunk.input_top_logprobs or []
    ranks = chunk.input_token_ranks or []
    out: list[dict[str, dict[str, Any]] | None] = [{} if tr.flat else None]
    prompt_tokens: list[int] = []  # the tokens of the rows so far: the context of vLLM's correction
    for j, (value, token) in enumerate(rows):
        entries = [(token, value, ranks[j] if j < len(ranks) else None)]
        entries += [(tt, tv, place) for place, (tv, tt) in enumerate(tops[j][:k] if j < len(tops) else (), start=1)]
        row: dict[str, dict[str, Any]] = {}
        for tid, v, rank in entries:
            text: str | None = None
            if tr.detokenize:
                text = texts[tid]
                if text.endswith(REPLACEMENT):
                    text = await _corrected(tid, prompt_tokens[-4:], texts, decode)
            row[str(tid)] = {"logprob": _value(v), "rank": rank, "decoded_token": text}
        out.append(row)
        prompt_tokens.append(token)
    return out


def token_id_logprobs_b64(tr: TokenRequest, chunk: RequestOutput) -> str | None:
    """The [rows, width] scores of prompt_logprob_token_ids as vLLM's numpy2base64 writes them."""
    if tr.id_rows is None:
        return None
    width = max(map(len, tr.id_rows))
    scores = np.full((len(tr.id_rows), width), -np.inf, dtype=np.float32)
    got = (chunk.input_token_ids_logprobs or [])[tr.id_rows_offset:]
    for r, (asked, values) in enumerate(zip(tr.id_rows, got, strict=True)):
        real = iter(values)
        for c, tid in enumerate(asked):
            if tid >= 0:
                scores[r, c] = next(real)[0]
    buf = io.BytesIO()
    np.save(buf, scores, allow_pickle=False)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def logprobs_json(tr: TokenRequest, chunk: RequestOutput) -> dict[str, Any] | None:
    if tr.logprobs is None:  # vLLM's route answers logprob_token_ids only with `logprobs` (equal to their count)
        return None
    n = tr.logprobs
    content = []
    tops = chunk.output_top_logprobs or []
    picked = chunk.output_token_ids_logprobs or []
    ranks = chunk.output_token_ranks or []
    for i, (value, token) in enumerate(chunk.output_token_logprobs or ()):
        if tr.logprob_token_ids is not None:
            alts = [(tt, tv, place) for place, (tv, tt) in enumerate(picked[i] if i < len(picked) else (), start=1)]
        else:
            alts = [(tt, tv, place) for place, (tv, tt) in enumerate(tops[i][:n] if i < len(tops) else (), start=1)]
        # The sampled token's rank over the whole row it was sampled from (the engine counts, as vLLM does).
        rank = ranks[i] if i < len(ranks) else None
        entries: dict[int, dict[str, Any]] = {token: {"token_id": token, "logprob": _value(value), "rank": rank}}
        for tid, v, place in alts:
            entries[tid] = {"token_id": tid, "logprob": _value(v), "rank": place}
        first = entries[token]
        content.append({**first, "top_logprobs": list(entries.values())[:max(n, 1)]})
    return {"content": content}


def _weight_versions(chunk: RequestOutput, generated: int) -> list[dict[str, Any]] | None:
    if chunk.weight_version is None:
        return None
    return [{"version": chunk.weight_version, "start": 0, "end": generated}]


def mm_placeholders(tr: TokenRequest) -> dict[str, list[dict[str, int]]] | None:
    """vLLM's placeholder ranges (with return_token_ids, when the prompt has images): each image's run."""
    if not (tr.return_token_ids and tr.image_runs):
        return None
    return {"image": [{"offset": start, "length": length} for start, length in tr.image_runs]}


def usage_json(chunk: RequestOutput, prompt_len: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_len, "total_tokens": prompt_len + chunk.completion_tokens,
            "completion_tokens": chunk.completion_tokens, "prompt_tokens_details": None,
            "completion_tokens_details": None}


async def answer_json(tr: TokenRequest, whole: RequestOutput, model: str, texts: Mapping[int, str],
                      decode: Decode) -> dict[str, Any]:
    """The non-streamed answer (GenerateTokensResponse.model_dump())."""
    ids = tr.request.input_ids or []
    prompt_logprobs = None
    if tr.prompt_logprobs is not None:
        prompt_logprobs = await prompt_logprobs_json(tr, whole, texts, decode)
    choice = {"index": 0, "finish_reason": openai_finish(whole) or "stop",
              "stop_reason": vllm_stop_reason(whole, tr.request.params.stop_token_ids),
              "token_ids": list(whole.new_token_ids), "routed_experts": None, "sampling_mask": None,
              "weight_versions": _weight_versions(whole, len(whole.new_token_ids)),
              "logprobs": logprobs_json(tr, whole)}
    return {"request_id": tr.request.rid, "model": model, "created": int(time.time()),
            "usage": usage_json(whole, len(ids)), "prompt_logprobs": prompt_logprobs,
            "prompt_token_id_logprobs": token_id_logprobs_b64(tr, whole),
            "prompt_token_ids": list(ids) if tr.return_token_ids else None, "mm_placeholders": mm_placeholders(tr),
            "metrics": None, "kv_transfer_params": None, "ec_transfer_params": None, "output_mode": "tokens",
            "choices": [choice]}


def stream_chunk_json(tr: TokenRequest, chunk: RequestOutput, first: bool, generated: int) -> dict[str, Any]:
    """One streamed chunk (GenerateTokensStreamResponse): the new ids; the prompt's ids on the first with
    return_token_ids; weight_versions on the final one only."""
    finish = openai_finish(chunk)
    choice = {"index": 0, "finish_reason": finish,
              "stop_reason": vllm_stop_reason(chunk, tr.request.params.stop_token_ids),
              "token_ids": list(chunk.new_token_ids), "routed_experts": None, "sampling_mask": None,
              "weight_versions": _weight_versions(chunk, generated) if finish is not None else None,
              "logprobs": logprobs_json(tr, chunk)}
    out: dict[str, Any] = {"request_id": tr.request.rid, "usage": None}
    if first and tr.return_token_ids:
        out["prompt_token_ids"] = list(tr.request.input_ids or [])
        if tr.image_runs:
            out["mm_placeholders"] = mm_placeholders(tr)
    if tr.continuous_usage:
        out["usage"] = usage_json(chunk, len(tr.request.input_ids or []))
    return {**out, "output_mode": "tokens", "choices": [choice]}


def usage_chunk_json(tr: TokenRequest, last: RequestOutput) -> dict[str, Any]:
    """The final usage chunk of a stream with stream_options.include_usage (vLLM's exclude_none dump)."""
    usage = {k: v for k, v in usage_json(last, len(tr.request.input_ids or [])).items() if v is not None}
    return {"request_id": tr.request.rid, "usage": usage, "output_mode": "tokens", "choices": []}
