"""Batch-invariant kernels: each row's bits, compared with torch.equal, stay the same whatever the
number of rows, their offset, the chunk boundaries and the key length; each has a control showing the default
kernel is not bitwise invariant on the same cases (so these tests can fail); and the mode stays within 1e-4 of
transformers."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM

from engine.invariant.activation import check_silu, invariant_silu
from engine.invariant.attention import KEY_BLOCK, InvariantPagedAttention, check
from engine.invariant.mode import set_batch_invariant
from engine.invariant.row_plan import InvariantModeError, RowPlan, calibrate
from engine.layers import linear as lin
from engine.layers.attention import TorchPagedAttention
from engine.layers.linear import Linear, linear
from engine.layers.norm import RMSNorm
from engine.loading.loader import load_model
from engine.runner.logprobs import row_scores, score_rows
from engine.runner.sampler import sample
from engine.runner.scorer import RowRequest, RowScorer
from protocol.sampling import SamplingParams
from tests.helpers.invariant import chunked, merge, run_attention, run_model
from tests.helpers.reference import hf_scores

ROWS = range(1, 71)
OFFSETS = [0, 5, 64, 101]


def _rows_differ(f, x: torch.Tensor) -> list[tuple[int, int]]:  # noqa: ANN001
    """(rows, offset) cases where f over x[offset:offset+rows] does not give full-batch f(x)'s rows, bitwise."""
    ref = f(x)
    return [(m, o) for m in ROWS for o in OFFSETS if not torch.equal(f(x[o:o + m]), ref[o:o + m])]


def _planned(out: int, inp: int, bias: bool, seed: int, max_rows: int = 2048) -> Linear:
    g = torch.Generator().manual_seed(seed)
    m = Linear(inp, out, bias=bias)
    with torch.no_grad():
        m.weight.copy_(torch.randn(out, inp, generator=g) / inp ** 0.5)
        if bias:
            m.bias.copy_(torch.randn(out, generator=g))
    m.requires_grad_(False)
    m.row_plan = m.calibrate(max_rows, f"test {inp}->{out}")
    return m


# SmolLM2's shapes: fused q/k/v (with a bias, as Qwen2 has), o, gate/up, down (the one whose rows MKL computed
# otherwise in calls of 57-192 rows on a 2-core AVX-512 Xeon), and the LM head (oneDNN).
@pytest.mark.parametrize("out,inp,bias", [(960, 576, True), (576, 576, False), (3072, 576, False),
                                          (576, 1536, False), (lin.MIN_WIDE_FEATURES, 576, False)])
def test_invariant_linear_rows_are_invariant(out: int, inp: int, bias: bool) -> None:
    """A needle's rows computed alone (1-70 rows, several offsets), amid 57-255 rows, and in steps of over 256 rows
    have one set of bits, and stay within float32 rounding of F.linear."""
    m = _planned(out, inp, bias, seed=out + inp)
    x = torch.randn(2100, inp, generator=torch.Generator().manual_seed(3))
    with torch.inference_mode():
        ref = m(x)
        assert _rows_differ(m, x[:180]) == []
        for n, o in [(57, 0), (100, 3), (129, 64), (192, 5), (200, 17), (255, 0), (257, 1), (513, 187),
                     (1000, 33), (2100, 0)]:
            assert torch.equal(m(x[o:o + n]), ref[o:o + n]), (n, o)
        torch.testing.assert_close(ref, F.linear(x, m.weight, m.bias), rtol=1e-5, atol=1e-5)


def test_row_plan_covers_any_count_with_checked_sizes_only() -> None:
    plan = RowPlan(16, (16, 32, 48, 256, 512), threads=1)
    for n in range(1, 3000, 7):
        pieces = plan.pieces(n)
        # checked counts only; covering n; no piece that could be dropped
        assert set(pieces) <= set(plan.sizes) and 0 <= sum(pieces) - n < min(pieces), (n, pieces)
    assert plan.pieces(100) == (48, 48, 16)  # 64-192 were not checked: three calls, never one of 112
    assert plan.pieces(162) == (256,)  # cheaper padded (256 + 1 call) than four calls of 176 rows
    assert plan.pieces(2048) == (512, 512, 512, 512)


