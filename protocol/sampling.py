"""The canonical request's parameters: what to score, how to sample, when to stop; a pooling request's and the
adapter a request runs with are their own types (vLLM's SamplingParams / PoolingParams / LoRARequest)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

# Below this temperature a row is greedy, and a scoring temperature must be at least this: logits / T past it
# overflows float32 (rulebook/rules.py states the rules on it).
MIN_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class PoolingParams:
    """A pooling request (/classify, /pooling): prefill only, answered with the raw float32 scores of the pooled
    position (RequestOutput.pooled); no generation, no logprobs. Only a classifier serves it. The activation
    (softmax, sigmoid) is the route's, applied to the scores after the worker."""


@dataclass(frozen=True)
class AdapterRef:
    """The LoRA adapter a request runs with (engine/runner/lora.py), by its name, and where its PEFT folder is:
    an engine that does not have it (or has another folder under the name) loads it on demand; None: the engine
    must have it already."""

    name: str
    path: str | None = None


@dataclass
class SamplingParams:
    # Tokens to generate; 0 = score only (requires logprob_start_len >= 0).
    max_tokens: int = 128
    # Below MIN_TEMPERATURE (1e-5; 0 included) = greedy.
    temperature: float = 1.0
    top_p: float = 1.0
    # -1 or 0 = no top-k filter.
    top_k: int = -1
    min_p: float = 0.0
    # Same seed, same tokens, whatever else shares the batch.
    seed: int | None = None
    # stop, skip_special_tokens, include_stop_str_in_output: the text side's (ingress/output/detokenizer.py, run in the
    # ingress); the engine never reads them. It stops on stop_token_ids, EOS and length only.
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
    # Token ids whose values are reported at every scored input position (SGLang's token_ids_logprob) and, with
    # return_logprob, at every generated token; None = none.
    token_ids_logprob: list[int] | None = None
    # Per scored input row in order, that row's own candidate ids (on-policy distillation: the student's candidates
    # of that position); input rows only. With both set, the input rows take token_id_rows and the generated
    # tokens token_ids_logprob (vLLM's prompt_logprob_token_ids beside logprob_token_ids).
    token_id_rows: list[list[int]] | None = None
    # Each scored input token's rank in its row (1 = most likely; vLLM's: how many tokens have a value >= its own).
    return_input_ranks: bool = False
    # Each generated token's rank in the row it was sampled from (the same count), with return_logprob.
    return_output_ranks: bool = False
    # A pooling request's parameters (takes max_tokens 0 and no logprobs); None: a causal LM's request.
    pooling: PoolingParams | None = None
    # The LoRA adapter the request runs with; None: the base model.
    adapter: AdapterRef | None = None

    # Derived once per request, not per generated token: a request with many stops must not cost every token a
    # pass over them (the detokenizer scans them after each token).
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
    def classify(self) -> bool:
        return self.pooling is not None

    @property
    def asks_token_ids(self) -> bool:
        """Candidate ids are asked at the scored input rows (flat or per row)."""
        return self.token_ids_logprob is not None or self.token_id_rows is not None

    def row_token_ids(self, lo: int, hi: int) -> list[list[int] | None]:
        """The token ids of the scoring rows at input positions lo..hi (row p scores token p+1)."""
        n = hi - lo + 1
        if self.token_id_rows is not None:
            first = lo - self.logprob_start_len
            return list(self.token_id_rows[first:first + n])
        return [self.token_ids_logprob] * n

    @property
    def output_token_ids(self) -> list[int] | None:
        """The ids whose values each generated token reports (SGLang's output_token_ids_logprobs): the flat
        token_ids_logprob, with return_logprob; per-row lists belong to the input rows only."""
        return self.token_ids_logprob if self.return_logprob else None

    def num_token_ids_entries(self, input_rows: int) -> int:
        """[value, token_id] entries of input_token_ids_logprobs over `input_rows` scored rows, and of
        output_token_ids_logprobs over the tokens to generate."""
        out = self.max_tokens * len(self.output_token_ids or ())
        if self.token_id_rows is not None:
            return sum(len(row) for row in self.token_id_rows) + out
        return input_rows * len(self.token_ids_logprob or ()) + out

    @property
    def greedy(self) -> bool:
        # Not `== 0`: logits / 1e-40 overflows float32 and would sample from NaN probabilities.
        return self.temperature < MIN_TEMPERATURE

    def logprob_entries(self, num_prompt_tokens: int) -> int:
        """How many [value, token_id] entries the answer holds at most: rows x (1 + k), where the rows are the
        scored input positions and, with return_logprob, one per token to generate, plus len(token_ids_logprob)
        per scored input position (or each row's own list, token_id_rows). What the limit max_logprob_entries
        bounds (the answer's size and the worker's memory for it)."""
        input_rows = max(0, num_prompt_tokens - self.logprob_start_len - 1) if self.scores_input else 0
        rows = input_rows + (self.max_tokens if self.return_logprob else 0)
        return rows * (1 + self.top_logprobs_num) + self.num_token_ids_entries(input_rows)


def stop_list(stop: str | Sequence[str] | None) -> list[str]:
    """A client's `stop` (one string, a list, or none) as SamplingParams.stop: every dialect's parse calls this."""
    return [stop] if isinstance(stop, str) else list(stop or [])


def split_token_ids(value: Sequence[int | list[int]] | None) -> tuple[list[int] | None, list[list[int]] | None]:
    """A client's token_ids_logprob as (token_ids_logprob, token_id_rows), copied: a list of ids asks them at every
    row, a list of lists one list per scored row (the rulebook refuses a mix before this is called)."""
    if value is None:
        return None, None
    if value and isinstance(value[0], list):
        return None, [list(row) for row in value if isinstance(row, list)]
    return [t for t in value if isinstance(t, int)], None
