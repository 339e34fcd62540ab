"""Run as a script (tests/e2e/test_haproxy_served.py starts it in its own process, since a process holds one Ray):
a local Ray started as `make serve` starts it (deploy/front_door.py: HAProxy ingress through our shim, throughput
mode, the header guard; a 3 s header timeout, API keys), the test app deployed with a key, and the e2e behaviours that
must hold through the front door, printed as one JSON line of facts for the test to judge; then a replica change
(HAProxy reloaded with `-sf`), Serve and Ray stopped, and what is left of HAProxy and its ports, a second line."""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import tempfile
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from checks import process_table

HEADER_TIMEOUT_S = 3
KEY = "k-front"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _environment() -> str:
    """The front door's environment, with HAProxy's files and ports private to this run (others may run one)."""
    import yaml

    from deploy.front_door import front_door, private_haproxy_files

    config = yaml.safe_load(open("configs/test.yaml"))
    config["applications"][0]["args"]["header_timeout_s"] = HEADER_TIMEOUT_S
    os.environ["RAYSCORE_API_KEYS"] = KEY  # the front door's own checks see the environment's keys
    door = front_door(config, os.environ)
    door.install()
    os.environ.update(door.env)
    run = tempfile.mkdtemp(prefix="rsh", dir="/tmp")  # short: HAProxy takes socket paths of 97 bytes at most
    os.environ.update(private_haproxy_files(run, _free_port(), _free_port()))
    return door.description


