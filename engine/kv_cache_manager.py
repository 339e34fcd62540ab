"""Maps requests to KV blocks: grows a request's block table as it computes, frees it when it leaves."""

from __future__ import annotations

from engine.block_pool import BlockPool
from engine.sequence import Sequence


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)

    def blocks_for(self, num_tokens: int) -> int:
        return (num_tokens + self.block_size - 1) // self.block_size

    def can_allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return need <= self.pool.num_free

    def allocate(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make the block table cover num_computed + num_new tokens. All or nothing."""
        need = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        if need > self.pool.num_free:
            return False
        for _ in range(need):
            seq.block_table.append(self.pool.allocate())
        return True

    def free(self, seq: Sequence) -> None:
        # Reverse order: the tail blocks go back to the free list first (no effect without a prefix cache,
        # but it keeps the head of a prompt around longest once blocks are cached).
        for block in reversed(seq.block_table):
            self.pool.free(block)
        seq.block_table = []

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def check_integrity(self, live: list[Sequence]) -> None:
        self.pool.check_integrity([s.block_table for s in live])
