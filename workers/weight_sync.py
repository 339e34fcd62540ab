"""A worker replica's side of the weight registry (weights.py): before the replica serves, it loads the weights
the registry records (a replica started after an update serves the new weights from its first request); then a
thread of its own follows every operation the registry publishes and answers it."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from engine.async_engine import AsyncEngine
from engine.loading.weight_update import StagedWeights, WeightUpdateError, apply_weights, stage_weights
from protocol.control import CommitWeights, ControlOp, DiscardWeights, PrepareWeights
from workers.deployment_actors import FIND_TIMEOUT_S, deployment_actor
from workers.weights import WeightAck, WeightOp

log = logging.getLogger("ray.serve")

# The registry's name among the worker deployment's deployment-scoped actors (deploy/app.py declares it).
REGISTRY_ACTOR = "weights"


def registry_actor(timeout_s: float = FIND_TIMEOUT_S) -> Any:
    """The worker deployment's registry: a deployment-scoped actor (Ray Serve's `deployment_actors`), which Serve's
    controller starts before the replicas, health-checks, recreates, and stops with the deployment, so it outlives
    any one replica (all of them crashing included) and never the application. Its name is Serve's, per code
    version: a deploy that rebuilds the app starts on the config's weights, one that only changes lightweight
    settings keeps the current ones. A fresh handle each call: one held across a recreation points at the old
    actor."""
    return deployment_actor(REGISTRY_ACTOR, timeout_s)


class WeightSync:
    def __init__(self, engine: AsyncEngine, registry: Any, replica: str) -> None:
        self.engine, self.registry, self.replica = engine, registry, replica
        self._seen = 0
        self._staged: StagedWeights | None = None
        self._thread = threading.Thread(target=self._loop, name="rayscore-weights", daemon=True)

    def start(self) -> None:
        """Load the recorded weights (raising, which fails this replica's start, when they cannot be loaded), then
        follow the registry."""
        import ray

        record = ray.get(self.registry.current.remote())
        if record.path is not None:
            staged = stage_weights(self.engine.engine, record.path)
            self.engine.run_exclusive(lambda eng: apply_weights(eng, staged, record.version)).result()
            log.info("rayscore worker starts on weights %s (%s)", record.version, record.path)
        self._seen = record.seq
        self._thread.start()

    def _loop(self) -> None:
        import ray

        while self.engine.is_alive:
            try:
                op = ray.get(self.registry.watch.remote(self.replica, self._seen))
            except Exception as exc:  # the registry recreated or unreachable for a moment: find it again
                log.warning("weight registry unreachable: %s", exc)
                time.sleep(1.0)
                try:
                    self.registry = registry_actor(timeout_s=0)
                except ValueError:
                    pass
                continue
            if op is None:
                continue
            self._seen = op.seq
            self.registry.ack.remote(self.handle(op))

    def handle(self, published: WeightOp) -> WeightAck:
        op, seq = published.op, published.seq
        try:
            paused = self._run(op)
            return WeightAck(self.replica, seq, True, paused=paused)
        except WeightUpdateError as exc:
            return WeightAck(self.replica, seq, False, str(exc))
        except Exception as exc:  # reported to the caller of the update, and this replica keeps serving
            log.exception("control operation %s failed", type(op).__name__)
            return WeightAck(self.replica, seq, False, f"{type(exc).__name__}: {exc}")

    def _run(self, op: ControlOp) -> int:
        """Run one operation on this replica's engine; the requests it touched."""
        if isinstance(op, PrepareWeights):
            self._staged = stage_weights(self.engine.engine, op.path)
            return 0
        if isinstance(op, DiscardWeights):
            self._staged = None
            return 0
        if isinstance(op, CommitWeights):
            staged = self._staged if self._staged is not None else stage_weights(self.engine.engine, op.path)
            self._staged = None
            version = op.version
            _, paused = self.engine.run_exclusive(lambda eng: apply_weights(eng, staged, version),
                                                  op.abort_all).result()
            return int(paused)
        return int(self.engine.control(op).result())