def _raw(port: int, data: bytes, wait_s: float = 30.0) -> tuple[str, float]:
    """The status line the server answers raw bytes with, and how long it took ('' when it closed silently)."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=wait_s) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):  # answered and closed before all was sent (1 MiB of headers)
            pass
        out = b""
        try:
            while b"\r\n" not in out:
                chunk = s.recv(4096)
                if not chunk:
                    break
                out += chunk
        except TimeoutError:
            return "timeout", time.monotonic() - started
        except ConnectionResetError:
            return "reset", time.monotonic() - started
    return out.split(b"\r\n")[0].decode("latin-1"), time.monotonic() - started


def _trickle(port: int, every_s: float, lines: int = 20) -> tuple[str, float]:
    """A request whose headers come one line every `every_s` seconds (each gap well inside the header timeout): the
    status line it gets and the seconds until it came."""
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\n")
        try:
            for i in range(lines):
                if select.select([s], [], [], every_s)[0]:
                    break
                s.sendall(b"X-Slow-%d: a\r\n" % i)
            first = s.recv(4096)
        except (BrokenPipeError, ConnectionResetError):
            return "reset", time.monotonic() - started
    return first.split(b"\r\n")[0].decode("latin-1"), time.monotonic() - started


def probe(port: int, app: str) -> dict[str, Any]:
    import httpx
    from ray import serve

    from tests.helpers.reference import hf_scores
    from tests.helpers.serve import ids_of, score_body

    url, auth = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {KEY}"}
    facts: dict[str, Any] = {}
    with httpx.Client(base_url=url, timeout=120, headers=auth) as c:
        ids = ids_of(40, seed=3)
        r = c.post("/generate", json=score_body(ids, 4), headers={"X-Request-ID": "front-1"})
        got = [v for v, _ in r.json()["meta_info"]["input_token_logprobs"]]
        model = os.environ["RAYSCORE_MODEL_PATH"]
        facts["score"] = (r.status_code, r.headers.get("x-request-id"),
                          max(abs(a - b) for a, b in zip(got, hf_scores(model, ids, 4), strict=True)))
        facts["no_key"] = httpx.post(url + "/generate", json=score_body(ids, 4)).status_code
        facts["weight_version"] = c.get("/model_info").json().get("weight_version")
        body = {"input_ids": ids[:8], "max_tokens": 12, "temperature": 0}
        whole = c.post("/generate", json=body).json()["output_ids"]
        with c.stream("POST", "/generate", json={**body, "stream": True}) as s:
            events = [line[6:] for line in s.iter_lines() if line.startswith("data: ")]
        streamed = [t for e in events[:-1] for t in json.loads(e)["output_ids"]]
        facts["stream"] = (events[-1] == "[DONE]", streamed == whole, len(events))
        # An idle connection and a trickled header wait out the header timeout on connections of their own, while
        # a request longer than the header timeout runs: HAProxy's client timer does not cut a waiting answer.
        waits = ThreadPoolExecutor(2)
        idle, trickle = waits.submit(_raw, port, b""), waits.submit(_trickle, port, 1.5)
        # 100 tokens: several header timeouts long on every machine kind seen (docs/operating-front-door.md).
        long = c.post("/generate", json={"input_ids": ids[:8], "max_tokens": 100, "ignore_eos": True})
        facts["long_request"] = (long.status_code, long.elapsed.total_seconds())
        # The client leaves mid-stream: the worker aborts the request.
        handle = serve.get_deployment_handle("EngineWorker", app_name=app)
        with c.stream("POST", "/generate", json={"input_ids": ids[:8], "max_tokens": 4000, "ignore_eos": True,
                                                 "stream": True}) as s:
            next(s.iter_lines())
        deadline = time.monotonic() + 20
        while (running := handle.stats.remote().result(timeout_s=30).running) and time.monotonic() < deadline:
            time.sleep(0.2)
        facts["aborted"] = running == 0
    head = b"GET /v1/models HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer " + KEY.encode() + b"\r\n"
    facts["headers"] = {name.decode(): _raw(port, head + name + b": \xff\xfe\x80x\r\n\r\n")[0]
                        for name in (b"X-Request-ID", b"x-request-timeout-seconds", b"serve_multiplexed_model_id")}
    facts["big_headers"] = _raw(port, head + b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 8192) for i in range(128))
                                + b"\r\n")[0]
    facts["idle"], facts["trickle"] = idle.result(), trickle.result()
    waits.shutdown()
    facts["routes"] = httpx.get(url + "/-/routes").status_code
    facts["routes_wrong_key"] = httpx.get(url + "/-/routes", headers={"Authorization": "Bearer nope"}).status_code
    facts["routes_key"] = httpx.get(url + "/-/routes", headers=auth).status_code
    facts["routes_bad_bytes"] = _raw(port, b"GET /-/routes HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer \xff\xfe"
                                     b"\r\n\r\n")[0]
    facts["healthz"] = httpx.get(url + "/-/healthz").status_code
    # Exactly one X-Request-ID: a client id that is not short and plain is replaced, never echoed beside ours.
    ids = (b"front-2", b"has spaces", "caf\u00e9 \u2603".encode(), b"\xff\xfe", b"a" * 300)
    facts["request_ids"] = {repr(value): _request_ids(port, value) for value in ids}
    # Paths within the limit, over it within HAProxy's buffer (the guard's 414) and past the buffer (HAProxy's 400);
    # headers over max_header_bytes within the buffer (the guard's 431).
    facts["long_paths"] = {n: _answer(port, b"GET /" + b"a" * n + b" HTTP/1.1\r\nHost: t\r\n")
                           for n in (8000, 15000, 60000, 200000)}
    facts["headers_431"] = _answer(port, head + b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 8192) for i in range(3)))
    return facts


def _answer(port: int, head: bytes) -> tuple[str, str]:
    """The status line and the body (its first 2,000 characters) of the answer to `head` (a request line and headers,
    without the blank line), sent with `Connection: close`."""
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        try:
            s.sendall(head + b"Connection: close\r\n\r\n")
            while chunk := s.recv(65536):
                out += chunk
        except (BrokenPipeError, ConnectionResetError):  # answered and closed while the client was still sending
            pass
    status, _, rest = out.partition(b"\r\n")
    return status.decode("latin-1"), rest.partition(b"\r\n\r\n")[2][:2000].decode("latin-1")


def _request_ids(port: int, value: bytes) -> tuple[str, list[str]]:
    """The status line and every X-Request-ID of the answer to a GET /v1/models sending `value` as the id."""
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(b"GET /v1/models HTTP/1.1\r\nHost: t\r\nConnection: close\r\nAuthorization: Bearer "
                  + KEY.encode() + b"\r\nX-Request-ID: " + value + b"\r\n\r\n")
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    lines = out.partition(b"\r\n\r\n")[0].split(b"\r\n")
    ids = [x.split(b":", 1)[1].strip().decode("latin-1") for x in lines[1:] if x.lower().startswith(b"x-request-id:")]
    return lines[0].decode("latin-1"), ids


def listening(port: int) -> bool:
    """Something accepts connections on 127.0.0.1:port."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def _config() -> str:
    """This run's HAProxy config file (Ray writes it in a folder named by the node id)."""
    import ray

    from deploy.front_door import haproxy_config_file

    return haproxy_config_file(os.environ, ray.get_runtime_context().get_node_id())