def test_calibrate_keeps_the_counts_that_compute_like_the_reference_and_refuses_a_moving_row() -> None:
    """The checker itself, on calls whose behaviour is known: one that rounds otherwise in calls of 64-192 rows
    (as MKL did) loses exactly those counts; one whose row bits follow the row's place refuses the mode."""
    w = torch.randn(40, 24, generator=torch.Generator().manual_seed(5))

    def by_count(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x @ w.t())
        if 64 <= x.shape[0] <= 192:
            out.add_(1e-3).sub_(1e-3)  # other rounding, same value to ~1e-7

    plan = calibrate(by_count, 24, 40, torch.float32, torch.device("cpu"), 2048, "by_count")
    assert plan.sizes == (16, 32, 48, 256, 384, 512, 768, 1024, 1536, 2048)

    def by_place(x: torch.Tensor, out: torch.Tensor) -> None:
        out.copy_(x @ w.t())
        out[-1].add_(1e-3).sub_(1e-3)

    with pytest.raises(InvariantModeError, match="other bits at another place"):
        calibrate(by_place, 24, 40, torch.float32, torch.device("cpu"), 2048, "by_place")


def test_invariant_linear_refuses_another_thread_count() -> None:
    m = _planned(64, 32, False, seed=9, max_rows=64)
    threads = torch.get_num_threads()
    torch.set_num_threads(threads + 1)
    try:
        with torch.inference_mode(), pytest.raises(InvariantModeError, match="threads"):
            m(torch.randn(20, 32))
    finally:
        torch.set_num_threads(threads)


def test_attention_check_passes_here_and_names_what_it_covers() -> None:
    """The batch-count property attention takes from BLAS holds on the machine running the suite (else the mode
    would refuse to start, and the tests below would say nothing)."""
    check(3, 64, torch.float32, torch.device("cpu"), 200)


def test_control_default_linear_is_not_row_invariant() -> None:
    """MKL gives a row other bits in a call of fewer than 16 rows (the padding above exists for this)."""
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(180, 128, generator=g), torch.randn(960, 128, generator=g) / 11
    assert _rows_differ(lambda t: linear(t, w), x), "default linear happened to be row-invariant on this CPU"


def test_rmsnorm_rows_are_invariant() -> None:
    """No switch and no control: the norm's mean, rsqrt and products give a row the same bits at any row count
    (measured); asserted so a torch upgrade that breaks it shows here."""
    norm = RMSNorm(576, 1e-5)
    torch.nn.init.normal_(norm.weight)
    x = torch.randn(180, 576, generator=torch.Generator().manual_seed(2))
    with torch.inference_mode():
        assert _rows_differ(norm, x) == []


def test_silu_bits_do_not_follow_position() -> None:
    """The same values at other places of a tensor (scalar tail vs vector lanes): F.silu rounds them otherwise
    (the control), the invariant SiLU does not; and it is SiLU."""
    x = torch.randn(4000, generator=torch.Generator().manual_seed(4)) * 5

    def moved(f) -> int:  # noqa: ANN001
        ref = f(x)
        return sum(not torch.equal(f(x[i:i + 33]), ref[i:i + 33]) for i in range(0, 3000, 7))

    assert moved(invariant_silu) == 0
    check_silu(torch.float32, torch.device("cpu"))  # what the mode checks at start holds here
    assert moved(F.silu) > 0, "F.silu happened to round its tail like its lanes on this CPU"
    torch.testing.assert_close(invariant_silu(x), F.silu(x), rtol=1e-6, atol=1e-6)


def test_tiled_log_softmax_rows_are_invariant() -> None:
    """No control: torch's CPU log_softmax is already row-wise here (measured); the tiles hold it to that."""
    x = torch.randn(150, 4096, generator=torch.Generator().manual_seed(3)) * 4
    assert _rows_differ(lambda t: row_scores(t, "raw_logprobs", invariant=True), x) == []
    assert torch.equal(row_scores(x, "raw_logprobs", invariant=True), F.log_softmax(x, dim=-1))


# --- attention --------------------------------------------------------------------------------------------
HQ, HKV, D = 9, 3, 64  # SmolLM2's heads


def _qkv(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, HQ, D, generator=g), torch.randn(n, HKV, D, generator=g),
            torch.randn(n, HKV, D, generator=g))


