"""Prefix-aware routing: the pure index, the Serve router class driven through Serve's own routing loop
with fake replicas (no cluster); affinity end to end is tests/e2e/test_router_served.py."""

from __future__ import annotations

import asyncio
import random
import subprocess
import sys

import numpy as np
import pytest

from protocol import GenerateRequest
from protocol.images import ImageData
from workers.router import PrefixIndex, block_hashes, image_spans

BS = 4


def toks(n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(49_152) for _ in range(n)]  # SmolLM2's vocabulary


# --- block hashes and the index ------------------------------------------------------------------


def test_block_hashes_cover_full_blocks_only_and_are_chained() -> None:
    ids = toks(11, 0)
    hs = block_hashes(ids, BS)
    assert len(hs) == 2 and block_hashes(ids[:8], BS) == hs and block_hashes(ids[:3], BS) == []
    other_head = toks(4, 1) + ids[4:8]
    # The second block's tokens are equal, but its hash covers the head too.
    assert block_hashes(other_head, BS)[1] != hs[1]


def test_longest_prefix_wins() -> None:
    ctx = toks(20, 0)
    full, part = block_hashes(ctx, BS), block_hashes(ctx[:8], BS)
    idx = PrefixIndex()
    idx.insert("a", part)
    idx.insert("b", full)
    idx.insert("c", block_hashes(toks(20, 1), BS))
    assert [idx.match(r, full) for r in "abc"] == [2, 5, 0]
    assert idx.choose(full, {"a": 0, "b": 0, "c": 0}, 8) == ("b", 5)
    # Equal matches: the shorter queue.
    idx.insert("c", full)
    assert idx.choose(full, {"a": 0, "b": 3, "c": 1}, 8) == ("c", 5)


def test_shared_middle_block_behind_another_head_does_not_match() -> None:
    ctx = toks(12, 0)
    idx = PrefixIndex()
    idx.insert("a", block_hashes(toks(4, 9) + ctx[4:], BS))  # same blocks 1 and 2, different block 0
    assert idx.match("a", block_hashes(ctx, BS)) == 0
    assert idx.choose(block_hashes(ctx, BS), {"a": 0, "b": 0}, 8) == ("b", 0)  # b holds fewer blocks


def test_lru_bound_evicts_oldest_and_tails_first() -> None:
    p, q = block_hashes(toks(12, 0), BS), block_hashes(toks(12, 1), BS)
    idx = PrefixIndex(max_blocks_per_replica=4)
    idx.insert("a", p)
    idx.insert("a", q)
    assert idx.num_blocks("a") == 4
    assert idx.match("a", q) == 3
    assert idx.match("a", p) == 1  # p's two tail blocks went first: what is left is still a prefix
    idx.insert("a", p)  # p is fresh again, q's tail is evicted
    assert (idx.match("a", p), idx.match("a", q)) == (3, 1)


def test_forget_and_retain_replicas() -> None:
    h = block_hashes(toks(8, 0), BS)
    idx = PrefixIndex()
    for r in "abc":
        idx.insert(r, h)
    idx.forget("a")
    idx.retain(["b"])
    assert [idx.match(r, h) for r in "abc"] == [0, 2, 0]


def test_imbalance_falls_back_to_least_loaded() -> None:
    h = block_hashes(toks(16, 0), BS)
    idx = PrefixIndex()
    idx.insert("a", h)
    assert idx.choose(h, {"a": 8, "b": 0}, 8) == ("a", 4)  # at the threshold: still by prefix
    assert idx.choose(h, {"a": 9, "b": 0}, 8) == ("b", 0)
    assert idx.choose(h, {"a": 10, "b": 3, "c": 1}, 8) == ("c", 0)


def test_no_match_picks_least_loaded_then_fewest_blocks() -> None:
    idx = PrefixIndex()
    idx.insert("a", block_hashes(toks(8, 1), BS))
    h = block_hashes(toks(8, 2), BS)
    assert idx.choose(h, {"a": 0, "b": 0}, 8) == ("b", 0)
    assert idx.choose(h, {"a": 0, "b": 1}, 8) == ("a", 0)
    with pytest.raises(ValueError):
        idx.choose(h, {}, 8)


