"""The rules of /classify and /pooling, and the one check every route that runs a causal LM makes first (a
classifier serves only these routes). Messages are rulebook/pooling.py's."""

from __future__ import annotations

from ingress.classify.schemas import ClassifyBody, Input
from ingress.errors import InvalidRequest
from protocol import ModelInfo
from rulebook import pooling, rules

_VLLM_FIELDS = frozenset({"model", "input", "use_activation", "add_special_tokens", "user"})
_SGLANG_FIELDS = frozenset({"text", "input_ids", "rid"})


def check_classifier(info: ModelInfo, route: str) -> None:
    if not info.classifier:
        raise InvalidRequest(pooling.not_a_classifier(route).message)


def is_sglang(body: ClassifyBody) -> bool:
    """SGLang's shape (`text` / `input_ids`) or vLLM's (`input`), by the fields the body sets; both or neither: 400."""
    sent = body.model_fields_set
    vllm, sglang = sent & _VLLM_FIELDS, sent & _SGLANG_FIELDS
    if vllm and sglang:
        raise InvalidRequest(pooling.BOTH_SHAPES, param=sorted(sglang)[0])
    if body.input is None and body.text is None and body.input_ids is None:
        raise InvalidRequest(pooling.NO_INPUT, param="input")
    if body.text is not None and body.input_ids is not None:
        raise InvalidRequest(pooling.TEXT_AND_IDS, param="text")
    return bool(sglang)


def vllm_prompts(value: Input) -> list[str] | list[list[int]]:
    """vLLM's `input`: one text, texts, one prompt's ids or lists of ids -> the prompts."""
    if isinstance(value, str):
        return [value]
    if not value:
        raise InvalidRequest(pooling.EMPTY_INPUT, param="input")
    if isinstance(value[0], int):
        return [value]  # type: ignore[list-item]  # one prompt's ids
    return value  # type: ignore[return-value]  # texts, or lists of ids


def sglang_prompts(body: ClassifyBody) -> tuple[list[str] | list[list[int]], bool]:
    """SGLang's `text` / `input_ids` -> (the prompts, whether the body was a batch)."""
    if body.text is not None:
        return ([body.text], False) if isinstance(body.text, str) else (body.text, True)
    ids = body.input_ids or []
    if not ids:
        raise InvalidRequest(rules.EMPTY_INPUT_IDS, param="input_ids")
    if isinstance(ids[0], int):
        return [ids], False  # type: ignore[list-item]  # one prompt's ids
    return ids, True  # type: ignore[return-value]  # a batch of id lists


def sglang_rids(rid: str | list[str] | None, n: int, batch: bool, base: str) -> list[str]:
    if rid is None:
        return [f"{base}-{i}" for i in range(n)] if batch else [base]
    rids = [rid] if isinstance(rid, str) else rid
    if len(rids) != n or len(set(rids)) != n:
        raise InvalidRequest(pooling.RIDS.format(n=n), param="rid")
    return rids


def check_ids(i: int, ids: list[int], info: ModelInfo, param: str) -> None:
    """Prompt i's ids: not empty, in the vocabulary, within the context."""
    broken = (rules.empty_ids(ids) or rules.token_out_of_range(ids, info.vocab_size)
              or rules.context_too_long(len(ids), 0, info.max_model_len))
    if broken is not None:
        raise InvalidRequest(pooling.PROMPT_I.format(i=i, message=broken.message), param=param)
