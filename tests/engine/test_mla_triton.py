"""MLA's latent through our Triton paged-attention kernel (engine/layers/varlen_triton.py), in Triton's interpreter
on CPU (tests/conftest.py sets TRITON_INTERPRET=1): one KV head holding [latent, rotary key], the values the same
pages as the keys, every query head in its group; the tiny checkpoints' head dim (32 + 8, not a power of two) and
DeepSeek-V3's (512 + 64) with 16 heads, against the reference kernel."""

from __future__ import annotations

import pytest
import torch

from engine.layers.varlen import VarlenInputs, varlen_attention_reference
from engine.layers.varlen_triton import varlen_attention_triton
from tests.helpers.triton_device import kernel_device

PAGE = 16


@pytest.mark.parametrize(("heads", "dim", "starts", "lens"), [
    (4, 40, [0, 37], [21, 3]),  # tiny: a prefill and a chunk after cached context
    (4, 40, [15, 16, 40], [1, 1, 1]),  # tiny: decodes across page boundaries
    (16, 576, [20, 33], [1, 1]),  # DeepSeek-V3's latent width, decodes
], ids=["tiny-prefill", "tiny-decode", "v3-width-decode"])
def test_latent_attention_is_the_reference(heads: int, dim: int, starts: list[int], lens: list[int]) -> None:
    dev = kernel_device()
    g = torch.Generator().manual_seed(0)
    need = [-(-(s + n) // PAGE) for s, n in zip(starts, lens, strict=True)]
    perm = torch.randperm(sum(need) + 1, generator=g).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at:at + n])
        at += n
    pages = torch.randn(len(perm), PAGE, 1, dim, generator=g)  # [blocks, page, 1 KV head, lora + rope]
    q = torch.randn(sum(lens), heads, dim, generator=g)
    x = VarlenInputs.build(starts, lens, tables, torch.device("cpu"))
    args = (x.cu_seqlens_q, x.seqused_k, x.block_table, x.max_seqlen_q, x.max_seqlen_k, 0.1)
    want = varlen_attention_reference(q, pages, pages, *args)
    got = varlen_attention_triton(*(t.to(dev) for t in (q, pages, pages, *args[:3])), *args[3:])
    assert (got.cpu() - want).abs().max().item() < 2e-5
