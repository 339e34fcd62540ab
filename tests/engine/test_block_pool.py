"""The block pool: ids, reference counts and the free queue, one behaviour per test."""

from __future__ import annotations

import pytest

from engine.core.block_pool import BlockPool


def test_allocate_and_free_round_trip() -> None:
    pool = BlockPool(4)
    a, b = pool.allocate(), pool.allocate()
    assert a != b and pool.num_free == 2 and pool.num_used == 2
    pool.check_integrity([[a], [b]])
    pool.free(a)
    pool.free(b)
    assert pool.num_free == 4
    pool.check_integrity([])


def test_shared_block_freed_with_last_reference() -> None:
    pool = BlockPool(2)
    a = pool.allocate()
    pool.incref(a)
    pool.check_integrity([[a], [a]])
    pool.free(a)
    assert pool.num_free == 1
    pool.free(a)
    assert pool.num_free == 2


def test_exhaustion_and_double_free_are_loud() -> None:
    pool = BlockPool(1)
    a = pool.allocate()
    with pytest.raises(RuntimeError):
        pool.allocate()
    pool.free(a)
    with pytest.raises(AssertionError):
        pool.free(a)


def test_integrity_catches_wrong_owners() -> None:
    pool = BlockPool(3)
    a = pool.allocate()
    with pytest.raises(AssertionError):
        pool.check_integrity([[a], [a]])  # two owners, one reference
    with pytest.raises(AssertionError):
        pool.check_integrity([[a, a]])
