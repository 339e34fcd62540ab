"""A hybrid model's per-request state rows (its linear layers' conv and recurrent state:
engine/layers/gated_deltanet.py) and the prefix cache's snapshots of that state. Ids only, like the block pool: the
tensors live with the runner, one row per id, the running slots first (0 .. running - 1), then the snapshot rows.

A snapshot is the state after the first p tokens of a prefix, p a multiple of the interval, kept under the chained hash
of the block that ends at p: a later request whose cached prefix reaches that block resumes from it. It lives as long
as that block stays cached (its eviction frees the row); a snapshot planned in a step is used from the next step on,
once the forward that writes it has run."""

from __future__ import annotations


class StateSlots:
    def __init__(self, running: int, snapshots: int, interval: int) -> None:
        """running: rows for running requests (one each); snapshots: rows for the prefix cache's snapshots; interval:
        tokens between two snapshots of a prefix (0: none kept)."""
        self.running = running
        self.interval = interval
        self.num_snapshots = snapshots if interval else 0
        self.free: list[int] = list(range(running - 1, -1, -1))
        self.free_snapshots: list[int] = list(range(running + self.num_snapshots - 1, running - 1, -1))
        self.snapshot_of: dict[int, int] = {}  # block hash -> snapshot row (written, usable)
        self.pending: dict[int, int] = {}  # block hash -> snapshot row planned in the current step
        # Rows of planned snapshots whose block left the cache in the same step: the step's forward still writes
        # them, so they are free again only from the next step (never planned twice in one step).
        self.released: list[int] = []

    def take(self) -> int | None:
        return self.free.pop() if self.free else None

    def give_back(self, slot: int) -> None:
        self.free.append(slot)

    def start_step(self) -> None:
        """The snapshots planned in the last step were written by its forward: usable from now on."""
        self.snapshot_of.update(self.pending)
        self.pending.clear()
        self.free_snapshots.extend(self.released)
        self.released.clear()

    def plan(self, block_hash: int) -> int | None:
        """A row for the snapshot at the end of the block of this hash, unless there is one or none is free."""
        if block_hash in self.snapshot_of or block_hash in self.pending or not self.free_snapshots:
            return None
        row = self.free_snapshots.pop()
        self.pending[block_hash] = row
        return row

    def forget(self, block_hash: int) -> None:
        """The block of this hash left the cache: its snapshot (if any) goes with it."""
        row = self.snapshot_of.pop(block_hash, None)
        if row is not None:
            self.free_snapshots.append(row)
        elif block_hash in self.pending:
            self.released.append(self.pending.pop(block_hash))

    def forget_all(self) -> None:
        for h in [*self.snapshot_of, *self.pending]:
            self.forget(h)

    def check_integrity(self, held: list[int]) -> None:
        assert len(set(held)) == len(held), "a state slot held by two requests"
        assert not set(held) & set(self.free), "a held state slot is on the free list"
        assert len(held) + len(self.free) == self.running, "state slots lost"
        rows = [*self.snapshot_of.values(), *self.pending.values(), *self.free_snapshots, *self.released]
        assert sorted(rows) == list(range(self.running, self.running + self.num_snapshots)), "snapshot rows lost"
