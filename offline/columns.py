"""Arrow tables in and out of the row scorer: which input columns a row comes from, and the result columns
appended beside every input column (no Ray here)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from offline.dataset_scorer import RowInput, RowResult
from protocol import compact

ID_COLUMN = "id"

TOP_TYPE = pa.list_(pa.list_(pa.struct([("logprob", pa.float32()), ("token_id", pa.int64())])))


@dataclass(frozen=True)
class Columns:
    """Where a row's input lies. Exactly one of: text, ids, or context + continuation."""

    text: str | None = None
    ids: str | None = None
    context: str | None = None
    continuation: str | None = None
    start: str | None = None  # per-row logprob_start_len N; default 0
    # Candidate token ids per row: a list of ints (every scored token) or one list per scored token.
    token_ids: str | None = None

    def __post_init__(self) -> None:
        pair = self.context is not None or self.continuation is not None
        if pair and (self.context is None or self.continuation is None):
            raise ValueError("give both a context column and a continuation column")
        if sum([self.text is not None, self.ids is not None, pair]) != 1:
            raise ValueError("give exactly one of a text column, an ids column, or context + continuation columns")
        if pair and self.start is not None:
            raise ValueError("a start column does not apply to context/continuation pairs (the boundary is "
                             "the context's end)")

    @property
    def pair(self) -> bool:
        return self.context is not None

    def required(self) -> list[str]:
        names = [self.text, self.ids, self.context, self.continuation, self.start, self.token_ids]
        return [n for n in names if n is not None]

    def check(self, schema_names: list[str]) -> None:
        """A clear error, before any work, for a column the input does not have."""
        missing = [n for n in self.required() if n not in schema_names]
        if missing:
            raise KeyError(f"the input has no column {', '.join(map(repr, missing))}; its columns are "
                           f"{', '.join(map(repr, schema_names))}")


def read_rows(table: pa.Table, cols: Columns) -> list[RowInput]:
    cols.check(table.column_names)
    n = table.num_rows
    ids = table.column(ID_COLUMN).to_pylist() if ID_COLUMN in table.column_names else None
    get = {name: table.column(name).to_pylist() for name in cols.required()}
    rows = []
    for i in range(n):
        # Without an `id` column a row is known by its place in the output, which keeps the input's order.
        label = f"id={ids[i]!r}" if ids is not None else ""
        cands = get[cols.token_ids][i] if cols.token_ids else None
        if cols.pair:
            rows.append(RowInput(label, context=_or_empty(get[cols.context][i]),
                                 continuation=_or_empty(get[cols.continuation][i]), token_ids=cands))
            continue
        start = get[cols.start][i] if cols.start else 0
        if cols.ids:
            rows.append(RowInput(label, ids=get[cols.ids][i] or [], start=start, token_ids=cands))
        else:
            rows.append(RowInput(label, text=_or_empty(get[cols.text][i]), start=start, token_ids=cands))
    return rows


def _or_empty(value: object) -> object:
    return "" if value is None else value


def _top_rows(rows: list[list[tuple[float, int]]] | None) -> list | None:
    return None if rows is None else [[{"logprob": v, "token_id": t} for v, t in row] for row in rows]


def result_columns(results: list[RowResult], top_k: int, pair: bool, flat: bool = False,
                   classify: bool = False, token_ids: bool = False) -> dict[str, pa.Array]:
    """The columns the scorer adds; a row in error has nulls there and its message in `error`. flat: token_logprobs
    and top_logprobs in the compact encoding (protocol/compact.py's columns, as the HTTP answers name them). A
    classifier's: num_tokens, `scores` (its raw float32 scores per label) and error."""
    if classify:
        return {"num_tokens": pa.array([r.num_tokens for r in results], pa.int64()),
                "scores": pa.array([r.scores for r in results], pa.list_(pa.float32())),
                "error": pa.array([r.error for r in results], pa.string())}
    out: dict[str, pa.Array] = {
        "num_tokens": pa.array([r.num_tokens for r in results], pa.int64()),
        # float32: the engine's values are float32 log-softmax rows; stored without rounding.
        "token_logprobs": pa.array([r.token_logprobs for r in results], pa.list_(pa.float32())),
        "sum_logprob": pa.array([r.sum_logprob for r in results], pa.float64()),
        "num_scored": pa.array([r.num_scored for r in results], pa.int64()),
        "mean_logprob": pa.array([r.mean_logprob for r in results], pa.float64()),
        "perplexity": pa.array([r.perplexity for r in results], pa.float64()),
    }
    if flat:
        del out["token_logprobs"]
        out.update(flat_columns([None if r.token_logprobs is None else compact.flat_values(
            "token_logprobs", r.token_logprobs, [len(r.token_logprobs)]) for r in results]))
    if pair:
        out["is_greedy"] = pa.array([r.is_greedy for r in results], pa.bool_())
    if top_k and flat:
        out.update(flat_columns([None if r.top_logprobs is None else
                                 compact.encode_top_rows("top_logprobs", r.top_logprobs) for r in results]))
    elif top_k:
        out["top_logprobs"] = pa.array([_top_rows(r.top_logprobs) for r in results], TOP_TYPE)
    if token_ids:
        out["token_ids_logprobs"] = pa.array([_top_rows(r.token_ids_logprobs) for r in results], TOP_TYPE)
    out["error"] = pa.array([r.error for r in results], pa.string())
    return out


def flat_columns(rows: list[dict[str, Any] | None]) -> dict[str, pa.Array]:
    """Per-row compact fields -> one column per field (strings, and lists of ints for shapes); null for a row in
    error. A row read back as a dict decodes as an HTTP answer does (docs/vllm.md)."""
    names = next((list(r) for r in rows if r is not None), [])
    return {name: pa.array([None if r is None else r.get(name) for r in rows],
                           pa.list_(pa.int64()) if name.endswith("_shape") else pa.string()) for name in names}


def append_results(table: pa.Table, results: list[RowResult], top_k: int, pair: bool, flat: bool = False,
                   classify: bool = False, token_ids: bool = False) -> pa.Table:
    """Every input column passes through unchanged; a result column replaces an input column of its name."""
    for name, array in result_columns(results, top_k, pair, flat, classify, token_ids).items():
        if name in table.column_names:
            table = table.drop_columns([name])
        table = table.append_column(name, array)
    return table