# The needle spans three key blocks, so the online softmax carries across blocks.
NEEDLE = 2 * KEY_BLOCK + 88
LONG = 3 * KEY_BLOCK + 20
QKV = {"needle": _qkv(NEEDLE, 0), "long": _qkv(LONG, 1), "short": _qkv(40, 2), "x": _qkv(70, 3)}
SCHEDULES = {
    "one chunk": chunked("needle", NEEDLE, [NEEDLE]),
    "chunks 7/block/33": chunked("needle", NEEDLE, [7, KEY_BLOCK, 33]),
    "chunks 1/2/3/rest": chunked("needle", NEEDLE, [1, 2, 3, NEEDLE - 6]),
    "decode one by one": chunked("needle", NEEDLE, [NEEDLE - 20, 1]),
    "decode amid decodes and prefills": merge(chunked("needle", NEEDLE, [NEEDLE - 22, 1]),
                                               chunked("long", LONG, [LONG - 20, 1]),
                                               chunked("short", 40, [20, 1]), chunked("x", 70, [13])),
    "prefill amid a long decode": merge(chunked("long", LONG, [LONG - 2, 1]), [[]] + chunked("needle", NEEDLE, [70])),
}


def _attention(backend: object) -> dict[str, torch.Tensor]:
    return {name: run_attention(backend, QKV, steps, D ** -0.5)["needle"]  # type: ignore[arg-type]
            for name, steps in SCHEDULES.items()}


def test_attention_is_bitwise_invariant() -> None:
    outs = _attention(InvariantPagedAttention())
    base = outs["one chunk"]
    assert {name: torch.equal(o, base) for name, o in outs.items()} == dict.fromkeys(outs, True)
    q, k, v = (t.transpose(0, 1) for t in QKV["needle"])
    ref = F.scaled_dot_product_attention(q, k.repeat_interleave(3, 0), v.repeat_interleave(3, 0), is_causal=True)
    torch.testing.assert_close(base, ref.transpose(0, 1), rtol=1e-5, atol=1e-5)


def test_control_default_attention_is_not_invariant() -> None:
    outs = _attention(TorchPagedAttention())
    base = outs["one chunk"]
    assert not all(torch.equal(o, base) for o in outs.values())


# --- whole model, scoring, sampling -----------------------------------------------------------------------
def _scores(model: torch.nn.Module, hidden: torch.Tensor, ids: list[int], invariant: bool) -> torch.Tensor:
    rows = score_rows(hidden[:-1], model.compute_logits, torch.tensor(ids[1:]),
                      [0] * (len(ids) - 1), "raw_logprobs", 256, invariant)
    return torch.tensor([v for v, _ in rows.values])


@torch.inference_mode()
def _hf_scores(path: object, ids: list[int], layers: int | None) -> torch.Tensor:
    """transformers' log-softmax at each next token, of the checkpoint's first `layers` layers (None: all)."""
    if layers is None:
        return torch.tensor(hf_scores(path, ids, 0))  # type: ignore[arg-type]
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    hf.model.layers = hf.model.layers[:layers]
    hf.config.num_hidden_layers = layers
    lp = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), dim=-1)
    return lp[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]


def _model_runs(path: object, n: int, invariant_only: bool = False,
                layers: int | None = None) -> dict[bool, dict[str, torch.Tensor]]:
    """The needle's scores per mode (True: invariant) and schedule, plus transformers' ("hf"); `layers`: keep
    only the checkpoint's first layers (real weights, a fraction of the time)."""
    model, cfg = load_model(path, "float32", torch.device("cpu"))  # type: ignore[arg-type]
    if layers is not None:
        model.model.layers = model.model.layers[:layers]
    g = torch.Generator().manual_seed(5)
    ids = {name: torch.randint(0, cfg.vocab_size, (m,), generator=g).tolist()
           for name, m in {"needle": n, "other": 70, "third": 20}.items()}
    schedules = {
        "alone": chunked("needle", n, [n]),
        "chunked": chunked("needle", n, [1, 17, 40]),
        # Prefill chunks beside single-token (decode-shaped) steps of longer and shorter contexts.
        "amid others": merge(chunked("other", 70, [30, 1, 1, 38]), chunked("needle", n, [33, 7, 1]),
                             chunked("third", 20, [1, 1, 18])),
    }
    hf = _hf_scores(path, ids["needle"], layers)
    out = {}
    for invariant in (True,) if invariant_only else (True, False):
        set_batch_invariant(model, invariant)
        backend = InvariantPagedAttention() if invariant else TorchPagedAttention()
        out[invariant] = {name: _scores(model, run_model(model, backend, ids, steps)["needle"], ids["needle"],
                                        invariant) for name, steps in schedules.items()}
        out[invariant]["hf"] = hf
    return out


