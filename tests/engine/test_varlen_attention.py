"""The varlen paged-attention contract (engine/layers/varlen.py): its reference kernel against a plain per-request
attention over the same keys and against today's TorchPagedAttention, and the inputs built from a step's layout
(cumulative query lengths, used key lengths, block tables, windows) in every shape a step has: prefill from 0,
chunks after a cached context, prefix hits, decodes, sliding windows, soft-cap, GQA."""

from __future__ import annotations

import pytest
import torch

from engine.layers.attention import AttentionMetadata, TorchPagedAttention, VarlenPagedAttention
from engine.layers.varlen import VarlenInputs, kernel_blocker, torch_varlen_missing, varlen_attention_reference
from engine.layers.window import window_mask

BS = 4  # block size
HQ, HKV, D = 4, 2, 8


def _step(starts: list[int], lens: list[int], seed: int = 0):
    """A paged cache holding each request's context (in shuffled blocks) and the step's new q/k/v."""
    g = torch.Generator().manual_seed(seed)
    used = [s + n for s, n in zip(starts, lens, strict=True)]
    need = [(u + BS - 1) // BS + 1 for u in used]  # one spare block each: tables may run past the keys
    perm = torch.randperm(sum(need) + 3, generator=g).tolist()
    tables, at = [], 0
    for n in need:
        tables.append(perm[at:at + n])
        at += n
    k_cache = torch.randn(len(perm) * BS, HKV, D, generator=g)
    v_cache = torch.randn(len(perm) * BS, HKV, D, generator=g)
    t = sum(lens)
    q = torch.randn(t, HQ, D, generator=g)
    k = torch.randn(t, HKV, D, generator=g)
    v = torch.randn(t, HKV, D, generator=g)
    slots = [torch.tensor([b * BS + o for b in table for o in range(BS)]) for table in tables]
    meta = AttentionMetadata(slot_mapping=torch.cat([sl[s:s + n] for sl, s, n in zip(slots, starts, lens,
                                                                                      strict=True)]),
                             starts=list(starts), lens=list(lens),
                             context_slots=[sl[:s + n] for sl, s, n in zip(slots, starts, lens, strict=True)],
                             block_tables=tables)
    return q, k, v, k_cache, v_cache, meta


def _plain(q, k_cache, v_cache, meta, scale, window, softcap, sinks=None) -> torch.Tensor:
    """Per request: its keys by slot, the full [n, S] score matrix in float64, masked, softmax (with each head's sink
    logit as one more column, then dropped), @ V."""
    out, at = torch.empty_like(q), 0
    g = HQ // HKV
    for s, n, slots in zip(meta.starts, meta.lens, meta.context_slots, strict=True):
        qi = q[at:at + n].double().transpose(0, 1)  # [Hq, n, D]
        ki = k_cache[slots].double().repeat_interleave(g, 1).transpose(0, 1)  # [Hq, S, D]
        vi = v_cache[slots].double().repeat_interleave(g, 1).transpose(0, 1)
        scores = qi @ ki.transpose(1, 2) * scale
        if softcap is not None:
            scores = torch.tanh(scores / softcap) * softcap
        scores = scores.masked_fill(~window_mask(s, n, window, q.device), float("-inf"))
        if sinks is not None:
            col = sinks.double()[:, None, None].expand(-1, n, 1)
            probs = torch.softmax(torch.cat([scores, col], -1), -1)[..., :-1]
        else:
            probs = torch.softmax(scores, -1)
        out[at:at + n] = (probs @ vi).transpose(0, 1).float()
        at += n
    return out


CASES = {
    "prefill": ([0, 0], [7, 1]),
    "chunk-after-context": ([5, 8], [6, 3]),
    "decodes": ([9, 3, 12, 1], [1, 1, 1, 1]),
    "mixed": ([0, 10, 4, 13, 0], [9, 1, 5, 1, 2]),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (3, None), (5, 2.0), (None, 2.0)])
def test_reference_is_plain_attention_and_todays_path(case: str, window: int | None, softcap: float | None) -> None:
    starts, lens = CASES[case]
    q, k, v, kc, vc, meta = _step(starts, lens)
    scale = 0.3
    # Today's path (decode batch, per-request prefill) on its own copy of the cache.
    meta_t = AttentionMetadata(meta.slot_mapping, meta.starts, meta.lens, meta.context_slots)
    meta_t.finalize(torch.device("cpu"))
    kc_t, vc_t = kc.clone(), vc.clone()
    today = TorchPagedAttention().forward(q, k, v, kc_t, vc_t, meta_t, scale, window=window, softcap=softcap)
    got = VarlenPagedAttention(BS).forward(q, k, v, kc, vc, meta, scale, window=window, softcap=softcap)
    assert torch.equal(kc, kc_t) and torch.equal(vc, vc_t)  # both wrote the new K/V into the same slots
    want = _plain(q, kc, vc, meta, scale, window, softcap)
    assert (got - want).abs().max().item() < 1e-5
    assert (got - today).abs().max().item() < 1e-5
    # One plan per step, shared by the layers.
    assert isinstance(meta.plans["varlen"], VarlenInputs)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("window", [None, 3])
