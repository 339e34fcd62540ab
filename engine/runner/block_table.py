"""The running requests' block tables, resident on the device, and the one host-to-device copy of a step.

Each request in a step holds a row of a device table [rows, width] (int32, the kernels' type). The KV cache manager
only ever appends to a request's block table or replaces the list (kv_cache_manager.py: allocate appends, free and
admission assign a new list), so a row is brought up to date by writing the pages past those it already holds, or
the whole list when the list object changed. Those page writes and the step's own integer vectors (token ids,
positions, row indices) are staged in one host buffer, pinned on CUDA, and cross in one asynchronous copy: the step
costs no host sync, and its bytes follow the pages that changed, not the tables' width."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.core.sequence import Sequence


@dataclass
class _Row:
    request_id: str
    blocks: list[int]  # the request's block-table list the row mirrors (the same object while it only grows)
    known: int  # how many of its pages the device row holds
    used: int  # the step that last used the row (the least recent one is reused first)


class DeviceBlockTables:
    def __init__(self, device: torch.device, rows: int, width: int = 1) -> None:
        """rows, width: the table's starting size; it grows on the device when a step needs more."""
        self.device = device
        self.pin = device.type == "cuda"
        self.table = torch.zeros(max(rows, 1), max(width, 1), dtype=torch.int32, device=device)
        self.rows: dict[str, int] = {}  # request id -> its row
        self.held: dict[int, _Row] = {}  # row -> what it holds
        self.free = list(range(self.table.shape[0] - 1, -1, -1))
        self.step = 0
        # Pending writes, one run of pages per row: its row, first column, page count; and the runs' blocks.
        self.runs: tuple[list[int], list[int], list[int]] = ([], [], [])
        self.blocks: list[int] = []
        # The last step's staging buffer (what the dispatch-spy test recognises as pinned host memory).
        self.staging: torch.Tensor | None = None
        self.bytes_uploaded = 0  # host-to-device bytes of the last step

    def rows_for(self, seqs: list[Sequence]) -> list[int]:
        """Each request's row, its pages past those the row holds queued for the step's upload."""
        self.step += 1
        out = []
        width = max((len(s.block_table) for s in seqs), default=0)
        if width > self.table.shape[1]:
            self._grow(self.table.shape[0], max(width, 2 * self.table.shape[1]))
        live = {s.request_id for s in seqs}
        for seq in seqs:
            row = self.rows.get(seq.request_id)
            if row is None:
                row = self._take(live)
                self.rows[seq.request_id] = row
            held = self.held.get(row)
            blocks = seq.block_table
            first = held.known if held is not None and held.blocks is blocks and held.known <= len(blocks) else 0
            if first < len(blocks):
                self.runs[0].append(row)
                self.runs[1].append(first)
                self.runs[2].append(len(blocks) - first)
                self.blocks.extend(blocks[first:])
            self.held[row] = _Row(seq.request_id, blocks, len(blocks), self.step)
            out.append(row)
        return out

    def upload(self, vectors: list[list[int]]) -> list[torch.Tensor]:
        """The vectors on the device (int64), after the pending page writes: one copy of one staging buffer, 8 bytes
        a page past 24 a row that changed."""
        rows, firsts, counts = self.runs
        blocks = self.blocks
        self.runs, self.blocks = ([], [], []), []
        flat = [v for vec in (*vectors, rows, firsts, counts, blocks) for v in vec]
        if not flat:
            self.bytes_uploaded = 0
            return [torch.empty(0, dtype=torch.long, device=self.device) for _ in vectors]
        self.staging = torch.tensor(flat, dtype=torch.long, pin_memory=self.pin)
        on_device = torch.empty(len(flat), dtype=torch.long, device=self.device)
        on_device.copy_(self.staging, non_blocking=True)
        self.bytes_uploaded = self.staging.numel() * self.staging.element_size()
        parts, at = [], 0
        for n in [len(v) for v in vectors] + [len(rows)] * 3 + [len(blocks)]:
            parts.append(on_device[at:at + n])
            at += n
        if blocks:
            r, first, count, b = parts[-4:]
            k = len(blocks)  # known here: the expansions need no host read of a count
            # Page j of the flat run list: its run's row, and column first + (j - the run's start in the list).
            starts = torch.cumsum(count, 0) - count
            page_rows = torch.repeat_interleave(r, count, output_size=k)
            cols = torch.arange(k, device=self.device) + torch.repeat_interleave(first - starts, count, output_size=k)
            self.table.index_put_((page_rows, cols), b.to(torch.int32))
        return parts[:len(vectors)]

    def _take(self, live: set[str]) -> int:
        """A free row, else the least recently used row of a request not in this step, else a new row."""
        if not self.free:
            idle = [(h.used, row) for row, h in self.held.items() if h.request_id not in live]
            if idle:
                row = min(idle)[1]
                self.rows.pop(self.held.pop(row).request_id, None)
                return row
            n = self.table.shape[0]
            self._grow(2 * n, self.table.shape[1])
            self.free = list(range(2 * n - 1, n - 1, -1))
        return self.free.pop()

    def _grow(self, rows: int, width: int) -> None:
        """A larger table, the old one copied into it on the device (pending writes use row/column ids, so they
        stay valid)."""
        table = torch.zeros(rows, width, dtype=torch.int32, device=self.device)
        table[:self.table.shape[0], :self.table.shape[1]].copy_(self.table)
        self.table = table
