"""Our Triton paged-attention kernel (engine/layers/varlen_triton.py) at the shapes real models send: pages of 16,
head_dim 128, GQA 4 and 8 (folded: one program per KV head's group), more than 16 new tokens per request (the
prefill tile), decodes, windows, soft-cap and attention sinks, float32 and float16, against the reference kernel.
On CPU it runs in Triton's interpreter (tests/conftest.py sets TRITON_INTERPRET=1); triton is a dev dependency, so
these never skip for want of it. Also: the kernel's source uses only the triton features 3.6 has (the lent image's)."""

from __future__ import annotations

import ast
import inspect

import pytest
import torch

from engine.layers import varlen_triton
from engine.layers.varlen import VarlenInputs, varlen_attention_reference
from engine.layers.varlen_triton import TILES, TRITON_36_FEATURES, tiles_for, varlen_attention_triton
from tests.helpers.triton_device import kernel_device

PAGE, D, HKV = 16, 128, 2


# (tokens already cached, new tokens) per request.
LAYOUTS = {
    "prefill": ([0, 0], [40, 9]),  # 40 new tokens: past 16, the prefill tile
    "chunk-after-context": ([37, 70], [21, 3]),
    "decodes": ([0, 15, 16, 101], [1, 1, 1, 1]),  # page boundaries: key 15 is a page's last, 16 the next one's first
}


def _step(starts: list[int], lens: list[int], groups: int, dtype: torch.dtype, seed: int = 0):
    """q, paged K/V (each request's pages shuffled through the pool) and the contract's inputs."""
    g = torch.Generator().manual_seed(seed)
    used = [s + n for s, n in zip(starts, lens, strict=True)]
    need = [-(-u // PAGE) for u in used]
    perm = torch.randperm(sum(need) + 2, generator=g).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at:at + n])
        at += n
    kp, vp = (torch.randn(len(perm), PAGE, HKV, D, generator=g).to(dtype) for _ in range(2))
    q = torch.randn(sum(lens), HKV * groups, D, generator=g).to(dtype)
    return q, kp, vp, VarlenInputs.build(starts, lens, tables, torch.device("cpu"))


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("groups", [4, 8])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (24, None), (None, 20.0), (24, 20.0)])
def test_kernel_is_the_reference_at_model_shapes(layout: str, groups: int, dtype: torch.dtype, window: int | None,
                                                 softcap: float | None) -> None:
    dev = kernel_device()
    q, kp, vp, x = _step(*LAYOUTS[layout], groups, dtype)
    args = (x.cu_seqlens_q, x.seqused_k, x.block_table, x.max_seqlen_q, x.max_seqlen_k, D ** -0.5)
    # The reference in float32 on the same (rounded) inputs: the kernel accumulates in float32 too.
    want = varlen_attention_reference(q.float(), kp.float(), vp.float(), *args, window=window, softcap=softcap)
    got = varlen_attention_triton(*(t.to(dev) for t in (q, kp, vp, *args[:3])), *args[3:], window=window,
                                  softcap=softcap)
    assert got.dtype == dtype
    err = (got.float().cpu() - want).abs().max().item()
    # float32: IEEE products (no TF32). float16: the output's rounding (2^-11 relative at |out| < 4: 2e-3) plus
    # the probabilities rounded to float16 before P @ V.
    assert err < (2e-5 if dtype == torch.float32 else 4e-3), err


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize("window", [None, 24])
def test_sinks_are_the_reference(layout: str, dtype: torch.dtype, window: int | None) -> None:
    """gpt-oss's attention sinks (a logit per query head in the denominator), GQA 4: sinks from -2 to 6, so some
    outweigh every score (the running max moves to the sink) and some do not."""
    dev = kernel_device()
    q, kp, vp, x = _step(*LAYOUTS[layout], 4, dtype)
    sinks = torch.linspace(-2.0, 6.0, HKV * 4).to(dtype)
    args = (x.cu_seqlens_q, x.seqused_k, x.block_table, x.max_seqlen_q, x.max_seqlen_k, D ** -0.5)
    want = varlen_attention_reference(q.float(), kp.float(), vp.float(), *args, window=window, sinks=sinks.float())
    plain = varlen_attention_reference(q.float(), kp.float(), vp.float(), *args, window=window)
    got = varlen_attention_triton(*(t.to(dev) for t in (q, kp, vp, *args[:3])), *args[3:], window=window,
                                  sinks=sinks.to(dev))
    err = (got.float().cpu() - want).abs().max().item()
    assert err < (2e-5 if dtype == torch.float32 else 4e-3), err
    assert (want - plain).abs().max().item() > 0.1  # the sinks matter at these values


def test_tiles_by_shape() -> None:
    """A step whose requests have at most 16 rows (new tokens x the padded group) takes the 16-row decode tile;
    more rows, the 64-row prefill tile; heads wider than 128, a narrower key tile."""
    assert tiles_for(1, 8, 128) == ("decode", TILES["decode"])
    assert tiles_for(2, 8, 128)[0] == "decode" and tiles_for(3, 8, 128)[0] == "prefill"
    assert tiles_for(17, 1, 128)[0] == "prefill" and tiles_for(16, 1, 64)[0] == "decode"
    assert tiles_for(40, 4, 256) == ("prefill_wide_head", TILES["prefill_wide_head"])
    assert tiles_for(1, 128, 128)[1].rows == 128  # a group larger than the tile: the tile grows to hold it


def test_gqa_group_read_once_per_program() -> None:
    """The grid's last axis is the KV head, and each program covers all of its group's query heads: poison one
    KV head's pages and exactly its group's query heads change."""
    dev = kernel_device()
    q, kp, vp, x = _step([5], [3], 4, torch.float32)
    args = (x.cu_seqlens_q, x.seqused_k, x.block_table, x.max_seqlen_q, x.max_seqlen_k, D ** -0.5)
    base = varlen_attention_triton(*(t.to(dev) for t in (q, kp, vp, *args[:3])), *args[3:]).cpu()
    vp2 = vp.clone()
    vp2[:, :, 1] += 1.0
    moved = varlen_attention_triton(*(t.to(dev) for t in (q, kp, vp2, *args[:3])), *args[3:]).cpu()
    changed = [h for h in range(8) if not torch.equal(base[:, h], moved[:, h])]
    assert changed == [4, 5, 6, 7]


def _names_used(source: str) -> set[str]:
    """Every `triton.X` and `tl.X` attribute the source reads."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in ("tl", "triton"):
            names.add(f"{node.value.id}.{node.attr}")
    return names


def test_kernel_uses_only_triton_36_features() -> None:
    """The lent GPU image has triton 3.6: the kernel's file names exactly the features it uses (each checked to be
    in 3.6's triton.language / triton API), and the installed triton has them too. tl.dot's input_precision and the
    launch options num_warps / num_stages are 3.6's as well."""
    source = inspect.getsource(varlen_triton)
    assert _names_used(source) == TRITON_36_FEATURES
    import triton
    import triton.language as tl

    for name in TRITON_36_FEATURES:
        mod, attr = name.split(".")
        assert hasattr({"tl": tl, "triton": triton}[mod], attr), name
    assert "input_precision" in inspect.signature(tl.dot).parameters
    # Nothing newer than 3.6 slipped in through another spelling (these arrived or were renamed after it).
    for newer in ("tl.gather", "tl.tensor_descriptor", "tl.make_tensor_descriptor", "tl.experimental", "tl.range("):
        assert newer not in source
