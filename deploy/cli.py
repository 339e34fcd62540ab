"""`rayscore`: one command for what rayscore does, with vLLM's flag names where vLLM has the setting.

    rayscore serve MODEL [--host H --port P --tensor-parallel-size N --dtype D --max-model-len L --kv-cache-mb M
                          --num-workers N | --autoscale MIN:MAX --api-key K ... --config FILE]
    rayscore config MODEL [the same flags]     # the Serve config they make: for `serve deploy`, a RayService
    rayscore score ...                         # offline scoring of a text or ids (engine/cli.py; rayscore-score)
    rayscore batch ...                         # a dataset on Ray Data (offline/cli.py; rayscore-batch)

MODEL: a checkpoint folder, the embedded default model's name (smollm2-135m-instruct), or a hub id (org/name) that
the local Hugging Face cache holds (never downloaded). Every AppConfig field is a flag (deploy/flags.py; `rayscore
serve --help` lists them with their `args:` names); the flags given become the application's `args:`, the rest keep
their defaults. `serve` starts a local Ray (or joins $RAY_ADDRESS) with the front door `make serve` has
(deploy/launch.py) and stops everything on Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from deploy.flags import add_config_flags, config_args, flag_of
from deploy.serve_config import DEFAULT_HOST, DEFAULT_PORT, dump, serve_config


def _autoscale(text: str) -> dict[str, Any]:
    """MIN:MAX -> the workers' autoscaling_config on rayscore's token-load policy (workers/autoscaling.py)."""
    low, sep, high = text.partition(":")
    try:
        lo, hi = int(low), int(high)
    except ValueError:
        lo = hi = -1
    if not sep or lo < 0 or hi < max(lo, 1):
        raise argparse.ArgumentTypeError(f"expected MIN:MAX replicas with 0 <= MIN <= MAX and MAX >= 1, got {text!r}")
    return {"min_replicas": lo, "max_replicas": hi,
            "policy": {"policy_function": "workers.autoscaling:TokenLoadPolicy"}}


def _server_parser(prog: str, description: str) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog=prog, description=description, usage="%(prog)s MODEL [flags] (--help lists them)")
    ap.add_argument("model", metavar="MODEL", help="checkpoint folder, 'smollm2-135m-instruct', or a hub id (org/name) "
                    "in the local Hugging Face cache [args: model]")
    ap.add_argument("--host", default=None, help=f"address the HTTP server binds (default {DEFAULT_HOST}; any other "
                    "than loopback needs API keys: --api-key or $RAYSCORE_API_KEYS) [http_options.host]")
    ap.add_argument("--port", type=int, default=None, help=f"HTTP port (default {DEFAULT_PORT}) [http_options.port]")
    ap.add_argument("--config", type=Path, default=None, help="a Serve config file to start from: its first "
                    "application's args, updated by the flags given")
    ap.add_argument("--autoscale", type=_autoscale, default=None, metavar="MIN:MAX",
                    help="autoscale the workers between MIN and MAX replicas on token load [args: worker_autoscaling]")
    add_config_flags(ap)
    return ap


def build(argv: list[str], prog: str) -> tuple[dict[str, Any], argparse.Namespace]:
    """The Serve config `rayscore serve|config argv` makes; SystemExit (argparse's usage error) naming the flag or
    field when a value is refused."""
    ap = _server_parser(prog, (__doc__ or "").splitlines()[0])
    ns = ap.parse_args(argv)
    args = {"model": ns.model, **config_args(ns)}
    if ns.autoscale is not None:
        if "num_workers" in args or "worker_autoscaling" in args:
            ap.error("--autoscale replaces --num-workers and --worker-autoscaling: give one of them")
        args["worker_autoscaling"] = ns.autoscale
    base = yaml.safe_load(ns.config.read_text()) if ns.config is not None else None
    try:
        return serve_config(args, ns.host, ns.port, base), ns
    except ValidationError as e:  # each refused value by its flag and the field's own message
        ap.error("; ".join(f"{_flag(err['loc'])}: {err['msg'].removeprefix('Value error, ')}" for err in e.errors()))
    except ValueError as e:
        ap.error(str(e))
    raise AssertionError("unreachable")  # ap.error exits


def _flag(loc: tuple[Any, ...]) -> str:
    """A pydantic error location as the flag that sets it (the whole config's own checks have no field)."""
    if not loc:
        return "args"
    field = str(loc[0])
    return "MODEL" if field == "model" else f"{flag_of(field)} [args: {field}]"


def _check_model(model: str) -> None:
    """Where the model is local (this node serves it): resolve it now, so a missing folder or hub id is one clear line
    before Ray starts, not a replica's stack trace minutes later. Joining a cluster, the nodes' caches count."""
    from engine.config import DEFAULT_MODEL
    from engine.loading.default_model import resolve_model_path

    if model != DEFAULT_MODEL and not os.environ.get("RAY_ADDRESS"):
        try:
            resolve_model_path(model)
        except FileNotFoundError as e:
            sys.exit(f"rayscore serve: {e}")


def serve(argv: list[str]) -> int:
    from deploy.launch import DEFAULT_METRICS_PORT
    from deploy.launch import main as launch

    metrics = argparse.ArgumentParser(add_help=False)
    metrics.add_argument("--metrics-export-port", type=int, default=DEFAULT_METRICS_PORT)
    known, rest = metrics.parse_known_args(argv)
    config, ns = build(rest, "rayscore serve")
    _check_model(ns.model)
    with tempfile.TemporaryDirectory(prefix="rayscore-serve-") as folder:
        path = Path(folder) / "serve.yaml"
        path.touch(mode=0o600)  # it may hold API keys
        path.write_text(dump(config))
        launch([str(path), "--metrics-export-port", str(known.metrics_export_port)])
    return 0


def config(argv: list[str]) -> int:
    cfg, _ = build(argv, "rayscore config")
    sys.stdout.write(dump(cfg))
    return 0


def _score(argv: list[str]) -> int:
    from engine.cli import main as score

    return score(argv)


def _batch(argv: list[str]) -> int:
    from offline.cli import main as batch

    return batch(argv)


COMMANDS = {"serve": serve, "config": config, "score": _score, "batch": _batch}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        print(f"rayscore: unknown command {argv[0][:40]!r}; one of: {', '.join(COMMANDS)} (rayscore --help)",
              file=sys.stderr)
        return 2
    return COMMANDS[argv[0]](argv[1:])

if __name__ == "__main__":
    sys.exit(main())
