"""The weights every worker replica serves, kept by one small Ray actor per deployment: the record a replica
started later (autoscaler, crash) loads before it serves, and the broadcast of an update to the replicas alive.

Why not Serve's `user_config` + `reconfigure`: Serve changes a user_config only through a redeploy of the
application's config, which the app itself cannot ask for (and an imperative `serve.run` restarts every replica
under a new code version). So the record is an actor, and the broadcast is a long poll: every replica's
WeightSync (weight_sync.py) calls `watch`, which answers at once when an operation is published.

An update is two-phase, so that a bad checkpoint changes no replica: `prepare` (each replica loads and checks it
beside its serving engine), then `commit` (each drains and swaps) when every replica prepared, else `discard`.
A replica counts as alive while it calls `watch` within LEASE_S, or once it took the operation until it answers.
The actor is a deployment-scoped actor of the worker deployment (deploy/app.py declares it; Serve names it per code
version and stops it with the deployment), so a deploy that rebuilds the app starts from the config's weights.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass

from protocol import DEFAULT_WEIGHT_VERSION, WeightUpdate, WeightUpdateResult
from protocol.control import (
    CommitWeights,
    ControlOp,
    DiscardWeights,
    FlushCache,
    GenerationControl,
    PrepareWeights,
)

# A replica's watch returns empty after WATCH_S; one not seen for LEASE_S is gone (crashed, scaled down).
WATCH_S = 2.0
LEASE_S = 10.0


@dataclass(frozen=True)
class WeightOp:
    """A published control operation (protocol/control.py) and its place in the sequence replicas follow."""

    seq: int
    op: ControlOp


@dataclass(frozen=True)
class WeightAck:
    replica: str
    seq: int
    ok: bool
    message: str = ""
    paused: int = 0


@dataclass(frozen=True)
class WeightRecord:
    path: str | None  # None: the config's model
    version: str
    seq: int  # the last operation published: a replica starting now watches from here


class WeightRegistry:
    """Ray actor body (async: every method runs on its event loop, so no locks beyond the update's own)."""

    def __init__(self, timeout_s: float = 600.0) -> None:
        self.record = WeightRecord(None, DEFAULT_WEIGHT_VERSION, 0)
        self.timeout_s = timeout_s
        self.op: WeightOp | None = None
        self.seen: dict[str, float] = {}
        self.taken: dict[int, set[str]] = {}
        self.acks: dict[int, dict[str, WeightAck]] = {}
        self.changed = asyncio.Condition()
        self.one_at_a_time = asyncio.Lock()

    async def current(self) -> WeightRecord:
        return self.record

    async def version(self) -> str:
        """The weights served now (what the ingress reports; a builtin, so it imports nothing of the workers)."""
        return self.record.version

    async def watch(self, replica: str, after: int, wait_s: float = WATCH_S) -> WeightOp | None:
        """The operation after `after` (at once if there is one), or None after wait_s."""
        self.seen[replica] = time.monotonic()
        async with self.changed:
            try:
                await asyncio.wait_for(self.changed.wait_for(lambda: self.record.seq > after), wait_s)
            except TimeoutError:
                return None
        self.seen[replica] = time.monotonic()
        op = self.op
        if op is not None:
            self.taken.setdefault(op.seq, set()).add(replica)
        return op

    async def ack(self, ack: WeightAck) -> None:
        async with self.changed:
            self.acks.setdefault(ack.seq, {})[ack.replica] = ack
            self.seen[ack.replica] = time.monotonic()
            self.changed.notify_all()

    async def update(self, req: WeightUpdate) -> WeightUpdateResult:
        async with self.one_at_a_time:
            acks = await self._run(PrepareWeights(req.model_path))
            failed = [a for a in acks if not a.ok]
            if not acks or failed:
                await self._run(DiscardWeights())
                why = failed[0].message if failed else "No worker replica is running to load the weights."
                return WeightUpdateResult(False, why, 0, self.record.version)
            version = req.weight_version if req.weight_version is not None else self.record.version
            acks = await self._run(CommitWeights(req.model_path, version, req.abort_all_requests))
            self.record = WeightRecord(req.model_path, version, self.record.seq)
            paused = sum(a.paused for a in acks)
            failed = [a for a in acks if not a.ok]
            if failed:  # prepared, then failed to swap (it keeps serving its old weights): say which
                return WeightUpdateResult(False, f"{len(failed)} replica(s) failed to apply the weights: "
                                          f"{failed[0].message}", paused, version)
            return WeightUpdateResult(True, f"Succeeded to update model weights on {len(acks)} replica(s).",
                                      paused, version)

    async def control(self, op: GenerationControl) -> WeightUpdateResult:
        """A control operation on every replica alive (pause in a mode, resume, abort by id or all, flush the
        cache); the count is the requests it touched, summed over the replicas."""
        async with self.one_at_a_time:
            acks = await self._run(op)
            failed = [a for a in acks if not a.ok]
            if not acks or failed:
                return WeightUpdateResult(False, failed[0].message if failed else "No worker replica is running.")
            message = ("Cache flushed." if isinstance(op, FlushCache)
                       else f"{type(op).__name__} done on {len(acks)} replica(s).")
            return WeightUpdateResult(True, message, sum(a.paused for a in acks), self.record.version)

    async def _run(self, op: ControlOp) -> list[WeightAck]:
        """Publish `op` and wait for the answer of every replica alive (or the timeout: then a failed answer)."""
        async with self.changed:
            seq = self.record.seq + 1
            self.op = WeightOp(seq, op)
            self.record = WeightRecord(self.record.path, self.record.version, seq)
            now = time.monotonic()
            alive = {r for r, t in self.seen.items() if now - t < LEASE_S}
            self.changed.notify_all()

            def settled() -> bool:
                got, taken, t = self.acks.get(seq, {}), self.taken.get(seq, set()), time.monotonic()
                return all(r in got or (r not in taken and t - self.seen.get(r, 0) >= LEASE_S) for r in alive)

            deadline = time.monotonic() + self.timeout_s
            while not settled() and time.monotonic() < deadline:
                # Woken by every ack; the 1 s turn notices a replica whose lease ran out without one.
                try:
                    await asyncio.wait_for(self.changed.wait(), 1.0)
                except TimeoutError:
                    pass
        got = self.acks.pop(seq, {})
        taken = self.taken.pop(seq, set())
        now = time.monotonic()
        late = [WeightAck(r, seq, False, f"replica {r} did not answer within {self.timeout_s:g} s")
                for r in alive if r not in got and (r in taken or now - self.seen.get(r, 0) < LEASE_S)]
        return list(got.values()) + late
