"""The contract's 400 rules on the canonical request (protocol's GenerateRequest), in the contract's order (first
failure wins): every dialect that parses a body into generate requests (the seed /generate, SGLang's /generate)
checks what it built here, once, and no dialect is validated through another's body shape.

Pure functions of the request and the worker's ModelInfo: no I/O. The rules are the rulebook's (rulebook/rules.py),
with its messages; what only a body can break (a second prompt form's value, image input, candidate ids that mix
the two shapes) is the dialect's own parse, which says it here through the flags.
"""

from __future__ import annotations

from ingress.errors import InvalidRequest, enforce
from protocol import GenerateRequest, ModelInfo, SamplingParams
from rulebook import pooling, rules

# Modes in which input tokens can be scored: values come straight from the raw logits.
SCORING_MODES = ("raw_logits", "raw_logprobs")


def check_causal(info: ModelInfo, what: str) -> None:
    """A route that generates or scores tokens (`what`), on a classifier: 400 naming the routes it serves."""
    if info.classifier:
        raise InvalidRequest(pooling.classifier_only(info.num_labels, what).message)


def check_request(req: GenerateRequest, info: ModelInfo, *, with_generation: bool = False) -> None:
    """A canonical request (its prompt as ids) against the contract's rules: `check_prompt` of its parts."""
    check_prompt(req.params, info, ids=req.input_ids, with_generation=with_generation)


def check_prompt(p: SamplingParams, info: ModelInfo, *, ids: list[int] | None = None, text: str | None = None,
                 images: bool = False, with_generation: bool = False, prompt_len: int | None = None) -> None:
    """Raise InvalidRequest with the first failing rule's message; return when the prompt and its parameters are
    valid. The prompt is the body's: `ids`, or a `text` not tokenized yet (exactly one of them, rule 4).

    `images`: the body sent image input (rule 7, refused). `with_generation`: input-token scoring may come with
    generated tokens (SGLang's dialect); the contract's rule 9.3 (scoring only) is the seed shape's. `prompt_len`: the
    token count of a text prompt when the caller knows it; otherwise rule 11 for a text prompt is checked on its ids
    once tokenized (`check_tokenized`).
    """
    k = p.top_logprobs_num
    # 1-3: logprob options.
    enforce(rules.negative_top_logprobs(k))
    if k > 0 and not p.return_logprob:
        raise InvalidRequest(rules.TOP_K_NEEDS_LOGPROB)
    enforce(rules.logprobs_disabled(p.return_logprob, info.logprobs_mode))
    # 4-7: the prompt.
    if (text is None) == (ids is None):
        raise InvalidRequest(rules.ONE_PROMPT_FORM)
    if text == "":
        enforce(rules.empty_prompt(text))
    if ids is not None:
        enforce(rules.empty_ids(ids))
    if images:
        raise InvalidRequest(rules.NO_IMAGES)
    # 8-9: what to compute.
    enforce(rules.negative_max_tokens(p.max_tokens))
    _check_scoring(p, ids, info, with_generation)
    # 10-11: the prompt against the model.
    enforce(rules.token_out_of_range(ids or (), info.vocab_size))
    if text is not None:  # bounded and valid UTF-8 before it is tokenized
        enforce(rules.untokenizable(text, info.max_model_len, info.prompt_chars_per_token))
    n = len(ids) if ids is not None else prompt_len
    if n is not None:
        enforce(rules.context_too_long(n, p.max_tokens, info.max_model_len))
    enforce(rules.sampling_violation(p, info.vocab_size))  # rule 12


def check_tokenized(p: SamplingParams, ids: list[int], info: ModelInfo) -> None:
    """A checked text prompt's ids, once tokenized: not empty, and rule 11 (the context) on their count."""
    enforce(rules.empty_prompt(ids))
    enforce(rules.context_too_long(len(ids), p.max_tokens, info.max_model_len))


def _check_scoring(p: SamplingParams, ids: list[int] | None, info: ModelInfo, with_generation: bool) -> None:
    """Rule 9: input-token scoring (logprob_start_len >= 0) is scoring only, over given ids."""
    n = p.logprob_start_len
    if n < 0:
        enforce(rules.nothing_to_compute(p.max_tokens, scores_input=False))
        # SGLang's dialect reports a flat token_ids_logprob at generated tokens too (output_token_ids_logprobs).
        output_ids = with_generation and p.return_logprob and p.max_tokens > 0
        asked = None if output_ids else p.token_ids_logprob if p.token_ids_logprob is not None else p.token_id_rows
        enforce(rules.needs_input_scoring(p.input_logprob_temperature, asked))
        return
    if not p.return_logprob:
        raise InvalidRequest(rules.START_NEEDS_LOGPROB)
    if info.logprobs_mode not in SCORING_MODES:
        raise InvalidRequest(rules.START_NEEDS_RAW_MODE)
    if p.max_tokens != 0 and not with_generation:
        raise InvalidRequest(rules.START_NEEDS_SCORING_ONLY)
    if ids is None:
        raise InvalidRequest(rules.START_NEEDS_IDS)
    enforce(rules.start_past_end(n, len(ids)))
    enforce(rules.token_id_rows(p.token_id_rows, n, len(ids)))
