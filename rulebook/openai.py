"""The OpenAI-compatible routes' own request rules' messages (/v1/completions, /v1/chat/completions, /v1/score),
written once; ingress/openai/ raises them with the field they name. The rules both APIs share are rules.py's."""

from __future__ import annotations

UNKNOWN_MODEL = "The model `{model}` does not exist: this server serves `{served}` (GET /v1/models)."
LOGPROBS_MODE = "logprobs requires the server's raw_logprobs or processed_logprobs mode; it runs {mode}."
STREAM_OPTIONS = "stream_options requires stream=true."
PROMPT_NO_TOKENS = "{where} has no tokens."
PROMPT_TOKEN_RANGE = "{where} holds token id {bad}, out of range for the vocabulary size {vocab_size}."
PROMPT_AT = "The prompt at index {index}"
# /v1/chat/completions
MAX_TOKENS_POSITIVE = "The {name} {value} must be a positive integer."
TOP_NEEDS_LOGPROBS = "top_logprobs requires logprobs=true."
NO_MESSAGES = "messages must not be empty."
MESSAGE_PART = ("The message at index {i} has a `{kind}` part: this server takes `text` and `image_url` parts "
                "(docs/multimodal.md).")
IMAGE_PART = "The message at index {i} has an `image_url` part without `image_url.url`."
# /v1/completions
ZERO_NEEDS_ECHO = "max_tokens 0 requires echo=true: it returns the prompt's logprobs only."
EMPTY_PROMPT = "The prompt must not be empty."
EMPTY_PROMPT_AT = "The prompt at index {i} must not be empty."
# /v1/score
NO_LABELS = "label_token_ids must be a non-empty list of token ids."
SOFTMAX_MODE = "Scoring with apply_softmax={value} needs the server's raw_logprobs mode; it runs {mode}."
QUERY_AND_ITEMS = "query and items must be provided."
MIXED_ITEMS = "query and items must both be text or both be token ids."
PAIR_NO_TOKENS = "Item {i}: query and item have no tokens."
PAIR_TOO_LONG = ("Item {i}: query and item are {n} tokens; with a label token they exceed the model's context length "
                 "{limit}.")
