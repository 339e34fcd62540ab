"""Run by every Python process the test session starts (tests/conftest.py puts this folder first on PYTHONPATH, which
they inherit: Ray's workers and replicas, `ray start`, `serve run`, the scripts the tests run).

Ray Serve 2.60 binds each replica's inter-deployment gRPC server (ray.serve._private.replica) and its
direct-ingress gRPC server (ray.serve._private.grpc_util, through default_impl.add_grpc_address) on "[::]", every
interface, with no setting to move them. In the test session those two binds go to loopback (127.0.0.1 and ::1)
instead, so that nothing the tests start listens beyond loopback (tests/helpers/loopback.py fails the session
otherwise). Nothing else changes: the tests' clusters are one machine whose node address is 127.0.0.1, which is where
Serve's handles reach a replica's port. Outside a test session (no RAYSCORE_TEST_SESSION in the environment) this
file does nothing."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

# Module -> its function that binds a gRPC server to an address; the modules import them by name, so they are
# wrapped as soon as their module has run, before anything imports them.
WRAP = {"ray._common.tls_utils": "add_port_to_grpc_server", "ray.serve._private.default_impl": "add_grpc_address"}
# Both loopbacks, 127.0.0.1 and ::1, on one port (gRPC binds each address `localhost` resolves to): the "[::]" it
# replaces took both, and Serve's own checks reach a server over either.
LOOPBACK = "localhost"


def on_loopback(address: str) -> str:
    """`[::]:port` and `0.0.0.0:port` (every interface) as `localhost:port`; any other address as it is."""
    host, _, port = address.rpartition(":")
    return f"{LOOPBACK}:{port}" if host in ("[::]", "0.0.0.0", "") else address


def _wrapped(bind: Callable[..., Any]) -> Callable[..., Any]:
    def bind_on_loopback(server: Any, address: str, *args: Any, **kwargs: Any) -> Any:
        return bind(server, on_loopback(address), *args, **kwargs)

    return bind_on_loopback


class _WrapAfterImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Sequence[str] | None, target: ModuleType | None = None) -> Any:
        if name not in WRAP:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        run = spec.loader.exec_module

        def run_then_wrap(module: ModuleType) -> None:
            run(module)
            setattr(module, WRAP[name], _wrapped(getattr(module, WRAP[name])))

        spec.loader.exec_module = run_then_wrap  # type: ignore[method-assign]
        return spec


if os.environ.get("RAYSCORE_TEST_SESSION"):
    sys.meta_path.insert(0, _WrapAfterImport())
