"""SGLang's answer for one item: `text`, `output_ids`, `meta_info`, as its tokenizer manager writes them.

Logprobs are `[value, token_id, text-or-null]` triples (text with return_text_in_logprobs). The input lists are
aligned with input_ids[logprob_start_len:], entry 0 null (SGLang pads the boundary position, whose own token is not
scored): they are the seed's rows with that entry in front. With logprob_start_len -1 they are empty (SGLang's newer
rule: output tokens only). Top and token-id lists appear only when asked, as in SGLang. A streamed event is the
answer so far (SGLang's default stream_output: cumulative text, ids and logprobs); e2e_latency only once finished.
"""

from __future__ import annotations

from typing import Any

from ingress.finish import sglang_finish
from ingress.sglang.translate import Item
from protocol import RequestOutput, compact

Texts = dict[int, str]


def token_ids_needed(item: Item, chunk: RequestOutput) -> set[int]:
    """The token ids whose text return_text_in_logprobs puts in the answer."""
    if not (item.return_text and item.return_logprob):
        return set()
    ids: set[int] = set()
    if item.start >= 0 and item.input_ids is not None:
        ids.update(item.input_ids[item.start:])
    for rows in (chunk.input_top_logprobs, chunk.output_top_logprobs, chunk.input_token_ids_logprobs,
                 chunk.output_token_ids_logprobs):
        for row in rows or ():
            ids.update(t for _, t in row)
    ids.update(t for _, t in chunk.output_token_logprobs or ())
    return ids


def _triple(value: float | None, tok: int, texts: Texts | None) -> list[Any]:
    return [value, tok, texts.get(tok) if texts is not None else None]


def _rows(rows: list[list] | None, texts: Texts | None) -> list[list[Any]]:
    return [_triple(v, t, texts) for v, t in rows or ()]


def _tops(rows: list[list[list]] | None, texts: Texts | None) -> list[list[list[Any]] | None]:
    return [_rows(row, texts) or None for row in rows or ()]


def answer_json(item: Item, chunk: RequestOutput, texts: Texts | None, e2e_latency: float | None,
                flat: bool = False) -> dict[str, Any]:
    """SGLang's answer for `chunk`, an item's whole answer or its answer so far (a streamed event); flat: the
    logprob fields in the compact encoding (entry 0's null as `<field>_null_prefix`)."""
    meta: dict[str, Any] = {
        "id": chunk.request_id,
        "finish_reason": sglang_finish(chunk),
        "prompt_tokens": chunk.prompt_tokens,
        "weight_version": chunk.weight_version,
    }
    if item.return_logprob:
        _logprobs(meta, item, chunk, texts if item.return_text else None)
    meta["completion_tokens"] = chunk.completion_tokens
    meta["cached_tokens"] = chunk.cached_tokens
    if chunk.input_logprob_temperature is not None:
        meta["input_logprob_temperature"] = chunk.input_logprob_temperature
    if chunk.finished and e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if flat:
        _flatten(meta)
    return {"text": chunk.text, "output_ids": chunk.new_token_ids, "meta_info": meta}


def _logprobs(meta: dict[str, Any], item: Item, chunk: RequestOutput, texts: Texts | None) -> None:
    # A text prompt whose input rows are asked was tokenized by the ingress, so scoring items always have ids.
    scored = item.start >= 0 and item.input_ids is not None
    head = [_triple(None, item.input_ids[item.start], texts)] if scored and item.input_ids is not None else []
    # Input rows arrive with the first event; a stream's later events repeat them (SGLang's cumulative events).
    meta["input_token_logprobs"] = head + _rows(chunk.input_token_logprobs, texts)
    meta["output_token_logprobs"] = _rows(chunk.output_token_logprobs, texts)
    if item.top_logprobs_num > 0:
        meta["input_top_logprobs"] = ([None] + _tops(chunk.input_top_logprobs, texts)) if scored else []
        meta["output_top_logprobs"] = _tops(chunk.output_top_logprobs, texts)
    if item.token_ids_logprob:
        meta["input_token_ids_logprobs"] = ([None] + _tops(chunk.input_token_ids_logprobs, texts)) if scored else []
        meta["output_token_ids_logprobs"] = _tops(chunk.output_token_ids_logprobs, texts)


def _flatten(meta: dict[str, Any]) -> None:
    """Each logprob field as protocol/compact.py's flat arrays, SGLang's field names; an input field's leading null
    entry (nothing predicts the boundary token) is `<field>_null_prefix: 1`, as OpenAI's null first token is."""
    for name in ("input_token_logprobs", "output_token_logprobs"):
        if name in meta:
            rows = meta.pop(name)
            head = 1 if rows and rows[0][0] is None else 0
            meta.update(compact.encode_token_rows(name, rows[head:], null_prefix=head))
    for name in ("input_top_logprobs", "output_top_logprobs", "input_token_ids_logprobs", "output_token_ids_logprobs"):
        if name in meta:
            rows = meta.pop(name)
            head = 1 if rows and rows[0] is None else 0
            meta.update(compact.encode_top_rows(name, rows[head:], null_prefix=head))
