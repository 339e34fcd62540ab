"""The rules of a classifier (`*ForSequenceClassification`) and its requests, with their one message each: what a
classifier serves, what a causal LM does not, and the fields of /classify and /pooling. Pure, as rules.py."""

from __future__ import annotations

from rulebook.rules import Violation

# The routes a classifier serves, named in the refusal of every other route that runs the model.
CLASSIFIER_ROUTES = "POST /classify (vLLM's `input` or SGLang's `text` / `input_ids`) and POST /pooling"
CLASSIFIER_ONLY = ("The served model is a classifier ({num_labels} label(s)): it serves {routes}, not {what}.")
NOT_A_CLASSIFIER = ("The served model is a causal LM, not a classifier (*ForSequenceClassification): it has no "
                    "{what}; it serves /generate, /v1/completions, /v1/chat/completions and /v1/score.")
CLASSIFY_FIELDS = "A classify request takes max_tokens 0 and no logprobs: its answer is the pooled row's scores."
BOTH_SHAPES = ("The body mixes vLLM's classify field `input` with SGLang's `text` / `input_ids`: send one "
               "shape.")
NO_INPUT = "The body needs vLLM's `input` or SGLang's `text` / `input_ids`."
TEXT_AND_IDS = "Either text or input_ids should be provided, not both."
EMPTY_INPUT = "The input must not be an empty list."
RIDS = "The rid must be {n} distinct id(s), one per prompt."
PROMPT_I = "Prompt {i}: {message}"
POOLING_TASK = "The task {task!r} is not served: this model pools for task 'classify' only."
ENCODING_FORMAT = "The encoding_format {value!r} is not served: 'float' only."


def classifier_only(num_labels: int, what: str) -> Violation:
    """A request a classifier cannot answer (generation, token scoring): the routes it serves, named."""
    return Violation(CLASSIFIER_ONLY.format(num_labels=num_labels, routes=CLASSIFIER_ROUTES, what=what))


def not_a_classifier(what: str) -> Violation:
    return Violation(NOT_A_CLASSIFIER.format(what=what))


def pooled_position(ids: list[int], pad_token_id: int | None) -> int:
    """transformers' pooled position (GenericForSequenceClassification): the rightmost token that is not the pad
    token (left or right padding alike); without a pad token the last one; all pads: position 0, as its argmax
    of an all-zero row picks."""
    if pad_token_id is None:
        return len(ids) - 1
    return next((i for i in range(len(ids) - 1, -1, -1) if ids[i] != pad_token_id), 0)