@pytest.mark.parametrize("name", ["llama", "qwen2"])
def test_tiny_model_scores_invariant_and_exact(tiny_models, name: str) -> None:  # noqa: ANN001
    out = _model_runs(tiny_models[name], 100, invariant_only=True)[True]
    assert all(torch.equal(out[k], out["alone"]) for k in ("chunked", "amid others"))
    torch.testing.assert_close(out["alone"], out["hf"], rtol=0, atol=1e-4)


def test_smollm2_scores_invariant_exact_and_control(smollm2_path) -> None:  # noqa: ANN001
    """SmolLM2's real weights, its first 4 of 30 layers (the kernels are the same in every layer)."""
    out = _model_runs(smollm2_path, 80, layers=4)
    inv, default = out[True], out[False]  # default: the control, same cases
    assert all(torch.equal(inv[k], inv["alone"]) for k in ("chunked", "amid others"))
    torch.testing.assert_close(inv["alone"], inv["hf"], rtol=0, atol=1e-4)
    assert not all(torch.equal(default[k], default["alone"]) for k in ("chunked", "amid others"))


def _rows(targets: torch.Tensor, slots: torch.Tensor, cached: bool) -> RowRequest:
    n = len(targets)
    return RowRequest(targets, [0] * n, slots, torch.full((n,), cached), [1.0] * n, [None] * n)


def test_scorer_bypasses_the_shortcut(tiny_models) -> None:  # noqa: ANN001
    """A cached row (hidden state from the store, log-sum-exp known) gets the fresh row's bits in invariant
    mode; the default scorer's shortcut (h . W[t] - lse) rounds otherwise (the control)."""
    model, cfg = load_model(tiny_models["llama"], "float32", torch.device("cpu"))
    hidden = torch.randn(40, cfg.hidden_size, generator=torch.Generator().manual_seed(6))
    targets = torch.randint(0, cfg.vocab_size, (40,), generator=torch.Generator().manual_seed(7))
    slots = torch.arange(40)
    differs = {}
    for invariant in (True, False):
        set_batch_invariant(model, invariant)
        scorer = RowScorer(model, "raw_logprobs", 256, 64, torch.device("cpu"),
                           lse_store=True, batch_invariant=invariant)
        with torch.inference_mode():
            fresh = scorer.score(hidden, _rows(targets, slots, False)).values
            # Again as cached rows, a few at a time: the default scorer now takes its shortcut.
            cached = [v for lo in range(0, 40, 3)
                      for v in scorer.score(hidden[lo:lo + 3],
                                            _rows(targets[lo:lo + 3], slots[lo:lo + 3], True)).values]
        differs[invariant] = cached != fresh
    assert differs == {True: False, False: True}


def test_sampling_depends_only_on_the_row() -> None:
    """Greedy is the argmax of its own row; a seeded row draws the same token alone or in any batch."""
    logits = torch.randn(70, 4096, generator=torch.Generator().manual_seed(8)) * 3
    params = [SamplingParams(temperature=0.0) if i % 3 == 0 else
              SamplingParams(temperature=0.8, top_p=0.9, top_k=50, min_p=0.01) for i in range(70)]

    def run(rows: range) -> list[int]:
        gens = [torch.Generator().manual_seed(1000 + i) for i in rows]
        return sample(logits[list(rows)], [params[i] for i in rows], gens).tolist()

    full = run(range(70))
    assert full[::3] == logits[::3].argmax(-1).tolist()
    for m, o in [(1, 0), (1, 4), (5, 7), (33, 30)]:
        assert run(range(o, o + m)) == full[o:o + m]