def test_sinks_in_the_reference_and_todays_path(case: str, window: int | None) -> None:
    """gpt-oss's sinks (a logit per query head in the denominator) through the varlen reference and the torch path
    (decodes batched: the sinks folded by KV group), against float64 attention; sinks from -1 to 3 move the
    output."""
    starts, lens = CASES[case]
    q, k, v, kc, vc, meta = _step(starts, lens)
    sinks = torch.linspace(-1.0, 3.0, HQ)
    meta_t = AttentionMetadata(meta.slot_mapping, meta.starts, meta.lens, meta.context_slots)
    meta_t.finalize(torch.device("cpu"))
    today = TorchPagedAttention().forward(q, k, v, kc.clone(), vc.clone(), meta_t, 0.3, window=window, sinks=sinks)
    got = VarlenPagedAttention(BS).forward(q, k, v, kc, vc, meta, 0.3, window=window, sinks=sinks)
    want = _plain(q, kc, vc, meta, 0.3, window, None, sinks)
    assert (got - want).abs().max().item() < 1e-5
    assert (today - want).abs().max().item() < 1e-5
    assert (want - _plain(q, kc, vc, meta, 0.3, window, None)).abs().max().item() > 1e-2


def test_inputs_from_a_step_layout() -> None:
    x = VarlenInputs.build([0, 10, 3], [5, 1, 2], [[7, 2], [1, 4, 9], [3]], torch.device("cpu"))
    assert x.cu_seqlens_q.tolist() == [0, 5, 6, 8] and x.cu_seqlens_q.dtype == torch.int32
    assert x.seqused_k.tolist() == [5, 11, 5] and x.seqused_k.dtype == torch.int32
    assert x.block_table.tolist() == [[7, 2, 0], [1, 4, 9], [3, 0, 0]] and x.block_table.dtype == torch.int32
    assert (x.max_seqlen_q, x.max_seqlen_k) == (5, 11)
    # A fixed width (a CUDA graph's) pads further.
    assert VarlenInputs.build([2], [1], [[6]], torch.device("cpu"), max_blocks=4).block_table.tolist() == [[6, 0, 0, 0]]


def test_window_reads_only_the_blocks_in_view() -> None:
    """Keys before the first query's window are never read: poison them and the result does not move."""
    q, k, v, kc, vc, meta = _step([14], [2])
    x = VarlenInputs.build(meta.starts, meta.lens, meta.block_tables, torch.device("cpu"))
    kc.index_copy_(0, meta.slot_mapping, k)
    vc.index_copy_(0, meta.slot_mapping, v)
    args = (x.cu_seqlens_q, x.seqused_k, x.block_table, x.max_seqlen_q, x.max_seqlen_k, 0.3)
    pages = (-1, BS, HKV, D)
    want = varlen_attention_reference(q, kc.view(pages), vc.view(pages), *args, window=3)
    first_seen = 14 - 3 + 1  # the first query (position 14) sees keys 12 .. 14
    poisoned = [kc.clone(), vc.clone()]
    for c in poisoned:
        c[meta.context_slots[0][:first_seen]] = float("nan")
    got = varlen_attention_reference(q, poisoned[0].view(pages), poisoned[1].view(pages), *args, window=3)
    assert torch.equal(got, want)


