"""Maps requests to KV blocks, with a prefix cache: full blocks are identified by a chained hash of their
tokens, shared by reference count, and kept after their last owner leaves until space is needed (LRU)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.core.block_pool import BlockPool
from engine.core.sequence import Sequence
from engine.core.state_slots import StateSlots


def block_hash(parent: int | None, tokens: tuple[int, ...]) -> int:
    """Chained: block i's hash covers every token up to its end, so equal hashes mean equal prefixes
    (tokens are still compared on a hit, against collisions)."""
    return hash((parent, tokens))


def block_key(seq: Sequence, i: int, block_size: int) -> tuple[int, ...]:
    """What block i of a request holds: its tokens, then the digest of each image whose placeholder run meets it
    (vLLM's extra keys), so two images behind the same placeholder ids never share a block, nor any block after."""
    lo, hi = i * block_size, (i + 1) * block_size
    tokens = tuple(seq.token_ids[lo:hi])
    return tokens if seq.images is None else tokens + seq.images.block_keys(lo, hi)


@dataclass
class PrefixCacheStats:
    query_tokens: int = 0  # prompt tokens looked up (each request once: a recompute is not a new query)
    hit_tokens: int = 0  # of those, served from cached blocks
    evictions: int = 0  # cached blocks reused for other content


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_cache: bool = True,
                 states: StateSlots | None = None) -> None:
        """states: a hybrid model's state rows (state_slots.py). A request takes a slot with its first blocks and
        gives it back with them, and is not scheduled while none is free, as when the blocks run out. Its cached
        prefix is reused only up to the last block boundary whose state snapshot is kept (none: from position 0)."""
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self.enable_prefix_cache = enable_prefix_cache
        self.states = states
        self.cached: dict[int, int] = {}  # hash -> block
        self.block_meta: dict[int, tuple[int, tuple[int, ...]]] = {}  # block -> (hash, tokens)
        self.stats = PrefixCacheStats()

    def blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    # --- prefix cache ---------------------------------------------------------------------------
    def match_prefix(self, seq: Sequence, limit: int, count: bool = True) -> int:
        """Give a request with no blocks the longest run of cached full blocks within its first `limit`
        tokens. Returns the number of tokens now already computed. count: record the lookup in the stats
        (the scheduler counts a request's first lookup only, not its recomputes after preemption)."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        if self.enable_prefix_cache:
            seq.block_table, seq.block_hashes = self._longest_cached_prefix(seq, limit)
            if self.states is not None:
                self._to_last_snapshot(seq)
            for block in seq.block_table:
                self.pool.take(block)
            seq.num_computed_tokens = len(seq.block_table) * self.block_size
        if count:
            self.stats.query_tokens += seq.num_prompt_tokens
            self.stats.hit_tokens += seq.num_computed_tokens
        return seq.num_computed_tokens

    def _to_last_snapshot(self, seq: Sequence) -> None:
        """A hybrid resumes where a state snapshot is kept: the hit is cut to the last such block boundary, and the
        request's state starts from that snapshot."""
        assert self.states is not None
        keep = 0
        for i, h in enumerate(seq.block_hashes):
            if h in self.states.snapshot_of:
                keep = i + 1
        seq.block_table, seq.block_hashes = seq.block_table[:keep], seq.block_hashes[:keep]
        seq.state_from = self.states.snapshot_of[seq.block_hashes[-1]] if keep else None

    def plan_snapshots(self, seq: Sequence, start: int, n: int) -> list[tuple[int, int]]:
        """The snapshots a hybrid's chunk of positions start .. start + n - 1 writes: (tokens into the chunk, row) at
        each multiple p of the interval it reaches whose block (ending at p) is cached and has none yet. The state at
        p depends on the prefix alone (the chained hash covers it), so whichever request computes it keeps it."""
        if self.states is None or not self.states.interval or not self.enable_prefix_cache:
            return []
        every, bs = self.states.interval, self.block_size
        saves = []
        for p in range((start // every + 1) * every, start + n + 1, every):
            i = p // bs - 1
            if i < len(seq.block_hashes) and seq.block_hashes[i] in self.cached:
                row = self.states.plan(seq.block_hashes[i])
                if row is not None:
                    saves.append((p - start, row))
        return saves

    def _longest_cached_prefix(self, seq: Sequence, limit: int) -> tuple[list[int], list[int]]:
        """(blocks, their chained hashes) of the cached full blocks that start the request's first `limit`
        tokens."""
        bs = self.block_size
        parent: int | None = seq.cache_salt
        hits: list[int] = []
        hashes: list[int] = []
        for i in range(limit // bs):
            tokens = block_key(seq, i, bs)
            h = block_hash(parent, tokens)
            block = self.cached.get(h)
            if block is None or self.block_meta[block][1] != tokens:
                break
            hits.append(block)
            hashes.append(h)
            parent = h
        return hits, hashes

    def cache_full_blocks(self, seq: Sequence, num_tokens: int) -> None:
        """Register the full blocks among the request's first num_tokens tokens so other requests can share
        them. Called when the step that computes them is scheduled: a request admitted later in the same
        step may share them already, since every layer writes the whole batch's K/V before any attention
        reads it, and hidden states are stored before any scoring row is read."""
        if not self.enable_prefix_cache:
            return
        bs = self.block_size
        full = min(num_tokens // bs, len(seq.block_table))
        for i in range(len(seq.block_hashes), full):
            parent = seq.block_hashes[-1] if seq.block_hashes else seq.cache_salt
            tokens = block_key(seq, i, bs)
            h = block_hash(parent, tokens)
            seq.block_hashes.append(h)
            block = seq.block_table[i]
            if h not in self.cached and block not in self.block_meta:
                self.cached[h] = block
                self.block_meta[block] = (h, tokens)

    def reset(self) -> None:
        """Forget every cached block (a flush, or new weights): blocks held by live requests stay theirs, but no
        later request finds them."""
        self.cached.clear()
        self.block_meta.clear()
        if self.states is not None:
            self.states.forget_all()

    def _allocate_block(self) -> int:
        block = self.pool.allocate()
        meta = self.block_meta.pop(block, None)
        if meta is not None:  # the least recently used cached block: forget its content
            del self.cached[meta[0]]
            if self.states is not None:
                self.states.forget(meta[0])
            self.stats.evictions += 1
        return block

    # --- allocation -----------------------------------------------------------------------------
    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make the block table cover num_computed + num_new tokens. All or nothing."""
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.pool.num_free:
            return False
        if self.states is not None and seq.state_slot is None:
            seq.state_slot = self.states.take()
            if seq.state_slot is None:
                return False
        for _ in range(need):
            seq.block_table.append(self._allocate_block())
        return True

    def free(self, seq: Sequence) -> None:
        # Tail first: the free queue is the eviction order, so a prompt's head (the part most likely shared)
        # stays cached longest.
        for block in reversed(seq.block_table):
            self.pool.free(block)
        seq.block_table = []
        seq.block_hashes = []
        if seq.state_slot is not None:
            assert self.states is not None
            self.states.give_back(seq.state_slot)
            seq.state_slot = None
        seq.state_from = None

    def check_integrity(self, live: list[Sequence]) -> None:
        self.pool.check_integrity([s.block_table for s in live])
        assert len(self.cached) == len(self.block_meta), "hash map and block map differ in size"
        for h, block in self.cached.items():
            assert self.block_meta[block][0] == h, f"block {block} cached under two hashes"
        if self.states is not None:
            self.states.check_integrity([s.state_slot for s in live if s.state_slot is not None])
            assert set(self.states.snapshot_of) <= set(self.cached), "a snapshot outlived its block"
        for s in live:
            assert len(s.block_hashes) <= len(s.block_table)
            assert s.num_computed_tokens <= len(s.block_table) * self.block_size