def _recorded_pids(config: str) -> list[int]:
    from deploy.haproxy_shim import PID_SUFFIX

    try:
        return [int(x) for x in open(config + PID_SUFFIX).read().split()]
    except OSError:
        return []


def deploy_front(app: str, ingress_replicas: int = 1) -> None:
    """The front app from a config: the later deploy that changes only the ingress's replica count adds a replica
    beside the running ones, nothing restarted."""
    from tests.helpers.serve import deploy_config

    deploy_config(app, "/", _args(), [{"name": "Ingress", "num_replicas": ingress_replicas}])


def reload_haproxy(app: str) -> int:
    """A replica change (a second ingress replica): Ray starts HAProxy again with `-sf`. How many HAProxy processes
    the shim became so far (at least 2 once the reload happened)."""
    from tests.helpers.serve import wait_ready

    config = _config()
    before = len(_recorded_pids(config))
    deploy_front(app, ingress_replicas=2)
    wait_ready(app)
    deadline = time.monotonic() + 60
    while len(_recorded_pids(config)) <= before and time.monotonic() < deadline:
        time.sleep(0.5)
    return len(_recorded_pids(config))


def after_stop(config: str, ports: list[int], ray_dir: str, ray_pids: dict[int, int]) -> dict[str, Any]:
    """What is left once Serve and Ray stopped: HAProxy processes of this run's config, ports still listening, and
    any process of this run's Ray (`_ray_alive`): what Ray left of itself (`ray_left_by_ray`: its two agents, every
    run here, since the driver ends inside `ray.shutdown`) is ended, the stop's last step, then `ray_left` is what
    still lives."""
    from deploy.haproxy_shim import is_ours

    recorded = _recorded_pids(config)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and (any(is_ours(p, config) for p in recorded) or any(map(listening, ports))):
        time.sleep(0.5)
    deadline = time.monotonic() + 3  # Ray's own stop, a moment more (its agents, when left, stay for good)
    while time.monotonic() < deadline and _ray_alive(ray_dir, ray_pids):
        time.sleep(0.2)
    alive = [int(p) for p in os.listdir("/proc") if p.isdigit() and is_ours(int(p), config)]
    left_by_ray = _ray_alive(ray_dir, ray_pids)
    _end(left_by_ray)
    return {"recorded": recorded, "alive": alive, "listening": [p for p in ports if listening(p)],
            "ray_left_by_ray": left_by_ray, "ray_left": _ray_alive(ray_dir, ray_pids)}


def _started(pid: int) -> int | None:
    """A process's start time, None when it is gone or a zombie (ended, not yet reaped): with the pid, who it is
    (pids recur)."""
    proc = process_table.read(pid)
    return None if proc is None or proc.state == "Z" else proc.start


def ray_processes() -> dict[int, int]:
    """This process's descendants (its Ray's GCS, raylet, agents, workers, HAProxy), pid -> start time: Ray's agents
    rename themselves `ray::DashboardAgent` / `ray::RuntimeEnvAgent`, so their command line no longer holds the temp
    dir and only their pids find them once they are orphaned."""
    procs = [p for p in process_table.processes() if p.state != "Z"]
    mine, grown = {os.getpid()}, True
    while grown:
        new = {p.pid for p in procs if p.parent in mine} - mine
        grown, mine = bool(new), mine | new
    return {p.pid: p.start for p in procs if p.pid in mine and p.pid != os.getpid()}


def _ray_alive(ray_dir: str, recorded: dict[int, int]) -> list[str]:
    """The live processes of this run's Ray, as 'pid command': those recorded before the stop (same pid, same start)
    and any whose command line holds its temp dir."""
    return [f"{p.pid} {p.command[:80]}" for p in process_table.processes()
            if p.state != "Z" and p.pid != os.getpid() and (ray_dir in p.command or recorded.get(p.pid) == p.start)]


