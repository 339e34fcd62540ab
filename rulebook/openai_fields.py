"""Which request fields of the OpenAI-compatible routes (/v1/completions, /v1/chat/completions) this server honours,
which it refuses, and which it accepts without use: the one list, read by the ingress's check, the docs
(docs/vllm.md) and the tests.

A field that changes what is computed and is not honoured is a 400 naming it, never silently dropped: a client that
asks for a repetition penalty must not get an answer without one and believe it has it. A refused field is accepted
only at its neutral value (the one that computes nothing different: TRL sends `repetition_penalty: 1.0` on every
generation), judged as every dialect's refused fields are (refused.py), whether the body declares it (`n`, the
penalties, `tools`, ...) or not. Fields that only annotate a request (`user`, `metadata`) are accepted and unused.
Any other field is unknown here and refused too: a typo such as `prompt_logprob` would otherwise vanish the same way.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rulebook.refused import Refused, Why, refusal
from rulebook.rules import Violation

# Declared by the request bodies (ingress/openai/schemas) and honoured. A test holds the bodies' declared fields to
# these lists plus REFUSED's declared ones.
HONOURED_SHARED = (
    "model", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "include_stop_str_in_output", "stream", "stream_options", "max_tokens", "logprobs",
    "prompt_logprobs", "logprob_token_ids", "return_token_ids", "return_tokens_as_token_ids",
    "return_flat_logprobs_b64",
)
HONOURED_COMPLETIONS = (*HONOURED_SHARED, "prompt", "echo")
HONOURED_CHAT = (*HONOURED_SHARED, "messages", "max_completion_tokens", "top_logprobs", "echo")

# Accepted and unused: they label a request for the caller's own bookkeeping and change nothing computed.
ANNOTATIONS = ("user", "metadata", "store", "service_tier", "request_id", "session_id", "prompt_cache_key",
               "safety_identifier", "stream_interval")


_NO_TOOLS = "tool calling is not implemented"
# Known fields this server does not implement, declared by the bodies or not: each a 400 naming it unless neutral.
REFUSED: Mapping[str, Refused] = {
    # OpenAI's own, declared by the bodies.
    "n": Refused(Why.ONE_CHOICE, (None, 1)),
    "best_of": Refused(Why.ONE_CHOICE, (None, 1)),
    "logit_bias": Refused(Why.LOGIT_BIAS, (None, {})),
    "presence_penalty": Refused(Why.PENALTY, (None, 0, 0.0)),
    "frequency_penalty": Refused(Why.PENALTY, (None, 0, 0.0)),
    "suffix": Refused("insertion is not implemented"),
    "tools": Refused(_NO_TOOLS, (None, [])),
    "response_format": Refused(Why.GRAMMAR, (None, {"type": "text"})),
    # OpenAI's, not declared.
    "tool_choice": Refused(_NO_TOOLS, (None, "none")),
    "functions": Refused(_NO_TOOLS, (None, [])),
    "function_call": Refused(_NO_TOOLS, (None, "none")),
    "parallel_tool_calls": Refused(_NO_TOOLS, (None, True, False)),
    "modalities": Refused("the served model is text-only", (None, ["text"])),
    "audio": Refused("the served model is text-only"),
    "prediction": Refused("predicted outputs are not implemented"),
    "reasoning_effort": Refused(Why.REASONING),
    "verbosity": Refused("verbosity controls are not implemented"),
    "web_search_options": Refused("web search is not implemented"),
    # vLLM's extensions.
    "repetition_penalty": Refused(Why.PENALTY, (None, 1, 1.0)),
    "length_penalty": Refused("beam search is not implemented", (None, 1, 1.0)),
    "use_beam_search": Refused("beam search is not implemented", (None, False)),
    "min_tokens": Refused(Why.MIN_LENGTH, (None, 0)),
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
    "prompt_embeds": Refused(Why.IDS_OR_TEXT),
    "structured_outputs": Refused(Why.GRAMMAR),
    "guided_json": Refused(Why.GRAMMAR),
    "guided_regex": Refused(Why.GRAMMAR),
    "guided_choice": Refused(Why.GRAMMAR),
    "guided_grammar": Refused(Why.GRAMMAR),
    "guided_decoding_backend": Refused(Why.GRAMMAR),
    "structural_tag": Refused(Why.GRAMMAR),
    "watermarking": Refused("watermarking is not implemented", (None, False)),
    "spaces_between_special_tokens": Refused(Why.DEFAULT_SPACING, (None, True)),
    "priority": Refused(Why.ARRIVAL_ORDER, (None, 0)),
    "cache_salt": Refused(Why.SHARED_CACHE),
    "kv_transfer_params": Refused(Why.DISAGGREGATION),
    "vllm_xargs": Refused(Why.EXTENSIONS),
    "thinking_token_budget": Refused(Why.REASONING),
    "repetition_detection": Refused("repetition detection is not implemented"),
    "return_token_offsets": Refused("only the /render routes of vLLM return offsets", (None, False)),
    # SGLang's extensions of the same routes.
    "regex": Refused(Why.GRAMMAR),
    "json_schema": Refused(Why.GRAMMAR),
    "ebnf": Refused(Why.GRAMMAR),
    "min_new_tokens": Refused(Why.MIN_LENGTH, (None, 0)),
    "no_stop_trim": Refused("stop strings are trimmed (include_stop_str_in_output keeps them)", (None, False)),
    "lora_path": Refused("on this route an adapter is chosen by `model` (its name)"),
    "return_hidden_states": Refused(Why.HIDDEN_STATES, (None, False)),
    "separate_reasoning": Refused(Why.NOT_PARSED, (None, False)),
    "stream_reasoning": Refused(Why.NOT_PARSED, (None, True, False)),
    "session_params": Refused(Why.SESSIONS),
    "rid": Refused("request ids are the server's (X-Request-ID)"),
}

UNKNOWN_FIELD = ("Unknown field `{name}`: this server does not know it, and refuses it rather than ignore it "
                 "(docs/vllm.md lists the fields it honours and accepts).")


def refused_value(name: str, value: Any) -> Violation | None:
    """A refused field at a value other than its neutral ones."""
    return refusal(name, value, REFUSED[name], "docs/vllm.md")


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
