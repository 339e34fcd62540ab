"""Cache-aware routing of `generate` calls across worker replicas: a Ray Serve request router.

Serve builds one router per handle owner (the ingress replica, a driver that holds a handle) from
`RequestRouterConfig(request_router_class="workers.router:PrefixAwareRouter", request_router_kwargs=...)`
(see deploy/app.py) and hands the kwargs to `initialize_state`. Each router keeps its own approximate
view of which token-block prefixes it has sent to which replica, and sends a request to the replica that
holds the longest prefix of its `input_ids` unless that replica is much busier than the least loaded one.
Every request carries ids (the ingress tokenizes text: ingress/text.py); the other methods (`stats`,
`model_info`) take Serve's usual power-of-two choices.

Serve pickles this module by value into each handle owner, so it imports neither torch nor the engine's
machinery (only the carriers of protocol/, which imports nothing of ours).
The selection logic (`block_hashes`, `PrefixIndex`) is pure and tested without Ray.
"""

from __future__ import annotations

import logging
import random
from collections import Counter, OrderedDict
from collections.abc import Hashable, Iterable, Mapping, Sequence

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from protocol import GenerateRequest
from protocol.images import ImageData, placeholder_runs

log = logging.getLogger("ray.serve")


def block_hashes(ids: Sequence[int], block_size: int, adapter: str | None = None,
                 images: Sequence[tuple[int, int, int]] = ()) -> list[int]:
    """One hash per full block of `block_size` tokens, chained: hash i covers tokens [0, (i+1)*block_size),
    so equal hashes mean equal prefixes, and an equal block behind a different head does not match.
    Same form as the engine's prefix cache (a partial last block is never cached, so never keyed); a LoRA adapter's
    requests chain from their adapter's name, as the engine keys its cache by adapter, and a block that an image's
    placeholder run (start, end, digest) touches takes that image's digest too, as the engine keys its blocks (two
    images behind the same placeholder ids never share a prefix)."""
    out: list[int] = []
    parent: int | None = None if adapter is None else hash(("lora", adapter))
    for start in range(0, len(ids) - block_size + 1, block_size):
        end = start + block_size
        seen = tuple(digest for lo, hi, digest in images if lo < end and hi > start)
        parent = hash((parent, tuple(ids[start:end]), seen) if seen else (parent, tuple(ids[start:end])))
        out.append(parent)
    return out


def image_spans(ids: Sequence[int], images: Sequence[ImageData]) -> list[tuple[int, int, int]]:
    """(start, end, digest) of each image's placeholder run in `ids`. The router is not told the model's placeholder
    id, but the ingress expanded each image to exactly `num_tokens` copies of it and checked that the prompt holds no
    other: the id whose runs have the images' lengths, in order. None found (not an ingress-made request): every
    image spans the whole prompt, so the request matches only prompts with the same images."""
    want = [im.num_tokens for im in images]
    for tok, count in Counter(ids).items():
        if count == sum(want):
            runs = placeholder_runs(list(ids), tok)
            if [n for _, n in runs] == want:
                return [(lo, lo + n, im.digest) for (lo, n), im in zip(runs, images, strict=True)]
    return [(0, len(ids), im.digest) for im in images]


class PrefixIndex:
    """Per replica, an LRU set of the block hashes routed there (at most `max_blocks_per_replica`), and the
    choice of replica for a request. Replicas are any hashable keys; no Ray here."""

    def __init__(self, max_blocks_per_replica: int = 200_000) -> None:
        if max_blocks_per_replica <= 0:
            raise ValueError(f"max_blocks_per_replica must be positive, got {max_blocks_per_replica}")
        self.max_blocks_per_replica = max_blocks_per_replica
        self._blocks: dict[Hashable, OrderedDict[int, None]] = {}

    def insert(self, replica: Hashable, hashes: Sequence[int]) -> None:
        """Record that a request with these block hashes was sent to `replica`."""
        lru = self._blocks.setdefault(replica, OrderedDict())
        # Head blocks go in last, as the most recently used: eviction then takes a prefix's tail first and
        # what stays is still a prefix (a tail without its head can never match), as in the engine's cache.
        for h in reversed(hashes):
            lru[h] = None
            lru.move_to_end(h)
        while len(lru) > self.max_blocks_per_replica:
            lru.popitem(last=False)

    def match(self, replica: Hashable, hashes: Sequence[int]) -> int:
        """How many leading blocks of `hashes` `replica` holds."""
        lru = self._blocks.get(replica)
        if not lru:
            return 0
        n = 0
        for h in hashes:
            if h not in lru:
                break
            n += 1
        return n

    def num_blocks(self, replica: Hashable) -> int:
        return len(self._blocks.get(replica, ()))

    def forget(self, replica: Hashable) -> None:
        self._blocks.pop(replica, None)

    def retain(self, replicas: Iterable[Hashable]) -> None:
        """Forget every replica not in `replicas` (the deployment's current set)."""
        keep = set(replicas)
        for r in [r for r in self._blocks if r not in keep]:
            del self._blocks[r]

    def choose(self, hashes: Sequence[int], queue_lens: Mapping[Hashable, int],
               imbalance_threshold: int) -> tuple[Hashable, int]:
        """Pick one of `queue_lens`' replicas (non-empty) for a request; returns (replica, matched blocks).

        The replica with the longest matching prefix (ties: the shorter queue) wins while its queue is at
        most `imbalance_threshold` longer than the shortest. Otherwise, or with no match, the least loaded
        wins (ties: the one holding the fewest blocks, so new prefixes spread; then the order given), and
        the matched count is 0. Callers shuffle the order to break the remaining ties at random.
        """
        if not queue_lens:
            raise ValueError("no replicas to choose from")
        min_queue = min(queue_lens.values())
        matched = {r: self.match(r, hashes) for r in queue_lens}
        best = max(queue_lens, key=lambda r: (matched[r], -queue_lens[r]))
        if matched[best] > 0 and queue_lens[best] - min_queue <= imbalance_threshold:
            return best, matched[best]
        return min(queue_lens, key=lambda r: (queue_lens[r], self.num_blocks(r))), 0


