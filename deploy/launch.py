"""`make serve`: `serve run <config>` on a local Ray whose front door and metrics are set up here.

`serve run` alone starts Ray with a random metrics port and Serve's Python proxy. This starts the local Ray first,
with `--metrics-export-port` (default 8080: `curl http://127.0.0.1:8080/metrics` shows rayscore's and Serve's
metrics) and with the front door in the environment of Ray's processes (front_door.py: Ray Serve's HAProxy ingress
and throughput-optimized data plane where they can run, the header guard in any case), then hands over to `serve run`,
which reuses the Ray it finds initialized. Ctrl-C stops both. With $RAY_ADDRESS set it joins that Ray instead.

    python -m deploy.launch configs/local.yaml [--metrics-export-port 8080]
    python -m deploy.launch configs/cluster.yaml --print-env    # the variables to give `ray start` on each node
    python -m deploy.launch configs/cluster.yaml --check        # args and user_config, before `serve deploy`

--print-env also writes the HAProxy shim the variables name (RAY_SERVE_HAPROXY_BINARY_PATH, in rayscore's cache dir)
on the node it runs on. On a cluster, run it on each node, start each node with those variables and
`ray start ... --metrics-export-port=8080`, then use `serve run` / `serve deploy` as usual (configs/cluster.yaml).
"""

from __future__ import annotations

import argparse
import os
import signal
from types import FrameType

import ray
import yaml

from deploy.config import check_user_configs
from deploy.front_door import front_door, haproxy_config_file
from deploy.haproxy_shim import reap

DEFAULT_METRICS_PORT = 8080


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", help="Serve config file, as for `serve run`")
    parser.add_argument("--metrics-export-port", type=int, default=DEFAULT_METRICS_PORT,
                        help="Port of Ray's Prometheus endpoint on this node (default %(default)s)")
    parser.add_argument("--print-env", action="store_true",
                        help="Print the front door's environment for `ray start` and exit")
    parser.add_argument("--check", action="store_true",
                        help="Check the file's args and each deployment's user_config, as the replicas would, and exit")
    args = parser.parse_args(argv)

    with open(args.config) as f:
        config = yaml.safe_load(f)
    for app in config.get("applications") or ():
        if app.get("import_path") == "deploy.app:build_app":
            check_user_configs(app)  # before anything starts: Serve would stop a replica that refuses its user_config
    if args.check:
        print(f"rayscore: {args.config}: args and user_config valid", flush=True)
        return
    door = front_door(config, os.environ)
    door.install()  # the HAProxy shim the environment names, on this node (with --print-env too: run it on each)
    if args.print_env:
        print("\n".join(f"{k}={v}" for k, v in door.env.items()))
        return
    print(f"rayscore: front door: {door.description}", flush=True)
    os.environ.update(door.env)  # before Ray starts: its processes inherit this environment

    # `serve run` shuts Serve down on KeyboardInterrupt: Ctrl-C, and also a supervisor's SIGTERM, or a SIGINT
    # sent to a launcher started in the background (where the shell had SIGINT ignored).
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    # The namespace `serve run` would use; a private ray.init keyword is Ray's only knob for this port. A Ray of its
    # own unless $RAY_ADDRESS names one to join: ray.init() alone would join whatever `ray start` last ran on this
    # machine (its address file outlives it), which may be another user's, or gone.
    ray.init(address=None if os.environ.get("RAY_ADDRESS") else "local", namespace="serve",
             _metrics_export_port=args.metrics_export_port)
    haproxy_config = haproxy_config_file(os.environ, ray.get_runtime_context().get_node_id())
    print(f"rayscore: Ray metrics at http://127.0.0.1:{args.metrics_export_port}/metrics", flush=True)
    from ray.serve.scripts import cli

    try:
        cli.main(args=["run", args.config], prog_name="serve")
    finally:
        # Ray's HAProxy manager stops only the HAProxy it still knows, and only when it is stopped in order: every
        # instance the shim became (first start and each reload) goes with the launcher, so the ports are free for
        # the next start (the shim's own PR_SET_PDEATHSIG covers `ray stop` and a killed launcher).
        ray.shutdown()
        if killed := reap(haproxy_config):
            print(f"rayscore: stopped {len(killed)} HAProxy process(es) left behind: {killed}", flush=True)


if __name__ == "__main__":
    main()
