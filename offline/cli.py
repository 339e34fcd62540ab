"""`rayscore-batch`: score a whole dataset offline on Ray Data, with the engine settings of a Serve config.

    rayscore-batch INPUT OUTPUT [--config configs/local.yaml]
                   [--text-column text | --ids-column input_ids]
                   [--context-column C --continuation-column X]
                   [--start-column N] [--token-ids-column C] [--window W --stride S | --no-window] [--top-k K]

INPUT: JSON lines, Parquet or CSV (by extension), a local path or any URI Ray Data reads. OUTPUT: a Parquet
dataset, every input column passed through in the input's order, plus the score columns (docs/offline.md). A
bad row gets its message in the `error` column and the others are scored.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import yaml

from deploy.config import AppConfig


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="rayscore-batch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("input", help="JSONL / Parquet / CSV file or folder, local or a URI Ray Data reads")
    ap.add_argument("output", help="Parquet dataset folder to write (must not hold files yet)")
    ap.add_argument("--config", type=Path, help="a Serve YAML: its application's `args:` give the model, engine "
                    "and per-worker resources (default: deploy/config.py's defaults)")
    ap.add_argument("--app", help="the application in --config whose args to use (default: the first)")
    src = ap.add_argument_group("what to score (default: --text-column text)")
    src.add_argument("--text-column", help="text, tokenized as /generate tokenizes a prompt")
    src.add_argument("--ids-column", help="token ids (a list; in CSV the JSON text of one)")
    src.add_argument("--context-column", help="lm-eval loglikelihood: the context ...")
    src.add_argument("--continuation-column", help="... and the continuation scored after it")
    src.add_argument("--start-column", help="per-row logprob_start_len N (default 0): tokens N+1.. are scored")
    src.add_argument("--token-ids-column", help="candidate token ids per row: a list of ids reported at every scored "
                     "token, or one list per scored token (its own candidates); output column token_ids_logprobs")
    win = ap.add_argument_group("long documents")
    win.add_argument("--window", type=int, help="tokens per window (default: the model's context / KV cache)")
    win.add_argument("--stride", type=int, help="tokens between window starts (default: half the window)")
    win.add_argument("--no-window", action="store_true", help="score each row in one request; a longer row "
                     "is an error")
    ap.add_argument("--top-k", type=int, default=0, help="also write the k most likely tokens of each row")
    ap.add_argument("--flat-logprobs", action="store_true", help="write token_logprobs and top_logprobs in the "
                    "compact encoding: base64 float32 / int32 flat arrays with shapes, the HTTP answers' names "
                    "(docs/vllm.md)")
    ap.add_argument("--input-logprob-temperature", type=float, help="score at temperature T: every value (and the "
                    "top-k) is log_softmax(logits / T), as /generate's input_logprob_temperature (default 1)")
    run = ap.add_argument_group("execution")
    run.add_argument("--batch-size", type=int, default=64, help="rows per engine call (map_batches batch_size)")
    run.add_argument("--min-actors", type=int, help="actor pool lower bound (default: from the config)")
    run.add_argument("--max-actors", type=int, help="actor pool upper bound (default: from the config)")
    run.add_argument("--format", choices=["json", "parquet", "csv"], help="input format (default: extension)")
    run.add_argument("--address", default=os.environ.get("RAY_ADDRESS", "local"),
                     help="Ray cluster to connect to (default: $RAY_ADDRESS, else a new local cluster)")
    run.add_argument("--num-cpus", type=int, help="logical CPUs of a new local cluster (default: the machine's)")
    return ap


def load_app_config(path: Path | None, app: str | None = None) -> AppConfig:
    """AppConfig from a Serve YAML's application `args:` (the first application, or the one named)."""
    if path is None:
        return AppConfig()
    doc = yaml.safe_load(path.read_text()) or {}
    apps = doc.get("applications") or [{"args": doc.get("args", {})}]
    chosen = next((a for a in apps if app is None or a.get("name") == app), None)
    if chosen is None:
        raise ValueError(f"{path} has no application named {app!r}")
    return AppConfig(**(chosen.get("args") or {}))


def actor_bounds(cfg: AppConfig, lo: int | None, hi: int | None) -> tuple[int, int]:
    """The pool's bounds: the workers' Serve autoscaling bounds (or num_workers), unless given."""
    auto = cfg.worker_autoscaling or {}
    lo_cfg = max(1, int(auto.get("min_replicas", cfg.num_workers if not auto else 1)))
    hi_cfg = max(lo_cfg, int(auto.get("max_replicas", cfg.num_workers if not auto else lo_cfg)))
    if lo is None:
        lo = lo_cfg if hi is None else min(lo_cfg, hi)
    if hi is None:
        hi = max(hi_cfg, lo)
    return lo, hi  # lo > hi, both given: BatchJob says so


def make_job(args: argparse.Namespace) -> Any:
    from offline.columns import Columns
    from offline.pipeline import BatchJob, WindowSpec

    pair = args.context_column is not None or args.continuation_column is not None
    text = args.text_column or (None if pair or args.ids_column else "text")
    if pair and (args.window or args.stride):
        raise ValueError("context/continuation pairs are scored whole: --window/--stride do not apply")
    cols = Columns(text=text, ids=args.ids_column, context=args.context_column,
                   continuation=args.continuation_column, start=args.start_column, token_ids=args.token_ids_column)
    cfg = load_app_config(args.config, args.app)
    lo, hi = actor_bounds(cfg, args.min_actors, args.max_actors)
    return BatchJob(input=args.input, output=args.output, columns=cols, engine_config=cfg.engine_config(),
                    windows=WindowSpec(not args.no_window, args.window, args.stride), top_k=args.top_k,
                    temperature=args.input_logprob_temperature, batch_size=args.batch_size,
                    num_cpus=cfg.worker_num_cpus, num_gpus=cfg.worker_num_gpus,
                    min_actors=lo, max_actors=hi, input_format=args.format, flat_logprobs=args.flat_logprobs)


def summarize(output: str, limit: int = 10) -> tuple[int, int]:
    """Rows written and rows in error, with the first errors printed (position in the output, message).
    Reads back only the `error` column; files sort in the input's order (Ray Data numbers its write tasks)."""
    import pyarrow.dataset as pads

    rows = errors = 0
    for batch in pads.dataset(output, format="parquet").to_batches(columns=["error"]):
        for err in batch.column(0).to_pylist():
            if err is not None:
                if errors < limit:
                    print(f"  row {rows}: {err}", file=sys.stderr)
                errors += 1
            rows += 1
    return rows, errors


def main(argv: list[str] | None = None) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    try:
        job = make_job(args)
    except (ValueError, OSError) as e:
        ap.error(str(e))
    if "://" not in job.output and Path(job.output).exists() and any(Path(job.output).iterdir()):
        ap.error(f"the output folder {job.output} already holds files; give a new one")
    import ray

    from offline.pipeline import run

    if not ray.is_initialized():
        local = args.address == "local"
        ray.init(address=args.address, num_cpus=args.num_cpus if local else None, include_dashboard=False)
    print(f"rayscore-batch: {job.input} -> {job.output}, {job.min_actors}..{job.max_actors} actor(s) of "
          f"{job.num_cpus:g} CPU / {job.num_gpus:g} GPU", file=sys.stderr)
    try:
        run(job)
    except KeyError as e:  # a missing column, found before any work
        print(f"rayscore-batch: error: {e.args[0]}", file=sys.stderr)
        return 2
    rows, errors = summarize(job.output)
    print(f"rayscore-batch: {rows} rows written to {job.output}, {errors} with an error (see its `error` column)",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
