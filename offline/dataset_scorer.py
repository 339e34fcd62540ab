"""Scores a batch of dataset rows on one in-process LLMEngine (no Ray here: the Ray Data actor wraps this, and
the benchmark runs it alone as the in-process reference).

Every piece of every row of the batch is submitted at once, so the engine batches them continuously and
rows sharing a context (many continuations of one question) share its KV blocks through the prefix cache.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from engine.llm_engine import LLMEngine, RequestError
from offline.plan import RowError, RowPlan, Windows, plan_ids, plan_pair, plan_text
from protocol.outputs import RequestOutput, merge_outputs
from protocol.sampling import PoolingParams, SamplingParams, split_token_ids
from rulebook import rules

# top_logprobs entries: (logprob, token_id), most likely first.
Top = list[tuple[float, int]]


@dataclass(frozen=True)
class RowInput:
    """One row as read from the dataset: exactly one of ids, text or (context, continuation). Values come as
    the dataset holds them; DatasetScorer.plan checks their types (a wrong one is that row's error)."""

    label: str = ""  # how errors name the row, e.g. "id=17" (its `id` column); "" for none
    ids: list[object] | None = None
    text: object = None
    context: object = None
    continuation: object = None
    start: object = 0  # validated by DatasetScorer.plan: a non-negative integer (None: 0)
    # Candidate ids whose values are reported at every scored token (a list of ints), or one list per scored token
    # (on-policy distillation: the student's candidates of that position); None: none asked.
    token_ids: object = None


@dataclass
class RowResult:
    num_tokens: int | None = None
    token_logprobs: list[float] | None = None
    top_logprobs: list[Top] | None = None
    is_greedy: bool | None = None  # lm-eval pairs only
    # A classifier's raw scores at the row's pooled position ([num_labels]); None for a causal LM.
    scores: list[float] | None = None
    # Per scored token, (logprob, token_id) of each candidate id asked, in the order asked.
    token_ids_logprobs: list[Top] | None = None
    error: str | None = None

    @property
    def sum_logprob(self) -> float | None:
        return None if self.token_logprobs is None else math.fsum(self.token_logprobs)

    @property
    def num_scored(self) -> int | None:
        return None if self.token_logprobs is None else len(self.token_logprobs)

    @property
    def mean_logprob(self) -> float | None:
        s, n = self.sum_logprob, self.num_scored
        return None if s is None or not n else s / n

    @property
    def perplexity(self) -> float | None:
        m = self.mean_logprob
        return None if m is None else math.exp(-m)


class DatasetScorer:
    """Turns rows into engine requests and the engine's rows back into one answer per row."""

    def __init__(self, engine: LLMEngine, windows: Windows | None, top_k: int = 0,
                 temperature: float | None = None) -> None:
        self.engine = engine
        self.windows = windows
        self.top_k = top_k
        # input_logprob_temperature of every request: rows are log_softmax(logits / T) (None: 1).
        self.temperature = temperature
        # The longest request the engine takes: its context length, and what its whole KV cache holds.
        kv_tokens = engine.kv.pool.num_blocks * engine.config.block_size
        self.max_len = min(engine.max_model_len, kv_tokens)
        self._batches = 0

    def tokenize(self, text: str) -> list[int]:
        """Exactly as /generate tokenizes a text prompt (workers/worker.py): no special tokens added."""
        return self.engine.tokenizer.encode(text, add_special_tokens=False)

    def plan(self, row: RowInput) -> RowPlan:
        if row.context is not None or row.continuation is not None:
            return plan_pair(self.tokenize, _text(row.context, "context"), _text(row.continuation, "continuation"),
                             self.max_len)
        if row.ids is not None:
            if not all(isinstance(t, int) and not isinstance(t, bool) for t in row.ids):
                raise RowError("the ids must be a list of integers")
            return plan_ids(list(row.ids), _start(row.start), self.windows, self.max_len)
        return plan_text(self.tokenize, _text(row.text, "text"), _start(row.start), self.windows, self.max_len)

    @property
    def classifier(self) -> bool:
        """A classifier checkpoint: each row is classified whole (its `scores`) instead of scored token by token."""
        return bool(self.engine.model.classifier)

    def score(self, rows: list[RowInput]) -> list[RowResult]:
        """One result per row, in order; a bad row gets `error` set and never affects the others."""
        self._batches += 1
        if self.classifier:
            return self._classify(rows)
        results = [RowResult() for _ in rows]
        plans: dict[int, RowPlan] = {}
        rids: dict[str, tuple[int, int]] = {}  # request id -> (row, piece)
        for r, row in enumerate(rows):
            try:
                plans[r] = plan = self.plan(row)
                self._submit(r, plan, rids, row.token_ids)
            except (RowError, RequestError) as e:
                plans.pop(r, None)
                results[r].error = f"row {row.label}: {e}" if row.label else str(e)
        outputs = self._run(rids)
        for r, plan in plans.items():
            pieces = [outputs[(r, k)] for k in range(len(plan.pieces))]
            results[r] = self._combine(plan, pieces)
        return results

    def _classify(self, rows: list[RowInput]) -> list[RowResult]:
        """Each row (ids, or text tokenized with the tokenizer's special tokens, as /classify does) as one classify
        request; no windows: a row longer than the context is that row's error."""
        results = [RowResult() for _ in rows]
        rids: dict[str, tuple[int, int]] = {}
        for r, row in enumerate(rows):
            try:
                if row.ids is not None:
                    if not all(isinstance(t, int) and not isinstance(t, bool) for t in row.ids):
                        raise RowError("the ids must be a list of integers")
                    ids = list(row.ids)
                else:
                    ids = self.engine.tokenizer.encode(_text(row.text, "text"), add_special_tokens=True)
                rid = f"b{self._batches}-r{r}"
                self.engine.add_request(rid, ids, SamplingParams(max_tokens=0, pooling=PoolingParams()))
                rids[rid] = (r, 0)
                results[r].num_tokens = len(ids)
            except (RowError, RequestError) as e:
                results[r].error = f"row {row.label}: {e}" if row.label else str(e)
        for (r, _), out in self._run(rids).items():
            reason = out.finish_reason
            if reason is not None and reason.type in ("error", "abort"):
                results[r] = RowResult(error=f"engine: {reason.message or reason.type}")
            else:
                results[r].scores = out.pooled
        return results

    def _submit(self, r: int, plan: RowPlan, rids: dict[str, tuple[int, int]], token_ids: object = None) -> None:
        k_top = max(self.top_k, 1 if plan.wants_greedy else 0)
        per_piece = _token_ids_per_piece(token_ids, plan)
        added: list[str] = []
        try:
            for k, piece in enumerate(plan.pieces):
                rid = f"b{self._batches}-r{r}-p{k}"
                flat_ids, row_ids = split_token_ids(per_piece[k])
                self.engine.add_request(rid, piece.ids, SamplingParams(
                    max_tokens=0, return_logprob=True, logprob_start_len=piece.start, top_logprobs_num=k_top,
                    input_logprob_temperature=self.temperature, token_ids_logprob=flat_ids, token_id_rows=row_ids))
                added.append(rid)
                rids[rid] = (r, k)
        except RequestError:
            for rid in added:  # a row is all or nothing: drop the pieces already queued
                self.engine.abort_request(rid)
                rids.pop(rid)
            raise

    def _run(self, rids: dict[str, tuple[int, int]]) -> dict[tuple[int, int], RequestOutput]:
        streams: dict[str, list[RequestOutput]] = {rid: [] for rid in rids}
        while self.engine.has_unfinished():
            for out in self.engine.step():
                if out.request_id in streams:
                    streams[out.request_id].append(out)
        return {rids[rid]: merge_outputs(outs) for rid, outs in streams.items()}

    def _combine(self, plan: RowPlan, pieces: list[RequestOutput]) -> RowResult:
        values: list[float] = []
        tops: list[Top] = []
        cands: list[Top] | None = None
        greedy = True
        for out in pieces:
            reason = out.finish_reason
            if reason is not None and reason.type in ("error", "abort"):
                return RowResult(error=f"engine: {reason.message or reason.type}")
            rows = out.input_token_logprobs or []
            values.extend(v for v, _ in rows)
            if out.input_token_ids_logprobs is not None:
                cands = (cands or []) + [[(v, t) for v, t in row] for row in out.input_token_ids_logprobs]
            for (v, _), top in zip(rows, out.input_top_logprobs or [[] for _ in rows], strict=True):
                # Greedy: the scored token is a most likely one (a tie with the top-1 counts).
                greedy = greedy and bool(top) and v >= top[0][0]
                tops.append([(tv, tid) for tv, tid in top[:self.top_k]])
        return RowResult(num_tokens=plan.num_tokens, token_logprobs=values,
                         top_logprobs=tops if self.top_k else None,
                         is_greedy=greedy if plan.wants_greedy else None, token_ids_logprobs=cands)


def _token_ids_per_piece(value: object, plan: RowPlan) -> list[list[int] | list[list[int]] | None]:
    """Each piece's token_ids_logprob: a flat list for every piece, or the piece's own slice of the per-token lists
    (the pieces' rows, concatenated, are the row's scored tokens in order)."""
    if value is None:
        return [None] * len(plan.pieces)
    if isinstance(value, str):  # CSV has no list type: the cell is the JSON text of the list
        try:
            value = json.loads(value)
        except ValueError as exc:
            raise RowError(f"the token ids are not a JSON list: {exc}") from exc
    if not isinstance(value, list) or not all(
            isinstance(t, int) and not isinstance(t, bool) or isinstance(t, list) and all(
                isinstance(u, int) and not isinstance(u, bool) for u in t) for t in value):
        raise RowError("the token ids must be a list of integers, or a list of lists of them (one per scored token)")
    counts = [len(p.ids) - p.start - 1 for p in plan.pieces]
    broken = rules.token_id_count(value, sum(counts))
    if broken is not None:
        raise RowError(broken.message)
    if not value or not isinstance(value[0], list):
        return [list(value) for _ in plan.pieces]  # type: ignore[misc]  # a flat list of ints, checked above
    out: list[list[int] | list[list[int]] | None] = []
    at = 0
    for n in counts:
        out.append([list(row) for row in value[at:at + n]])
        at += n
    return out


def _text(value: object, name: str) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise RowError(f"the {name} must be a string, got {type(value).__name__}")
    return value


def _start(value: object) -> int:
    """The row's start N: an integer (CSV and pandas may hand it over as a whole float); null means 0."""
    if value is None:
        return 0
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise RowError(f"the start must be a non-negative integer, got {value!r}")
    return value