def _end(processes: list[str], grace_s: float = 5.0) -> None:
    """SIGTERM each 'pid command' of `_ray_alive`, SIGKILL what still lives after `grace_s`."""
    import signal

    pids = [int(x.split()[0]) for x in processes]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in pids:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and any(_started(p) is not None for p in pids):
            time.sleep(0.1)


def main() -> None:
    description = _environment()
    import ray
    from ray import serve

    from tests.helpers.serve import wait_ready

    port = _free_port()
    started = time.monotonic()
    phases: dict[str, float] = {}  # seconds since the start at the end of each phase (printed: where the time goes)

    def mark(name: str) -> None:
        phases[name] = round(time.monotonic() - started, 1)

    # address="local": a Ray of its own, never one another process on the machine started (ray.init alone joins the
    # last `ray start` of the machine).
    # A temp dir of its own: every process of this Ray holds it in its command line (`after_stop` looks for them).
    ray_dir = tempfile.mkdtemp(prefix="rsr", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1",
             _temp_dir=ray_dir,
             runtime_env={"env_vars": {"RAYSCORE_CACHE_DIR": os.environ.get("RAYSCORE_CACHE_DIR", "")}}
             if os.environ.get("RAYSCORE_CACHE_DIR") else None)
    mark("ray")
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port, "keep_alive_timeout_s": 5},
                    logging_config={"enable_access_log": False})
        mark("serve")
        # weight_updates as configs/local.yaml has it: the registry actor under throughput mode (user code on the
        # replica's event loop).
        deploy_front("front")
        wait_ready("front")
        mark("app")
        _wait_routed(port)  # HAProxy learns the replica's address
        mark("routed")
        facts = {"front_door": description, **probe(port, "front")}
        mark("probe")
        print("FACTS " + json.dumps(facts), flush=True)  # before shutting down: a crash there loses nothing
        config = _config()
        lifetime: dict[str, Any] = {"haproxy_started": reload_haproxy("front")}
        mark("reload")
        ports = [port, int(os.environ["RAY_SERVE_HAPROXY_STATS_PORT"]),
                 int(os.environ["RAY_SERVE_HAPROXY_METRICS_PORT"])]
        # What the parent needs to look for leftovers itself (`after_stop`) if this process dies in Ray's shutdown
        # (Ray's core worker may end it there) before it prints LIFETIME.
        ray_pids = ray_processes()
        print("STOPPING " + json.dumps({**lifetime, "config": config, "ports": ports, "ray_dir": ray_dir,
                                        "ray_pids": ray_pids}), flush=True)
    except BaseException:
        # Printed here: Ray's core worker may end the process while it shuts down, before Python prints it.
        traceback.print_exc()
        sys.stderr.flush()
        raise
    finally:
        # Serve stops in order within 5 s or Ray stops under it (a thread: serve.shutdown can hang on a dead proxy).
        stopping = threading.Thread(target=serve.shutdown, daemon=True)
        stopping.start()
        stopping.join(timeout=5)
        ray.shutdown()
    mark("stopped")
    left = after_stop(config, ports, ray_dir, ray_pids)
    mark("looked")
    print("LIFETIME " + json.dumps({**lifetime, **left, "phases": phases}), flush=True)


def _wait_routed(port: int, timeout_s: float = 60.0) -> None:
    """Until HAProxy routes a request to the app (it learns the replica's address after the app is RUNNING)."""
    import httpx

    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", headers={"Authorization": f"Bearer {KEY}"},
                         timeout=10).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"HAProxy on {port} routes nothing to the app after {timeout_s:.0f} s")
        time.sleep(0.2)


def _args(**overrides: Any) -> dict[str, Any]:
    from tests.helpers.serve import app_args

    # weight_updates as configs/local.yaml has it: the registry actor under throughput mode (user code on the
    # replica's event loop).
    return app_args(num_workers=1, api_keys=[KEY], header_timeout_s=HEADER_TIMEOUT_S, weight_updates=True,
                    **overrides)


if __name__ == "__main__":
    sys.path.insert(0, os.getcwd())
    main()
