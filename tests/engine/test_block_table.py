"""The device-resident block tables (engine/runner/block_table.py): after every step each request's row holds its
table exactly, through growth, preemption (a new list), row reuse and a table wider than the device's."""

from __future__ import annotations

import random

import torch

from engine.core.sequence import Sequence
from engine.runner.block_table import DeviceBlockTables
from protocol.sampling import SamplingParams


def _seq(rid: str) -> Sequence:
    return Sequence(rid, [1], SamplingParams(max_tokens=1))


def _check(tables: DeviceBlockTables, seqs: list[Sequence], rows: list[int]) -> None:
    for seq, row in zip(seqs, rows, strict=True):
        assert tables.table[row, :len(seq.block_table)].tolist() == seq.block_table


def test_rows_follow_their_tables_through_growth_preemption_and_reuse() -> None:
    rng = random.Random(0)
    tables = DeviceBlockTables(torch.device("cpu"), rows=2)
    seqs = [_seq(f"r{i}") for i in range(5)]
    for step in range(40):
        picked = rng.sample(seqs, rng.randint(1, 4))  # some requests skip steps; rows are reused meanwhile
        for seq in picked:
            if rng.random() < 0.1:
                seq.block_table = [rng.randrange(1000) for _ in range(rng.randint(0, 3))]  # freed, readmitted
            else:
                seq.block_table.extend(rng.randrange(1000) for _ in range(rng.randint(0, 3)))
        rows = tables.rows_for(picked)
        assert len(set(rows)) == len(rows)
        tables.upload([[step]])
        _check(tables, picked, rows)


def test_only_new_pages_cross() -> None:
    tables = DeviceBlockTables(torch.device("cpu"), rows=1)
    seq = _seq("a")
    seq.block_table = list(range(100))
    tables.rows_for([seq])
    tables.upload([])
    assert tables.bytes_uploaded == 8 * (3 + 100)  # one run, every page
    tables.rows_for([seq])
    tables.upload([[7]])
    assert tables.bytes_uploaded == 8  # nothing changed: the step's own vector only
    seq.block_table.append(100)
    rows = tables.rows_for([seq])
    tables.upload([])
    assert tables.bytes_uploaded == 8 * (3 + 1)
    _check(tables, [seq], rows)
