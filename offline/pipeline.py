"""Offline scoring on Ray Data: read_* (by extension) -> map_batches over an autoscaling actor pool, one
LLMEngine per actor -> write_parquet. The driver needs only a Ray connection; models load in the actors."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import ray
import ray.data
from ray.data import ActorPoolStrategy, Dataset

from offline.columns import Columns, append_results, read_rows
from offline.plan import Windows
from rulebook import rules

READERS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".parquet": "parquet", ".csv": "csv"}


@dataclass(frozen=True)
class WindowSpec:
    """--window / --stride as given: None means the default, resolved in the actor where the model is known
    (window = the engine's longest request, stride = half of the window). enabled=False: no windows."""

    enabled: bool = True
    size: int | None = None
    stride: int | None = None

    def resolve(self, max_len: int) -> Windows | None:
        if not self.enabled:
            return None
        size = self.size or max_len
        return Windows(size, self.stride or max(1, size // 2))


@dataclass(frozen=True)
class BatchJob:
    input: str
    output: str
    columns: Columns
    engine_config: dict[str, Any]  # kwargs of engine.config.EngineConfig (deploy.config.AppConfig.engine_config)
    windows: WindowSpec = field(default_factory=WindowSpec)
    top_k: int = 0
    # input_logprob_temperature of every row: log_softmax(logits / T); None = 1.
    temperature: float | None = None
    batch_size: int = 64  # rows per map_batches call: all their requests go to the engine together
    num_cpus: float = 1.0  # per actor
    num_gpus: float = 0.0  # per actor
    min_actors: int = 1
    max_actors: int = 1
    input_format: str | None = None  # json, parquet or csv; default: from the extension
    flat_logprobs: bool = False  # token_logprobs and top_logprobs in the compact encoding (protocol/compact.py)

    def __post_init__(self) -> None:
        if not 1 <= self.min_actors <= self.max_actors:
            raise ValueError(f"actor bounds must satisfy 1 <= min ({self.min_actors}) <= max ({self.max_actors})")
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be positive, got {self.batch_size}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be non-negative, got {self.top_k}")
        broken = rules.input_logprob_temperature(self.temperature)
        if broken:
            raise ValueError(broken.message)
        if self.windows.size is not None and self.windows.stride is not None:
            Windows(self.windows.size, self.windows.stride)  # raises a clear ValueError early


class ScoreActor:
    """The map_batches callable: one engine per actor, built once; a batch is a pyarrow Table."""

    def __init__(self, engine_config: dict[str, Any], columns: Columns, windows: WindowSpec, top_k: int,
                 temperature: float | None = None, flat: bool = False) -> None:
        from engine.config import EngineConfig
        from engine.llm_engine import LLMEngine
        from offline.dataset_scorer import DatasetScorer

        # Ray sets OMP_NUM_THREADS=1 in actors with < 2 CPUs: the config's num_threads sets torch's count.
        engine = LLMEngine(EngineConfig(**engine_config))
        scorer = DatasetScorer(engine, None, top_k, temperature)
        scorer.windows = windows.resolve(scorer.max_len)
        self.scorer = scorer
        self.columns = columns
        self.top_k = top_k
        self.flat = flat

    def __call__(self, batch: pa.Table) -> pa.Table:
        rows = read_rows(batch, self.columns)
        return append_results(batch, self.scorer.score(rows), self.top_k, self.columns.pair, self.flat,
                              self.scorer.classifier, self.columns.token_ids is not None)


def input_format(path: str) -> str:
    """json / parquet / csv from the path's extension (or, for a local folder, from the files in it)."""
    candidates = [path]
    if os.path.isdir(path):
        candidates = sorted(os.listdir(path))
    for name in candidates:
        for ext, fmt in READERS.items():
            if name.lower().endswith(ext) or name.lower().endswith(ext + ".gz"):
                return fmt
    raise ValueError(f"cannot tell the format of {path!r} from its extension: expected one of "
                     f"{', '.join(sorted(READERS))} (or pass the format explicitly)")


def read_input(path: str, fmt: str | None = None) -> Dataset:
    fmt = fmt or input_format(path)
    if fmt == "json":
        return ray.data.read_json(path)
    if fmt == "parquet":
        return ray.data.read_parquet(path)
    if fmt == "csv":
        return ray.data.read_csv(path)
    raise ValueError(f"unknown input format {fmt!r}: json, parquet or csv")


def _parse_csv_ids(table: pa.Table, name: str) -> pa.Table:
    """CSV has no list type: an ids cell there is the JSON text of a list ("[1, 2, 3]")."""
    col = table.column(name)
    if not pa.types.is_string(col.type) and not pa.types.is_large_string(col.type):
        return table
    ids = [None if v is None else json.loads(v) for v in col.to_pylist()]
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(ids, pa.list_(pa.int64())))


def build(job: BatchJob) -> Dataset:
    """The lazy pipeline (nothing runs until it is written or consumed)."""
    ctx = ray.data.DataContext.get_current()
    # Rows keep the input's order through the actor pool and into the output files.
    ctx.execution_options.preserve_order = True
    fmt = job.input_format or input_format(job.input)
    ds = read_input(job.input, fmt)
    job.columns.check(list(ds.schema().names))
    if job.columns.ids is not None and fmt == "csv":
        ids_col = job.columns.ids
        ds = ds.map_batches(lambda t: _parse_csv_ids(t, ids_col), batch_format="pyarrow", batch_size=None)
    return ds.map_batches(
        ScoreActor,
        fn_constructor_kwargs=dict(engine_config=job.engine_config, columns=job.columns, windows=job.windows,
                                   top_k=job.top_k, temperature=job.temperature, flat=job.flat_logprobs),
        batch_size=job.batch_size, batch_format="pyarrow",
        compute=ActorPoolStrategy(min_size=job.min_actors, max_size=job.max_actors),
        num_cpus=job.num_cpus, num_gpus=job.num_gpus)


def run(job: BatchJob) -> None:
    """Scores job.input into the Parquet dataset job.output (Ray must be initialized)."""
    if not ray.is_initialized():
        raise RuntimeError("ray.init() first: the pipeline runs on the connected cluster")
    build(job).write_parquet(job.output)
