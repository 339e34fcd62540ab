"""The rules of SGLang's dialect of /generate (ingress/sglang/) and their messages, written once.

A body is SGLang's when it has `sampling_params` or `text` (the seed's LMDeploy shape has neither); its fields are
SGLang's `GenerateReqInput` and `SamplingParams` (python/sglang/srt/managers/io_struct.py, sampling/sampling_params.py).
Every SGLang field this server cannot honour is refused by name (refused.py) when it is set to anything but its no-op
value, never silently ignored: each of them would change the answer. Pure, like rules.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, get_args

from protocol.control import PauseMode
from rulebook.refused import Refused, Why, first_refusal, refusal
from rulebook.rules import Violation

# Top-level fields of the seed's shape that SGLang's shape puts inside `sampling_params` (or calls `text`).
SEED_ONLY_FIELDS = ("prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop", "stop_token_ids",
                    "ignore_eos", "skip_special_tokens", "include_stop_str_in_output")
# The page that lists the dialect's fields.
DOC = "docs/sglang.md"
# What marks a body as SGLang's.
SGLANG_MARKERS = ("sampling_params", "text")

MIXED_SHAPES = ("The body mixes SGLang's /generate shape ({markers}) with fields of the seed's LMDeploy shape "
                "({fields}). A body with `sampling_params` or `text` is SGLang's: put the sampling fields inside "
                "`sampling_params` (max_tokens is max_new_tokens, seed is sampling_seed, prompt is text), or drop "
                "`sampling_params`/`text` to use the seed's shape.")

# sampling_params fields honoured as SGLang defines them.
HONOURED_SAMPLING = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "no_stop_trim", "n", "sampling_seed", "spaces_between_special_tokens"})
# sampling_params fields of SGLang's this server does not implement, refused unless "off".
UNSUPPORTED_SAMPLING: Mapping[str, Refused] = {
    "frequency_penalty": Refused(Why.PENALTY, (0, 0.0)), "presence_penalty": Refused(Why.PENALTY, (0, 0.0)),
    "repetition_penalty": Refused(Why.PENALTY, (1, 1.0)), "min_new_tokens": Refused(Why.MIN_LENGTH, (0,)),
    "json_schema": Refused(Why.GRAMMAR), "regex": Refused(Why.GRAMMAR), "ebnf": Refused(Why.GRAMMAR),
    "structural_tag": Refused(Why.GRAMMAR), "stop_regex": Refused("stop regexes are not implemented"),
    "custom_params": Refused(Why.LOGIT_PROCESSORS), "logit_bias": Refused(Why.LOGIT_BIAS, ({},)),
    "stream_interval": Refused(Why.EVERY_TOKEN, (1,))}
_NO_MEDIA = "video and audio input are not implemented"
_NOT_RETURNED = "this server does not return it"
# Top-level fields of SGLang's GenerateReqInput this server does not implement, refused unless "off".
UNSUPPORTED_FIELDS: Mapping[str, Refused] = {
    "input_embeds": Refused(Why.IDS_OR_TEXT), "video_data": Refused(_NO_MEDIA, ([],)),
    "audio_data": Refused(_NO_MEDIA, ([],)), "lora_id": Refused("an adapter is chosen by lora_path (its name)"),
    "session_params": Refused(Why.SESSIONS), "custom_logit_processor": Refused(Why.LOGIT_PROCESSORS),
    "return_hidden_states": Refused(Why.HIDDEN_STATES, (False,)),
    "return_routed_experts": Refused(Why.ROUTED_EXPERTS, (False,)),
    **{name: Refused(_NOT_RETURNED, (False,)) for name in (
        "return_indexer_topk", "return_sampling_mask", "return_flat_raw_top_logprobs",
        "return_flat_raw_top_logprobs_b64", "return_entropy", "return_bytes", "return_prompt_token_ids")},
    "positional_embed_overrides": Refused("positions are the prompt's own"),
    "multi_item_delimiter_indices": Refused("multi-item scoring is not implemented"),
    "max_thinking_tokens": Refused(Why.REASONING), "require_reasoning": Refused(Why.REASONING, (False,)),
    "priority": Refused(Why.ARRIVAL_ORDER),
    **{name: Refused(Why.DISAGGREGATION) for name in (
        "bootstrap_host", "bootstrap_port", "bootstrap_room", "bootstrap_pair_key")},
    **{name: Refused("images are read from image_data") for name in ("mm_hashes", "mm_content_hashes", "modalities")},
    "background": Refused("requests are answered in the foreground", (False,))}

# Top-level fields of SGLang's GenerateReqInput that route, label or log a request, or isolate its cache entries:
# they change nothing this server computes, so they are accepted and unused (a router such as sgl-model-gateway
# injects `data_parallel_rank` into every request it forwards).
NO_EFFECT_FIELDS = frozenset({
    "session_id", "log_metrics", "routed_dp_rank", "data_parallel_rank", "disagg_prefill_dp_rank", "decode_tp_size",
    "kv_router_hint", "routing_key", "conversation_id", "http_worker_ipc", "no_logs", "custom_labels",
    "external_trace_header", "received_time", "extra_key", "cache_salt", "use_audio_in_video", "video_config",
    "routed_experts_start_len"})
UNKNOWN_FIELD = ("Unknown field `{name}`: it is not a field of SGLang's /generate that this server knows, and it is "
                 "refused rather than ignored (docs/sglang.md lists the fields).")

ONE_PROMPT = "You must specify exactly one of text or input_ids."
EMPTY_LIST = "The {field} must not be an empty list"
UNKNOWN_SAMPLING = "The sampling_params.{name} is not a field of SGLang's sampling parameters."
SAMPLING_NOT_OBJECT = "The sampling_params must be an object, or a list of objects (one per prompt)."
PER_ITEM_LENGTH = "The {name} list has {n} entries; the batch has {items} prompts: give one per prompt, or one value."
N_DIFFERS = "The sampling_params.n must be the same for every prompt of a batch (SGLang's rule)."
N_WITH_LISTS = "The {name} cannot be a per-prompt list with sampling_params.n > 1 (SGLang's rule)."
N_RANGE = "The sampling_params.n {n} must be at least 1."
NOTHING_TO_DO = ("The sampling_params.max_new_tokens is 0 and no input token is scored (scoring needs return_logprob "
                 "true and logprob_start_len >= 0 with at least one token after it): the request computes nothing.")
LORA_PATHS_DIFFER = "The lora_path of a batch must name one adapter for every item."
START_PAST_END = ("The logprob_start_len {start} is past the prompt's last position {last} (input_ids of length "
                  "{num_ids}; SGLang's entries are input_ids[logprob_start_len:]).")
START_BELOW = "The logprob_start_len {start} must be -1 (output tokens only) or at least 0."
MAX_NEW_NEGATIVE = "The sampling_params.max_new_tokens {value} must be at least 0."
IMAGE_DATA_SHAPE = ("The image_data must be a string (a data: URL or base64 bytes), a list of them (one prompt's "
                    "images), or for a batch one such entry per prompt.")
# SGLang's per-position ids (PR #27421, carried on as #38119): one id list per input position, indexed by the target
# token's absolute position (position p's list is scored against input_ids[p], predicted by row p - 1).
POSITIONS_WITH_FLAT = ("The token_ids_logprob_positions and token_ids_logprob are mutually exclusive (SGLang's rule): "
                       "send one of them.")
POSITIONS_SINGLE = "The token_ids_logprob_positions takes a single request only (SGLang's rule), not a batch."
POSITIONS_LENGTH = ("The token_ids_logprob_positions has {lists} lists; it needs one per input position "
                    "(input_ids has {num_ids}).")
POSITIONS_NEED_START = ("The token_ids_logprob_positions are scored on input rows: they need return_logprob true and "
                        "logprob_start_len >= 0.")
POSITIONS_BEFORE_START = ("The token_ids_logprob_positions[{p}] is not empty, but position {p} is not scored (scored "
                          "positions are logprob_start_len + 1 = {first} and after): leave it empty.")


def positions_violation(positions: list[list[int]], start: int, num_ids: int) -> Violation | None:
    """One list per input position, and none with ids at a position that is not scored (<= logprob_start_len)."""
    if len(positions) != num_ids:
        return Violation(POSITIONS_LENGTH.format(lists=len(positions), num_ids=num_ids),
                         param="token_ids_logprob_positions")
    if start < 0 and any(positions):
        return Violation(POSITIONS_NEED_START, param="token_ids_logprob_positions")
    first = start + 1
    bad = next((p for p, ids in enumerate(positions[:first]) if ids), None)
    if bad is not None:
        return Violation(POSITIONS_BEFORE_START.format(p=bad, first=first), param="token_ids_logprob_positions")
    return None


TOKEN_IDS_ON_OUTPUT = ("A token_ids_logprob of per-row lists belongs to the input rows only: with "
                       "sampling_params.max_new_tokens > 0 give one flat list (reported for input and output "
                       "tokens alike), or score with max_new_tokens 0.")


def is_sglang(body: Mapping[str, Any]) -> bool:
    return any(key in body for key in SGLANG_MARKERS)


def mixed_shapes(body: Mapping[str, Any]) -> Violation | None:
    """An SGLang body that also carries the seed shape's own fields: one of the two would be silently ignored."""
    seed = [key for key in SEED_ONLY_FIELDS if key in body]
    if not seed or not is_sglang(body):
        return None
    markers = ", ".join(key for key in SGLANG_MARKERS if key in body)
    return Violation(MIXED_SHAPES.format(markers=markers, fields=", ".join(seed)), param=seed[0])


