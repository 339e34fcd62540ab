"""Shared fixtures (tiny local checkpoints, the default model, the session's Ray cluster) and the test tiers.

Helpers live in tests/helpers/, never here: a test imports them, not conftest. A test that deploys on Ray (in
tests/e2e/, or any test that asks for the session's cluster) is marked `e2e`; `make test-fast` runs the rest."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

# Without an NVIDIA device the Triton kernel tests run in Triton's interpreter. Triton reads this when its modules
# are decorated, at its first import (torch and transformers import it), so it is set before any of them.
if not os.path.exists("/dev/nvidiactl"):
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Loopback only (tests/helpers/loopback.py). Ray 2.60 turns a node address of 127.0.0.1 (`ray.init(_node_ip_address=)`,
# `ray start --node-ip-address`) into the machine's network address, and its servers then listen on every interface,
# unless Ray runs as on a one-machine OS: this switch (Ray's own, read when ray is first imported; every process the
# session starts inherits it) makes Ray take loopback as the node's address and bind its servers there. A multi-node
# `ray start --address` refuses to run under it; the suite starts only single-machine clusters.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
# Ray's HAProxy template binds its stats and Prometheus frontends on every interface: the shim moves them here
# (deploy/haproxy_shim.py, BIND_ENV).
os.environ["RAYSCORE_HAPROXY_BIND"] = "127.0.0.1"
# The session's mark, inherited by every process it starts: the listen guard looks at those only.
os.environ.setdefault("RAYSCORE_TEST_SESSION", uuid.uuid4().hex)
# Ray Serve binds its replicas' gRPC servers on every interface: every Python process the session starts runs
# tests/loopback_site/sitecustomize.py first, which moves those binds to 127.0.0.1.
LOOPBACK_SITE = str(Path(__file__).parent / "loopback_site")
os.environ["PYTHONPATH"] = os.pathsep.join([LOOPBACK_SITE, *filter(None, [os.environ.get("PYTHONPATH")])])

import pytest  # noqa: E402
import torch  # noqa: E402

from tests.helpers.loopback import SESSION_ENV, ListenGuard  # noqa: E402
from tests.helpers.suite_times import SuiteTimes  # noqa: E402
from tests.helpers.tiny_models import build_tiny_model  # noqa: E402

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

# Under pytest-xdist (`make test`'s fast tier: one process per core) each process keeps one thread, so the processes
# do not oversubscribe the cores; a lone pytest takes up to two.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else max(1, min(2, os.cpu_count() or 1)))

# `make test-fast` sets it: a test that reaches for the cluster there was not marked e2e, and fails loudly.
NO_RAY = "RAYSCORE_TEST_NO_RAY"


# The address every cluster the suite starts binds (tests/helpers/loopback.py).
LOOPBACK = "127.0.0.1"

_GUARD = ListenGuard(os.environ[SESSION_ENV])


def pytest_configure(config: pytest.Config) -> None:
    """Time per tier and per folder at the end of every run (tests/helpers/suite_times.py)."""
    config.pluginmanager.register(SuiteTimes(), "rayscore-suite-times")


def pytest_runtest_logstart(nodeid: str, location: tuple[str, int | None, str]) -> None:
    _GUARD.test = nodeid


@pytest.fixture(scope="session", autouse=True)
def loopback_only() -> Iterator[None]:
    """Fails the session (an error at the last test's teardown) if a process it started listened beyond loopback."""
    _GUARD.start()
    yield
    found = _GUARD.stop()
    if found:
        pytest.fail("processes started by the tests listened beyond loopback:\n" + "\n".join(map(str, found)),
                    pytrace=False)


# Modules that read the session cluster's Prometheus page. Ray's metrics agent keeps every counter and histogram
# series of every replica the session ever ran (~650 lines, 300 kB an app, none dropped at delete), so late in the
# session each read costs the agent seconds to render; these run first, while the page is small.
READS_THE_METRICS_PAGE = ("test_worker_calls_served.py", "test_metrics.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark the end-to-end tier: every test under tests/e2e/, and any other that uses the Ray cluster; the modules
    that read the metrics page go first (the order is otherwise pytest's)."""
    e2e_dir = Path(__file__).parent / "e2e"
    for item in items:
        if e2e_dir in item.path.parents or "ray_cluster" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.e2e)
    items.sort(key=lambda item: item.path.name not in READS_THE_METRICS_PAGE)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "llama": build_tiny_model(root / "llama", "llama"),
        "llama-tied-llama3": build_tiny_model(root / "llama3", "llama", tie=True, rope_scaling=LLAMA3_ROPE, seed=1),
        "qwen2": build_tiny_model(root / "qwen2", "qwen2", seed=2),
    }


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The embedded default model's converted folder (converted once per machine, then cached)."""
    from engine.loading.default_model import ensure_default_model

    return ensure_default_model()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """The Prometheus port of the session's Ray cluster (`metrics_url` fixture: its /metrics page)."""
    return _free_port()


@pytest.fixture(scope="session")
def metrics_url(serve_url: str, metrics_port: int) -> str:
    return f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="session")
def ray_cluster(smollm2_path: Path, metrics_port: int):
    """One real local Ray cluster for the whole test session (see shared ray-notes): 8 logical CPUs so an
    ingress and several workers place on 2 cores, 2 fake GPUs for the placement test. Serve (serve_url) and
    Ray Data (tests/e2e/test_offline_*.py) share it."""
    import ray

    if os.environ.get(NO_RAY):
        raise RuntimeError(f"{NO_RAY} is set (the fast tier): this test needs Ray and must be marked e2e")
    # Serve's Python proxy with the front door's header guard, as deploy/front_door.py gives a cluster where HAProxy
    # cannot run (the HAProxy front door has its own cluster: tests/e2e/test_haproxy_served.py). Ray's processes
    # inherit this environment.
    os.environ.setdefault("RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH", "ingress.edge.front_door:middlewares")
    # Replicas hand their metrics to the agent every second (Ray's default: 10 s), so a test reads its counts soon.
    # address="local": a cluster of the session's own, never one another process on the machine started.
    ray.init(address="local", num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False,
             _node_ip_address=LOOPBACK, _metrics_export_port=metrics_port,
             _system_config={"metrics_report_interval_ms": 1000},
             runtime_env={"env_vars": {"RAYSCORE_CACHE_DIR": str(smollm2_path.parent)}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def serve_url(ray_cluster):
    """One Serve instance on the session's cluster, on 127.0.0.1 and a free port, access logs off."""
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port, "keep_alive_timeout_s": 5},  # as configs/*.yaml
                logging_config={"enable_access_log": False})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
