"""The defaults of the limits both sides enforce, stated once: the ingress checks them on an HTTP request's
worker requests before any is sent (ingress/limits.py), the engine on each request it is given (its last line
of defence). The figures behind them are bench/features/limits.py's (README, Limits)."""

from __future__ import annotations

# Largest top_logprobs_num (OpenAI `logprobs`) a request may ask.
MAX_TOP_LOGPROBS = 100
# Most [value, token_id] entries one answer may hold: rows x (1 + top-k); 2,000 rows x (1 + 100) fit.
MAX_LOGPROB_ENTRIES = 204_800
