"""Per-request parameters: what to score, how to sample, when to stop."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

from rulebook.rules import MIN_TEMPERATURE


@dataclass
class SamplingParams:
    # Tokens to generate; 0 = score only (requires logprob_start_len >= 0).
    max_tokens: int = 128
    # Below rulebook.rules.MIN_TEMPERATURE (1e-5; 0 included) = greedy.
    temperature: float = 1.0
    top_p: float = 1.0
    # -1 or 0 = no top-k filter.
    top_k: int = -1
    min_p: float = 0.0
    # Same seed, same tokens, whatever else shares the batch.
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    # Logprobs of generated tokens (and of input tokens when logprob_start_len >= 0).
    return_logprob: bool = False
    # N: input positions N .. L-2 are scored (row p scores token p+1); -1 = no input scoring.
    logprob_start_len: int = -1
    # k most likely tokens per scored / generated position; 0 = none.
    top_logprobs_num: int = 0
    # Input-token scoring rows (and their top-k, token-id rows) are log_softmax(logits / T); None = not asked (1.0,
    # and not echoed). Sampling keeps its own `temperature`.
    input_logprob_temperature: float | None = None
    # Token ids whose values are reported at scored input positions (SGLang's token_ids_logprob): one list for every
    # position, or a list of lists, one per scored row in order (on-policy distillation: the student's candidates of
    # that position); None = none.
    token_ids_logprob: list[int] | list[list[int]] | None = None
    # Each scored input token's rank in its row (1 = most likely; vLLM's: how many tokens have a value >= its own).
    return_input_ranks: bool = False
    # A classifier's request (/classify, /pooling): prefill only, answered with the raw scores of the pooled
    # position (RequestOutput.pooled); takes max_tokens 0 and no logprobs. Only a classifier serves it.
    classify: bool = False
    # The LoRA adapter the request runs with, by its name (engine/runner/lora.py); None: the base model.
    adapter: str | None = None
    # Where that adapter's PEFT folder is: an engine that does not have it (or has another folder under the name)
    # loads it on demand. None: the engine must have it already.
    adapter_path: str | None = None

    # Derived once per request, not per generated token: a request with many stops must not cost every token a
    # pass over them (the engine scans stops inside the step that serves the whole batch).
    @cached_property
    def stop_strings(self) -> tuple[str, ...]:
        """The stop strings, empty ones and repeats dropped, in the client's order."""
        return tuple(dict.fromkeys(s for s in self.stop if s))

    @cached_property
    def max_stop_len(self) -> int:
        return max(map(len, self.stop_strings), default=0)

    @cached_property
    def stop_token_set(self) -> frozenset[int]:
        return frozenset(self.stop_token_ids)

    @property
    def scores_input(self) -> bool:
        return self.logprob_start_len >= 0

    @property
    def score_temperature(self) -> float:
        return 1.0 if self.input_logprob_temperature is None else self.input_logprob_temperature

    @property
    def per_row_token_ids(self) -> bool:
        """token_ids_logprob is a list of lists, one per scored row."""
        ids = self.token_ids_logprob
        return bool(ids) and isinstance(ids[0], list)  # type: ignore[index]

    def row_token_ids(self, lo: int, hi: int) -> list[list[int] | None]:
        """The token ids of the scoring rows at input positions lo..hi (row p scores token p+1)."""
        n = hi - lo + 1
        if self.token_ids_logprob is None:
            return [None] * n
        if not self.per_row_token_ids:
            return [self.token_ids_logprob] * n  # type: ignore[list-item]  # a flat list of ids
        first = lo - self.logprob_start_len
        return list(self.token_ids_logprob[first:first + n])  # type: ignore[arg-type]

    @property
    def output_token_ids(self) -> list[int] | None:
        """The ids whose values each generated token reports (SGLang's output_token_ids_logprobs): a flat
        token_ids_logprob, with return_logprob; per-row lists belong to the input rows only."""
        if not self.return_logprob or self.token_ids_logprob is None or self.per_row_token_ids:
            return None
        return self.token_ids_logprob  # type: ignore[return-value]  # a flat list of ids

    def num_token_ids_entries(self, input_rows: int) -> int:
        """[value, token_id] entries of input_token_ids_logprobs over `input_rows` scored rows, and of
        output_token_ids_logprobs over the tokens to generate."""
        ids = self.token_ids_logprob or []
        out = self.max_tokens * len(self.output_token_ids or ())
        if self.per_row_token_ids:
            return sum(len(row) for row in ids) + out  # type: ignore[arg-type]
        return input_rows * len(ids) + out

    @property
    def greedy(self) -> bool:
        # Not `== 0`: logits / 1e-40 overflows float32 and would sample from NaN probabilities.
        return self.temperature < MIN_TEMPERATURE

    def logprob_entries(self, num_prompt_tokens: int) -> int:
        """How many [value, token_id] entries the answer holds at most: rows x (1 + k), where the rows are the
        scored input positions and, with return_logprob, one per token to generate, plus len(token_ids_logprob)
        per scored input position (each row's own list, when they are per row). What the limit max_logprob_entries
        bounds (the answer's size and the worker's memory for it)."""
        input_rows = max(0, num_prompt_tokens - self.logprob_start_len - 1) if self.scores_input else 0
        rows = input_rows + (self.max_tokens if self.return_logprob else 0)
        return rows * (1 + self.top_logprobs_num) + self.num_token_ids_entries(input_rows)
