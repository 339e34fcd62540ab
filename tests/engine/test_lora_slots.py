"""LoraSlots.add's two forms (per segment, grouped) against each row's own `x A^T B^T`: segments of several slots,
one slot in two runs, base rows between them and after them left bit-for-bit as the base computed them."""

from __future__ import annotations

import pytest
import torch

from engine.layers import lora as lora_layer
from engine.layers.lora import LoraSlots, LoraStep

PARTS, IN, RANK, SLOTS = [24, 8, 8], 32, 4, 5


def _slots(step: LoraStep) -> LoraSlots:
    torch.manual_seed(0)
    slots = LoraSlots(step, IN, PARTS, SLOTS, RANK, torch.float32, torch.device("cpu"))
    for slot in (0, 2, 3):  # slot 1 empty, slot 4 unused: the step's slots are not consecutive
        for part, width in enumerate(PARTS):
            r = RANK - part  # ranks below max_rank are zero-padded
            slots.set(slot, part, torch.randn(r, IN), torch.randn(width, r), 0.5)
    return slots


@pytest.mark.parametrize("grouped", [False, True], ids=["per-segment", "grouped"])
@pytest.mark.parametrize("segments", [
    [(2, 0, 5), (0, 5, 6), (3, 9, 20), (2, 20, 23)],  # base rows 6..9 and 23..
    [(3, 0, 1), (0, 1, 2), (2, 2, 3), (0, 3, 4)],  # decode-like: one row each
], ids=["runs", "rows"])
def test_add_forms(segments: list[tuple[int, int, int]], grouped: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lora_layer, "GROUPED_ROWS_PER_THREAD", 10**9 if grouped else 0)
    step = LoraStep()
    slots = _slots(step)
    step.set(segments, torch.float32, torch.device("cpu"))
    assert (step.rows is not None) == grouped
    x, y = torch.randn(26, IN), torch.randn(26, sum(PARTS))
    got = slots.add(y.clone(), x)
    want = y.clone()
    adapted = torch.zeros(26, dtype=torch.bool)
    for slot, lo, hi in segments:
        for row in range(lo, hi):
            want[row] += (x[row] @ slots.a_t[slot]) @ slots.b_t[slot]
        adapted[lo:hi] = True
    assert torch.allclose(got, want, atol=1e-5)
    assert torch.equal(got[~adapted], y[~adapted])  # base rows untouched
    assert not torch.allclose(got[adapted], y[adapted])


def test_unused_slot_adds_nothing() -> None:
    step = LoraStep()
    slots = _slots(step)
    step.set([(1, 0, 3), (4, 3, 4)], torch.float32, torch.device("cpu"))
    x, y = torch.randn(4, IN), torch.randn(4, sum(PARTS))
    assert torch.equal(slots.add(y.clone(), x), y)