def test_cuda_kernel_blocked_on_cpu_with_a_reason() -> None:
    assert kernel_blocker(torch.device("cpu"), torch.bfloat16, 16, 64, False) == "no CUDA device"
    # The running torch's varlen_attn either has the contract's arguments or a reason names what it lacks.
    reason = torch_varlen_missing()
    assert reason is None or "varlen" in reason


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA: the flash kernel")
@pytest.mark.parametrize("shape", ["prefill", "decode"])
@pytest.mark.parametrize("window", [None, 3])
def test_cuda_kernel_matches_reference(shape: str, window: int | None) -> None:
    """Where the running torch's varlen_attn has the paged arguments the engine chooses it, with pages of 256
    (FlashAttention 2's paged rule): then it must run and agree, never skip. Only a torch without the arguments
    (2.11: the engine serves with the Triton kernel) skips, naming what is missing."""
    from engine.layers.varlen import _probe_error, probe_tolerance, varlen_attention_cuda

    missing = torch_varlen_missing()
    if missing is not None:
        pytest.skip(f"the engine does not choose the flash kernel here: {missing}")
    dev = torch.device("cuda")
    assert kernel_blocker(dev, torch.bfloat16, 256, 128, False) is None
    err, mag = _probe_error(varlen_attention_cuda, dev, torch.bfloat16, 256, 128, shape, window, None)
    assert err <= probe_tolerance(torch.bfloat16, mag), (err, mag)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize(("window", "softcap"), [(None, None), (3, None), (5, 2.0)])
def test_triton_kernel_is_the_reference(case: str, window: int | None, softcap: float | None) -> None:
    from engine.layers.varlen_triton import varlen_attention_triton
    from tests.helpers.triton_device import kernel_device

    dev = kernel_device()
    starts, lens = CASES[case]
    q, k, v, kc, vc, meta = _step(starts, lens)
    q, k, v, kc, vc = (t.to(dev) for t in (q, k, v, kc, vc))
    meta.slot_mapping = meta.slot_mapping.to(dev)
    want = VarlenPagedAttention(BS).forward(q, k, v, kc.clone(), vc.clone(), meta, 0.3, window=window,
                                            softcap=softcap)
    meta.plans.clear()
    got = VarlenPagedAttention(BS, varlen_attention_triton).forward(q, k, v, kc, vc, meta, 0.3, window=window,
                                                                    softcap=softcap)
    assert (got - want).abs().max().item() < 1e-5  # float32: IEEE products, no TF32


def test_probe_accepts_the_triton_kernel_and_names_a_wrong_one() -> None:
    from engine.layers.varlen import probe
    from engine.layers.varlen_triton import varlen_attention_triton
    from tests.helpers.triton_device import kernel_device

    dev = kernel_device()
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    assert probe(varlen_attention_triton, dev, dtype, BS, 16, softcap=True) is None

    def no_window(*args, window=None, softcap=None):  # noqa: ANN001, ANN002, ANN202
        return varlen_attention_triton(*args, window=None, softcap=softcap)

    assert "differs from the reference" in (probe(no_window, dev, dtype, BS, 16) or "")
    assert probe(varlen_attention_triton, dev, dtype, BS, 16, softcap=True, sinks=True) is None

    def no_sinks(*args, window=None, softcap=None, sinks=None):  # noqa: ANN001, ANN002, ANN202
        return varlen_attention_triton(*args, window=window, softcap=softcap)

    assert "differs from the reference" in (probe(no_sinks, dev, dtype, BS, 16, sinks=True) or "")


def _off_by_ulps(ulps: float):  # noqa: ANN202
    """A kernel that is the reference in its dtype, every output moved by `ulps` units of least precision at the
    output's magnitude (what rounding in a correct half-precision kernel does, and more)."""
    from engine.layers.varlen import probe_tolerance

    def kernel(q, *args, window=None, softcap=None):  # noqa: ANN001, ANN002, ANN202
        out = varlen_attention_reference(q.float(), *(a.float() if a.is_floating_point() else a for a in args[:2]),
                                         *args[2:], window=window, softcap=softcap)
        step = probe_tolerance(q.dtype, out.abs().max().item()) / 8  # one unit
        return (out + ulps * step).to(q.dtype)

    return kernel


def test_probe_tolerance_is_units_of_the_dtype_at_the_output(caplog: pytest.LogCaptureFixture) -> None:
    """bfloat16 at |output| ~3: one unit is 2^1 x 2^-7 = 0.0156, so a kernel within 2-4 units (which an absolute
    2e-2 refused) passes and one 16 units off is named; the measured errors are logged, both step shapes."""
    from engine.layers.varlen import probe, probe_tolerance

    assert probe_tolerance(torch.bfloat16, 3.0) == 8 * 2.0 ** -6
    assert probe_tolerance(torch.float16, 3.0) == 8 * 2.0 ** -9
    cpu = torch.device("cpu")
    caplog.set_level("INFO", logger="engine.layers.varlen")
    for dtype in (torch.bfloat16, torch.float16):
        assert probe(_off_by_ulps(3), cpu, dtype, 16, 64) is None
        assert "differs from the reference" in (probe(_off_by_ulps(16), cpu, dtype, 256, 64) or "")
    logged = caplog.text
    assert "prefill window None" in logged and "decode window 3" in logged and "max |error|" in logged
