"""A dumb pool of KV block ids: a free queue and reference counts. It knows nothing of tensors, requests or
hashes. The free queue is ordered for eviction: blocks freed last are reused last, so a prefix cache on top
of it gets least-recently-used eviction for free."""

from __future__ import annotations

from collections import OrderedDict


class BlockPool:
    def __init__(self, num_blocks: int) -> None:
        if num_blocks <= 0:
            raise ValueError(f"the KV cache needs at least one block, got {num_blocks}")
        self.num_blocks = num_blocks
        self.ref_counts = [0] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate(self) -> int:
        """The block at the head of the free queue (least recently freed)."""
        if not self._free:
            raise RuntimeError("no free KV block")
        block, _ = self._free.popitem(last=False)
        assert self.ref_counts[block] == 0
        self.ref_counts[block] = 1
        return block

    def take(self, block: int) -> None:
        """Reference a block: a used one gains a reference; a free one leaves the free queue."""
        if self.ref_counts[block] == 0:
            del self._free[block]
        self.ref_counts[block] += 1

    def incref(self, block: int) -> None:
        assert self.ref_counts[block] > 0, f"incref of free block {block}"
        self.ref_counts[block] += 1

    def free(self, block: int) -> None:
        """Drop one reference; the block joins the tail of the free queue when none is left."""
        assert self.ref_counts[block] > 0, f"double free of block {block}"
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            self._free[block] = None

    def check_integrity(self, owners: list[list[int]] | None = None) -> None:
        """free + used = total; free blocks have no references; and, when the block tables of all live
        requests are given, each block's ref count equals its number of owners."""
        free = list(self._free)
        assert len(set(free)) == len(free), "a block is on the free list twice"
        for b in free:
            assert self.ref_counts[b] == 0, f"free block {b} has ref count {self.ref_counts[b]}"
        used = [b for b in range(self.num_blocks) if self.ref_counts[b] > 0]
        assert len(free) + len(used) == self.num_blocks, "free + used != total"
        assert all(r >= 0 for r in self.ref_counts), "negative ref count"
        if owners is not None:
            counts = [0] * self.num_blocks
            for table in owners:
                assert len(set(table)) == len(table), f"a block table holds a block twice: {table}"
                for b in table:
                    counts[b] += 1
            assert counts == self.ref_counts, "ref counts differ from the block tables that own them"