def unsupported_field(body: Mapping[str, Any]) -> Violation | None:
    """The first top-level SGLang field set to something this server cannot do."""
    return first_refusal(body, UNSUPPORTED_FIELDS, DOC)


def unknown_field(body: Mapping[str, Any], declared: Iterable[str]) -> Violation | None:
    """The first top-level field that is neither declared by the body's model, nor one SGLang's shape refuses by name,
    nor one that changes nothing: a typo such as `return_logprobs` would otherwise vanish, and the answer with it."""
    known = set(declared) | set(UNSUPPORTED_FIELDS) | NO_EFFECT_FIELDS
    name = next((key for key in body if key not in known), None)
    return Violation(UNKNOWN_FIELD.format(name=name), param=name) if name is not None else None


def unsupported_sampling(params: Mapping[str, Any]) -> Violation | None:
    """The first sampling_params field that is not SGLang's, or that this server cannot honour as set."""
    for name, value in params.items():
        if name in HONOURED_SAMPLING:
            continue
        rule = UNSUPPORTED_SAMPLING.get(name)
        if rule is None:
            return Violation(UNKNOWN_SAMPLING.format(name=name), param=f"sampling_params.{name}")
        if (broken := refusal(f"sampling_params.{name}", value, rule, DOC)) is not None:
            return broken
    return None


