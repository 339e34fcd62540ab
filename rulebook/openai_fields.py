"""Which request fields of the OpenAI-compatible routes (/v1/completions, /v1/chat/completions) this server honours,
which it refuses, and which it accepts without use: the one list, read by the ingress's check, the docs
(docs/vllm.md) and the tests.

A field that changes what is computed and is not honoured is a 400 naming it, never silently dropped: a client that
asks for a repetition penalty must not get an answer without one and believe it has it. A refused field is accepted
only at its neutral value (the one that computes nothing different: TRL sends `repetition_penalty: 1.0` on every
generation). Fields that only annotate a request (`user`, `metadata`) are accepted and unused. Any other field is
unknown here and refused too: a typo such as `prompt_logprob` would otherwise vanish the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rulebook.rules import Violation, is_neutral

# Declared by the request bodies (ingress/openai/schemas) and honoured. A test holds the bodies' declared fields to
# these lists plus REFUSED's declared ones.
HONOURED_SHARED = (
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "include_stop_str_in_output", "stream", "stream_options", "max_tokens", "logprobs",
    "prompt_logprobs", "logprob_token_ids", "return_token_ids", "return_tokens_as_token_ids",
    "return_flat_logprobs_b64",
)
HONOURED_COMPLETIONS = (*HONOURED_SHARED, "prompt", "echo")
HONOURED_CHAT = (*HONOURED_SHARED, "messages", "max_completion_tokens", "top_logprobs")

# Accepted and unused: they label a request for the caller's own bookkeeping and change nothing computed.
ANNOTATIONS = ("user", "metadata", "store", "service_tier", "request_id", "session_id", "prompt_cache_key",
               "safety_identifier", "stream_interval")


@dataclass(frozen=True)
class Refused:
    """A known field this server does not implement: accepted only at one of its neutral values."""

    why: str
    neutral: tuple[Any, ...] = (None,)


_NO_PENALTY = "penalties are not implemented"
_NO_GRAMMAR = "constrained decoding is not implemented"
_NO_TOOLS = "tool calling is not implemented"
REFUSED: Mapping[str, Refused] = {
    # OpenAI's own, declared by the bodies (their historical messages are in ingress/openai/validation.py).
    "n": Refused("one choice per prompt", (None, 1)),
    "best_of": Refused("one choice per prompt", (None, 1)),
    "logit_bias": Refused("logit biases are not implemented", (None, {})),
    "presence_penalty": Refused(_NO_PENALTY, (None, 0, 0.0)),
    "frequency_penalty": Refused(_NO_PENALTY, (None, 0, 0.0)),
    "suffix": Refused("insertion is not implemented"),
    "tools": Refused(_NO_TOOLS, (None, [])),
    "response_format": Refused(_NO_GRAMMAR, (None, {"type": "text"})),
    # OpenAI's, not declared.
    "tool_choice": Refused(_NO_TOOLS, (None, "none")),
    "functions": Refused(_NO_TOOLS, (None, [])),
    "function_call": Refused(_NO_TOOLS, (None, "none")),
    "parallel_tool_calls": Refused(_NO_TOOLS, (None, True, False)),
    "modalities": Refused("the served model is text-only", (None, ["text"])),
    "audio": Refused("the served model is text-only"),
    "prediction": Refused("predicted outputs are not implemented"),
    "reasoning_effort": Refused("reasoning controls are not implemented"),
    "verbosity": Refused("verbosity controls are not implemented"),
    "web_search_options": Refused("web search is not implemented"),
    # vLLM's extensions.
    "repetition_penalty": Refused(_NO_PENALTY, (None, 1, 1.0)),
    "length_penalty": Refused("beam search is not implemented", (None, 1, 1.0)),
    "use_beam_search": Refused("beam search is not implemented", (None, False)),
    "min_tokens": Refused("a minimum length is not implemented", (None, 0)),
    "bad_words": Refused("banned words are not implemented", (None, [])),
    "allowed_token_ids": Refused("allow-lists are not implemented"),
    "truncate_prompt_tokens": Refused("prompts are never truncated: a long one is a 400", (None,)),
    "truncation_side": Refused("prompts are never truncated"),
    "add_special_tokens": Refused("text prompts are tokenized without special tokens", (None, False)),
    "add_generation_prompt": Refused("the assistant's turn is always opened", (None, True)),
    "continue_final_message": Refused("the assistant's turn is always opened", (None, False)),
    "echo_messages": Refused("chat echo is not implemented"),
    "chat_template": Refused("the served tokenizer's chat template is used"),
    "chat_template_kwargs": Refused("the served tokenizer's chat template is used", (None, {})),
    "documents": Refused("retrieval documents are not implemented"),
    # vLLM's multimodal options: the images themselves are honoured (content parts: rulebook/vllm_media.py).
    "mm_processor_kwargs": Refused("the image processor runs with the served folder's preprocessor_config.json",
                                   (None, {})),
    "media_io_kwargs": Refused("images are decoded with the server's own settings", (None, {})),
    "prompt_embeds": Refused("prompts are text or token ids"),
    "structured_outputs": Refused(_NO_GRAMMAR),
    "guided_json": Refused(_NO_GRAMMAR),
    "guided_regex": Refused(_NO_GRAMMAR),
    "guided_choice": Refused(_NO_GRAMMAR),
    "guided_grammar": Refused(_NO_GRAMMAR),
    "guided_decoding_backend": Refused(_NO_GRAMMAR),
    "structural_tag": Refused(_NO_GRAMMAR),
    "watermarking": Refused("watermarking is not implemented", (None, False)),
    "spaces_between_special_tokens": Refused("detokenization keeps the tokenizer's default", (None, True)),
    "priority": Refused("requests are served in arrival order", (None, 0)),
    "cache_salt": Refused("the prefix cache is shared by every request of a deployment"),
    "kv_transfer_params": Refused("disaggregated serving is not implemented"),
    "vllm_xargs": Refused("custom extensions are not implemented"),
    "thinking_token_budget": Refused("reasoning controls are not implemented"),
    "repetition_detection": Refused("repetition detection is not implemented"),
    "return_token_offsets": Refused("only the /render routes of vLLM return offsets", (None, False)),
    # SGLang's extensions of the same routes.
    "regex": Refused(_NO_GRAMMAR),
    "json_schema": Refused(_NO_GRAMMAR),
    "ebnf": Refused(_NO_GRAMMAR),
    "min_new_tokens": Refused("a minimum length is not implemented", (None, 0)),
    "no_stop_trim": Refused("stop strings are trimmed (include_stop_str_in_output keeps them)", (None, False)),
    "lora_path": Refused("on this route an adapter is chosen by `model` (its name)"),
    "return_hidden_states": Refused("hidden states are not returned", (None, False)),
    "separate_reasoning": Refused("reasoning is not parsed", (None, False)),
    "stream_reasoning": Refused("reasoning is not parsed", (None, True, False)),
    "session_params": Refused("sessions are not implemented"),
    "rid": Refused("request ids are the server's (X-Request-ID)"),
}

UNKNOWN_FIELD = ("Unknown field `{name}`: this server does not know it, and refuses it rather than ignore it "
                 "(docs/vllm.md lists the fields it honours and accepts).")
REFUSED_FIELD = ("`{name}`={value!r} is not supported by this server: {why}. Only {neutral} is accepted "
                 "(docs/vllm.md).")


def _neutral_text(neutral: tuple[Any, ...]) -> str:
    shown = ["null" if v is None else repr(v) for v in neutral]
    return " or ".join(shown)


def refused_value(name: str, value: Any) -> Violation | None:
    """A refused field at a value other than its neutral ones (bool and int kept apart: True is not 1)."""
    rule = REFUSED[name]
    if is_neutral(value, rule.neutral):  # every REFUSED rule lists None among its neutral values
        return None
    return Violation(REFUSED_FIELD.format(name=name, value=value, why=rule.why, neutral=_neutral_text(rule.neutral)),
                     param=name)


def undeclared_field(name: str, value: Any) -> Violation | None:
    """A field the body does not declare: accepted if it only annotates, refused (unless neutral) if known and not
    honoured, refused if unknown."""
    if name in ANNOTATIONS:
        return None
    if name in REFUSED:
        return refused_value(name, value)
    return Violation(UNKNOWN_FIELD.format(name=name), param=name)


# vLLM's prompt_logprobs (its own texts for its own rules).
PROMPT_LOGPROBS_NEGATIVE = "`prompt_logprobs` must be a positive value or -1."
PROMPT_LOGPROBS_STREAM = "`prompt_logprobs` are not available when `stream=True`."
# vLLM's chat rule, which this server applies to completions too (without `logprobs` the ids would go unanswered).
IDS_NEED_LOGPROBS = "when using `logprob_token_ids`, `logprobs` must be set to true."
# processed_logprobs applies the request's temperature only; vLLM's also applies top-k / top-p / min-p masks.
PROCESSED_FILTERS = ("The server runs logprobs_mode processed_logprobs, whose logprobs follow the request's "
                     "temperature only: {name}={value} with logprobs is not supported (leave it at its default).")


def prompt_logprobs_violation(k: int | None, stream: bool) -> Violation | None:
    """vLLM's rules: k >= -1 (-1: the whole vocabulary), and none with a stream unless 0."""
    if k is None:
        return None
    if k < -1:
        return Violation(PROMPT_LOGPROBS_NEGATIVE, param="prompt_logprobs")
    if stream and k != 0:
        return Violation(PROMPT_LOGPROBS_STREAM, param="prompt_logprobs")
    return None