def test_module_imports_neither_engine_nor_torch() -> None:
    # The shared vocabulary is protocol/'s: no engine module at all.
    code = ("import sys, workers.router;"
            " print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('engine')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- the Serve router class, through Serve's routing loop, without a cluster -------------------------


class FakeReplica:
    """What Serve's routing loop reads of a replica."""

    def __init__(self, replica_id, queue_len: int = 0, jitter_s: float = 0.0) -> None:
        self.replica_id = replica_id
        self.max_ongoing_requests = 16
        self.queue_len = queue_len
        self.jitter_s = jitter_s

    async def get_queue_len(self, *, deadline_s: float) -> int:
        await asyncio.sleep(random.uniform(0, self.jitter_s))
        return self.queue_len


def make_router(n: int, use_cache: bool = True, jitter_s: float = 0.0, **kwargs):
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID
    from ray.serve.request_router import ReplicaID

    from workers.router import PrefixAwareRouter

    dep = DeploymentID(name="EngineWorker", app_name="unit")
    router = PrefixAwareRouter(deployment_id=dep, handle_source=DeploymentHandleSource.UNKNOWN,
                               use_replica_queue_len_cache=use_cache)
    router.initialize_state(**kwargs)
    replicas = [FakeReplica(ReplicaID(unique_id=f"r{i}", deployment_id=dep), jitter_s=jitter_s) for i in range(n)]
    router.update_replicas(replicas)
    return router, replicas


def pending(method: str, *args):
    from ray.serve._private.common import RequestMetadata
    from ray.serve.request_router import PendingRequest

    rid = f"{method}-{random.random()}"
    return PendingRequest(args=list(args), kwargs={},
                          metadata=RequestMetadata(request_id=rid, internal_request_id=rid, call_method=method))


async def route(router, pr):
    """What Serve's Router does per request: choose, then report the accepted request."""
    replica = await asyncio.wait_for(router._choose_replica_for_request(pr), 10)
    router.on_request_routed(pr, replica.replica_id, None)
    return replica.replica_id


async def test_router_keeps_each_prefix_on_one_replica() -> None:
    # Every choice probes queue lengths that answer after random delays, so routing tasks interleave: a
    # replica chosen for one request must still go to that request, not to the oldest one pending.
    router, replicas = make_router(4, use_cache=False, jitter_s=0.005, block_size=BS)
    contexts = [toks(24, s) for s in range(4)]
    placed: dict[int, set] = {c: set() for c in range(4)}
    # A concurrent burst per context (the first choice is recorded before any acceptance), then all mixed.
    for c, ctx in enumerate(contexts):
        reqs = [pending("generate", GenerateRequest(rid=f"{c}-{e}", input_ids=ctx + toks(5, 100 + e)))
                for e in range(3)]
        for rid in await asyncio.gather(*(route(router, pr) for pr in reqs)):
            placed[c].add(rid)
    order = [c for c in range(4) for _ in range(3)]
    random.Random(0).shuffle(order)
    mixed = [pending("generate", GenerateRequest(rid=f"m{i}", input_ids=contexts[c])) for i, c in enumerate(order)]
    for c, rid in zip(order, await asyncio.gather(*(route(router, pr) for pr in mixed)), strict=True):
        placed[c].add(rid)
    assert all(len(s) == 1 for s in placed.values()), placed
    # Idle replicas: each new prefix went to the replica holding the fewest blocks.
    assert len({next(iter(s)) for s in placed.values()}) == 4

    # A replica that dies is forgotten: its prefix moves, and sticks to its new place.
    dead = next(iter(placed[0]))
    router.on_replica_actor_died(dead)
    assert router._index.num_blocks(dead) == 0
    moved = await route(router, pending("generate", GenerateRequest(rid="y", input_ids=contexts[0])))
    assert moved != dead
    assert await route(router, pending("generate", GenerateRequest(rid="z", input_ids=contexts[0]))) == moved
    # A replica that leaves the set is forgotten too.
    router.update_replicas([r for r in replicas if r.replica_id not in (dead, moved)])
    assert router._index.num_blocks(moved) == 0


async def test_busy_prefix_holder_is_bypassed() -> None:
    router, replicas = make_router(2, block_size=BS, imbalance_threshold=2)
    ctx = toks(16, 0)
    first = await route(router, pending("generate", GenerateRequest(rid="a", input_ids=ctx)))
    holder = next(r for r in replicas if r.replica_id == first)
    for q, expect_holder in ((2, True), (3, False)):
        holder.queue_len = q
        router.replica_queue_len_cache.invalidate_key(first)
        rid = await route(router, pending("generate", GenerateRequest(rid="b", input_ids=ctx)))
        assert (rid == first) is expect_holder


async def test_other_methods_and_short_prompts_use_power_of_two() -> None:
    router, replicas = make_router(3, block_size=BS)
    ids = {r.replica_id for r in replicas}
    for pr in (pending("stats"), pending("model_info"),
               pending("generate", GenerateRequest(rid="s", input_ids=[1, 2, 3]))):  # under one block
        assert await route(router, pr) in ids
    assert all(router._index.num_blocks(r) == 0 for r in ids)


async def test_a_whole_batch_call_follows_its_first_requests_prefix() -> None:
    # Non-streamed answers go in one generate_whole call (a list of requests): it is routed by its first request's
    # ids, to the same replica as a generate call with that prefix.
    router, _ = make_router(3, block_size=BS)
    ctx = toks(32, 7)
    first = await route(router, pending("generate", GenerateRequest(rid="a", input_ids=ctx + toks(4, 1))))
    batch = [GenerateRequest(rid=f"b{i}", input_ids=ctx + toks(4, 10 + i)) for i in range(4)]
    assert router._request_hashes(pending("generate_whole", batch)) == block_hashes(batch[0].input_ids, BS)
    assert await route(router, pending("generate_whole", batch)) == first
    assert router._request_hashes(pending("generate_whole", [])) == []


# --- LoRA adapters: keyed hashes, replicas holding the adapter first ------------------------------


def test_adapter_keys_the_block_hashes() -> None:
    ids = toks(12, 0)
    assert block_hashes(ids, BS, "a") != block_hashes(ids, BS)
    assert block_hashes(ids, BS, "a") != block_hashes(ids, BS, "b")
    assert block_hashes(ids, BS, "a") == block_hashes(ids, BS, "a")


def test_replicas_holding_the_adapter_first() -> None:
    from types import SimpleNamespace

    from workers.router import PrefixAwareRouter

    replicas = [SimpleNamespace(multiplexed_model_ids=held) for held in ({"a"}, {"b"}, set())]

    def pending(model_id: str) -> SimpleNamespace:
        return SimpleNamespace(metadata=SimpleNamespace(multiplexed_model_id=model_id))

    choose = PrefixAwareRouter._holding_adapter
    assert choose(replicas, pending("b")) == [replicas[1]]  # type: ignore[arg-type]
    assert choose(replicas, pending("c")) == replicas  # type: ignore[arg-type]  # nobody has it: any loads it
    assert choose(replicas, pending("")) == replicas  # type: ignore[arg-type]  # the base model


# --- images ------------------------------------------------------------------------------------------------------


def _image(seed: int, tokens: int) -> ImageData:
    """A real ImageData of `tokens` placeholder tokens (rows = 4 x tokens patches for the 2 x 2 merge)."""
    rows, cols = 4 * tokens, 3
    pixels = np.random.default_rng(seed).standard_normal((rows, cols)).astype("<f4").tobytes()
    return ImageData.of(pixels, rows, cols, (1, 2, 2 * tokens))


def test_blocks_touched_by_an_image_are_keyed_by_its_content() -> None:
    """The same ids behind two different images share only the blocks before the image (as the engine's prefix
    cache keys them); the same image gives the same hashes; a text-only request keeps its plain hashes."""
    pad = 49_000
    ids = toks(6, 1) + [pad] * 8 + toks(6, 2)  # image run at [6, 14): blocks 1, 2, 3 touch it
    one, other = _image(0, 8), _image(1, 8)
    assert image_spans(ids, [one]) == [(6, 14, one.digest)]
    a = block_hashes(ids, BS, images=image_spans(ids, [one]))
    b = block_hashes(ids, BS, images=image_spans(ids, [other]))
    again = block_hashes(ids, BS, images=image_spans(ids, [_image(0, 8)]))
    plain = block_hashes(ids, BS)
    assert a == again and a[0] == b[0] == plain[0]
    assert all(x != y for x, y in zip(a[1:], b[1:], strict=True)) and a[1] != plain[1]


def test_two_images_each_key_their_own_run_and_an_unfound_run_keys_the_whole_prompt() -> None:
    pad = 49_001
    ids = [pad] * 4 + toks(4, 3) + [pad] * 8
    first, second = _image(2, 4), _image(3, 8)
    assert image_spans(ids, [first, second]) == [(0, 4, first.digest), (8, 16, second.digest)]
    swapped = block_hashes(ids, BS, images=image_spans(ids, [_image(9, 4), second]))
    assert block_hashes(ids, BS, images=image_spans(ids, [first, second]))[0] != swapped[0]
    # Not the ingress's expansion (the run lengths do not match the images): every block takes every digest.
    assert image_spans(ids, [_image(4, 5)]) == [(0, 16, _image(4, 5).digest)]