def per_item_length(name: str, value: Any, items: int) -> Violation | None:
    if isinstance(value, list) and len(value) != items:
        return Violation(PER_ITEM_LENGTH.format(name=name, n=len(value), items=items), param=name)
    return None


def parallel_samples(ns: Iterable[int]) -> Violation | None:
    values = set(ns)
    if len(values) > 1:
        return Violation(N_DIFFERS, param="sampling_params.n")
    bad = next((n for n in values if n < 1), None)
    return Violation(N_RANGE.format(n=bad), param="sampling_params.n") if bad is not None else None


def start_in_prompt(start: int, num_ids: int) -> Violation | None:
    """SGLang's boundary: -1 (output tokens only) or a position of the prompt; entry 0 of the answer is that
    position (null), the scored rows come after it."""
    if start < -1:
        return Violation(START_BELOW.format(start=start), param="logprob_start_len")
    if start >= num_ids:
        return Violation(START_PAST_END.format(start=start, last=num_ids - 1, num_ids=num_ids),
                         param="logprob_start_len")
    return None


def nothing_to_do(max_new_tokens: int, scored_rows: int) -> Violation | None:
    return Violation(NOTHING_TO_DO, param="sampling_params.max_new_tokens") if max_new_tokens == 0 and not scored_rows \
        else None


def negative_max_new(value: int) -> Violation | None:
    return Violation(MAX_NEW_NEGATIVE.format(value=value), param="sampling_params.max_new_tokens") if value < 0 \
        else None


PAUSE_MODES: tuple[str, ...] = get_args(PauseMode)
PAUSE_MODE = "The mode {mode!r} is not one of SGLang's pause modes: abort, retract, in_place."
ABORT_WHAT = "Give the rid of the request to abort, or abort_all: true."


def pause_mode(mode: str) -> Violation | None:
    return None if mode in PAUSE_MODES else Violation(PAUSE_MODE.format(mode=mode), param="mode")


def abort_target(rid: str, abort_all: bool) -> Violation | None:
    return None if rid or abort_all else Violation(ABORT_WHAT, param="rid")


# SGLang's /update_weights_from_disk fields this server cannot honour as set (the others change nothing here).
UPDATE_REFUSED: Mapping[str, Refused] = {
    "load_format": Refused("weights load from safetensors", ("auto",)),
    "keep_pause": Refused("the server resumes after an update (POST /pause_generation pauses it)", (False,)),
    "manifest": Refused("tensor manifests are not read"),
}


def update_refusal(fields: Mapping[str, Any]) -> Violation | None:
    """The first of an update's fields set to something this server cannot do (docs/api.md lists them)."""
    return first_refusal(fields, UPDATE_REFUSED, "docs/api.md")
