"""The control plane is types end to end: each operation the registry publishes (protocol/control.py) reaches a
replica's engine by its type, and the registry's answer names it; a weight update that fails to prepare is
discarded and changes nothing. The registry and the replica's WeightSync run in-process here (the Ray actor and
its broadcast are tests/e2e/test_weight_update.py's and test_sglang_control.py's)."""

from __future__ import annotations

import asyncio
import contextlib

from engine.async_engine import AsyncEngine
from protocol import WeightUpdate
from protocol.control import Abort, FlushCache, Pause, Resume
from tests.helpers.engine import make_engine
from workers.weight_sync import WeightSync
from workers.weights import WeightRegistry


async def _follow(registry: WeightRegistry, sync: WeightSync) -> None:
    """A replica's loop (WeightSync._loop without Ray): take each published operation, answer it."""
    seen = 0
    while True:
        op = await registry.watch("r1", seen, wait_s=0.2)
        if op is None:
            continue
        seen = op.seq
        await registry.ack(await asyncio.to_thread(sync.handle, op))


async def test_each_operation_reaches_the_engine_by_type(tiny_models) -> None:  # noqa: ANN001
    eng = AsyncEngine(engine=make_engine(tiny_models["llama"]))
    registry = WeightRegistry(timeout_s=30)
    follower = asyncio.create_task(_follow(registry, WeightSync(eng, None, "r1")))
    try:
        while "r1" not in registry.seen:  # the replica is alive once it watched
            await asyncio.sleep(0.01)
        paused = await registry.control(Pause("retract"))
        assert (paused.success, paused.message) == (True, "Pause done on 1 replica(s).") and eng._pause.active
        resumed = await registry.control(Resume(empty_cache=True))
        assert resumed.success and not eng._pause.active
        assert (await registry.control(FlushCache())).message == "Cache flushed."
        aborted = await registry.control(Abort(None))
        assert (aborted.success, aborted.num_paused_requests) == (True, 0)
        failed = await registry.update(WeightUpdate("/no/such/checkpoint", "v2"))
        assert not failed.success and failed.weight_version == "default"
        assert registry.record.version == "default" and eng.engine.weight_version == "default"
    finally:
        follower.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follower
        eng.shutdown()
