"""The grouped MoE kernel (engine/layers/moe_triton.py) against the loop (engine/layers/moe_dispatch.py) on the same
rows sorted by expert: experts with no rows, with fewer rows than a tile and with several tiles; widths that are
not multiples of the tiles (masked edges); with and without biases; float32 (IEEE products) and float16. On CPU it
runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1). Also: the tile map's tiles cover every
row once, and the source uses only triton 3.6's features (the lent image's)."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch
import torch.nn.functional as F

from engine.layers import moe_triton, varlen_triton
from engine.layers.moe_dispatch import expert_loop, expert_path
from engine.layers.moe_triton import BLOCK_M, expert_grouped, tile_map
from tests.helpers.triton_device import kernel_device

COUNTS = [0, 5, 2 * BLOCK_M + 3, 0, BLOCK_M, 1]  # none, under a tile, three tiles, none, exactly one tile, one row
HIDDEN, WIDTH = 48, 40  # 48 = 1.5 K tiles; 2 x 40 = 80 outputs = 1.25 N tiles


def _swiglu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    return F.silu(gate) * up


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_grouped_kernel_is_the_loop(bias: bool, dtype: torch.dtype) -> None:
    dev = kernel_device()
    g = torch.Generator().manual_seed(4)
    e, n = len(COUNTS), sum(COUNTS)
    rows = torch.randn(n, HIDDEN, generator=g).to(dtype)
    gate_up = (torch.randn(e, 2 * WIDTH, HIDDEN, generator=g) * 0.2).to(dtype)
    down = (torch.randn(e, HIDDEN, WIDTH, generator=g) * 0.2).to(dtype)
    gub = torch.randn(e, 2 * WIDTH, generator=g).to(dtype) if bias else None
    db = torch.randn(e, HIDDEN, generator=g).to(dtype) if bias else None
    counts = torch.tensor(COUNTS)
    # The loop in float32 on the same (rounded) inputs: the kernel accumulates in float32 too.
    want = expert_loop(rows.float(), counts, gate_up.float(), down.float(), None if gub is None else gub.float(),
                       None if db is None else db.float(), _swiglu)
    got = expert_grouped(*(t.to(dev) if t is not None else None for t in (rows, counts, gate_up, down, gub, db)),
                         _swiglu)
    assert got.dtype == dtype
    err = (got.float().cpu() - want).abs().max().item()
    assert err <= (1e-5 if dtype == torch.float32 else 2e-2), err


def test_tiles_cover_each_row_once_within_one_expert() -> None:
    expert, lo, hi = tile_map(torch.tensor(COUNTS), sum(COUNTS))
    starts = [0]
    for c in COUNTS:
        starts.append(starts[-1] + c)
    seen: list[int] = []
    for ex, a, b in zip(expert.tolist(), lo.tolist(), hi.tolist(), strict=True):
        if ex < 0:
            continue
        assert starts[ex] <= a < b == starts[ex + 1]  # inside its expert's run, up to its end
        seen += range(a, min(a + BLOCK_M, b))
    assert sorted(seen) == list(range(sum(COUNTS)))


def test_the_grouped_path_is_cuda_only() -> None:
    """The CPU keeps the loop (bench/device's moe section measures the kernel on a GPU)."""
    assert expert_path(torch.device("cpu")) == "loop"


def test_kernel_source_uses_only_triton_36_features() -> None:
    tree = ast.parse(inspect.getsource(moe_triton))
    used = {f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
            and node.value.id in ("tl", "triton")}
    assert used == moe_triton.TRITON_36_FEATURES
    # A subset of the attention kernel's list, which tests/engine/test_varlen_triton.py checks against 3.6's API.
    assert moe_triton.TRITON_36_FEATURES <= varlen_triton.TRITON_36_FEATURES
    assert "tl.range(" not in inspect.getsource(moe_triton)
