"""`schemathesis run` (its CLI, every phase, every operation of /openapi.json) against the app `make serve` starts,
with the four checks docs/operating.md's Reliability names; prints its summary, the wall time and one JSON line.

    python -m bench.serving.schema_run [--config configs/local.yaml] [--set max_model_len=1024] [--max-examples N]
                                       [--timeout-s 1200]

--set overrides an `args` field of the config. A generated request may ask for as many tokens as the context holds
(8,192 for the embedded model: minutes of CPU generation, past the client's 120 s timeout); a smaller max_model_len
bounds every case's cost without changing what is checked.

The server is started here as `make serve` starts it (checks/launched.py: deploy/launch.py, the HAProxy front door
where it runs), on free ports with HAProxy's files in a private folder (other servers may run on this machine), and
stopped with SIGINT, as Ctrl-C stops `make serve`; the launcher then leaves no process behind. Exit status:
schemathesis's, or 124 when the run did not finish within --timeout-s.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

from checks.launched import start, stop

CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance,content_type_conformance"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", type=Path, default=Path("configs/local.yaml"))
    ap.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="override an args field "
                    "(the value as YAML)")
    ap.add_argument("--max-examples", type=int, default=None, help="schemathesis -n (default: its own)")
    ap.add_argument("--timeout-s", type=float, default=1200.0, help="the run's wall-clock bound (20 min)")
    args = ap.parse_args(argv)
    run_dir = Path(tempfile.mkdtemp(prefix="rsf", dir="/tmp"))  # short: HAProxy's socket paths
    overrides = {k: yaml.safe_load(v) for k, _, v in (item.partition("=") for item in args.set)}
    proc, url = start(args.config, run_dir, overrides)
    command = [str(Path(sys.executable).with_name("schemathesis")), "--no-color", "run", url + "/openapi.json",
               "-c", CHECKS, "--request-timeout", "120"]
    if args.max_examples:
        command += ["-n", str(args.max_examples)]
    started = time.monotonic()
    try:
        run = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout_s)
        rc, out = run.returncode, run.stdout + run.stderr
    except subprocess.TimeoutExpired as exc:
        rc, out = 124, (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout
                                                                                                        or "")
    finally:
        seconds = time.monotonic() - started
        stop(proc)
    print(out[-6000:])
    print(json.dumps({"tool": "schema_run", "rc": rc, "seconds": round(seconds, 1), "config": str(args.config),
                      "overrides": overrides,
                      "checks": CHECKS, "server_log": str(run_dir / "serve.log")}))
    return rc


if __name__ == "__main__":
    sys.exit(main())