class PrefixAwareRouter(RequestRouter):
    """Routes `generate(GenerateRequest)` (and `generate_whole([GenerateRequest, ...])`) calls by the longest
    prefix of `input_ids` a replica was sent.

    No FIFOMixin on purpose: with it, the replica found for one request goes to the oldest pending request,
    whatever its prefix. Serve's base matching hands each choice to the request it was made for.

    request_router_kwargs (all optional): `block_size` (tokens per hashed block; match the engine's),
    `imbalance_threshold` (route by prefix only while the prefix holder's queue is at most this many
    requests longer than the shortest queue), `max_blocks_per_replica` (LRU bound of the index).
    """

    def initialize_state(self, block_size: int = 16, imbalance_threshold: int = 8,
                         max_blocks_per_replica: int = 200_000) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self._block_size = block_size
        self._imbalance_threshold = imbalance_threshold
        self._index = PrefixIndex(max_blocks_per_replica)

    def _request_hashes(self, pending_request: PendingRequest | None) -> list[int]:
        """Block hashes of a generate call's input_ids (a generate_whole call's: its first request's); [] for
        anything else (stats, model_info, ...)."""
        if pending_request is None or not pending_request.args:
            return []
        method, req = pending_request.metadata.call_method, pending_request.args[0]
        if method == "generate_whole" and isinstance(req, list) and req:
            req = req[0]
        elif method != "generate":
            return []
        if not isinstance(req, GenerateRequest) or not req.input_ids:
            return []
        images = image_spans(req.input_ids, req.images) if req.images else ()
        return block_hashes(req.input_ids, self._block_size, req.params.adapter and req.params.adapter.name, images)

    async def _queue_lens(self, replicas: list[RunningReplica]) -> dict[ReplicaID, int]:
        """Queue length of each replica that can take a request: from Serve's cache where fresh, else probed.
        Replicas that are full or did not answer are left out."""
        lens: dict[ReplicaID, int] = {}
        to_probe: list[RunningReplica] = []
        for r in replicas:
            q = self._replica_queue_len_cache.get(r.replica_id) if self._use_replica_queue_len_cache else None
            # A full replica in the cache is probed again, as Serve's default does: it may have drained.
            if q is None or q >= r.max_ongoing_requests:
                to_probe.append(r)
            else:
                lens[r.replica_id] = q
        if to_probe:
            for r, q in await self._probe_queue_lens(to_probe, 0):
                if q is not None and q < r.max_ongoing_requests:
                    lens[r.replica_id] = q
        return lens

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if not candidate_replicas:
            return []
        # Serve retries without a pause unless told to back off; every round here considers all replicas.
        if pending_request is not None:
            pending_request.routing_context.should_backoff = True
        candidate_replicas = self._holding_adapter(candidate_replicas, pending_request)
        hashes = self._request_hashes(pending_request)
        if hashes:
            by_id = {r.replica_id: r for r in random.sample(candidate_replicas, len(candidate_replicas))}
            lens = await self._queue_lens(list(by_id.values()))
            # Keep the shuffled order for tie-breaking; replicas dropped while probing are left out.
            lens = {rid: lens[rid] for rid in by_id if rid in lens}
            if lens:
                rid, matched = self._index.choose(hashes, lens, self._imbalance_threshold)
                # Recorded now, not only once the replica accepts (on_request_routed): a burst of requests
                # with one prefix then follows the first instead of scattering while it is in flight.
                self._index.insert(rid, hashes)
                log.debug("prefix router: %d/%d blocks matched on %s (queue %d, min %d)", matched,
                          len(hashes), rid, lens[rid], min(lens.values()))
                return [[by_id[rid]]]
        # Power of two choices: Serve sends to the shorter queue of two random replicas.
        return [random.sample(candidate_replicas, min(2, len(candidate_replicas)))]

    @staticmethod
    def _holding_adapter(replicas: list[RunningReplica], pending_request: PendingRequest | None
                         ) -> list[RunningReplica]:
        """Serve's model multiplexing: a call for a LoRA adapter (its multiplexed_model_id) goes to the replicas
        that hold it when any does (prefix affinity then picks among them); else to any, which loads it."""
        model_id = pending_request.metadata.multiplexed_model_id if pending_request is not None else ""
        if not model_id:
            return replicas
        holding = [r for r in replicas if model_id in r.multiplexed_model_ids]
        return holding or replicas

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: object) -> None:
        hashes = self._request_hashes(pending_request)
        if hashes:
            self._index.insert(replica_id, hashes)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self._index.forget(replica_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self._index.retain(self._replica_id_set)
