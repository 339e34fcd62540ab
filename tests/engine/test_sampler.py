"""The sampler as a pure function of logits and per-row parameters."""

from __future__ import annotations

import torch

from engine.runner.sampler import apply_filters, sample
from protocol.sampling import SamplingParams


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


def test_greedy_is_argmax() -> None:
    logits = torch.randn(3, 50)
    out = sample(logits, [SamplingParams(temperature=0)] * 3, [_gen(0)] * 3)
    assert out.tolist() == logits.argmax(-1).tolist()


def test_top_k_keeps_k_best() -> None:
    logits = torch.arange(10.0)[None, :]
    x = apply_filters(logits, [SamplingParams(top_k=3)])
    assert torch.isfinite(x).nonzero()[:, 1].tolist() == [7, 8, 9]


def test_top_p_keeps_smallest_set_reaching_p() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    x = apply_filters(probs.log(), [SamplingParams(top_p=0.75)])
    assert torch.isfinite(x).nonzero()[:, 1].tolist() == [0, 1]


def test_min_p_drops_unlikely() -> None:
    probs = torch.tensor([[0.6, 0.3, 0.07, 0.03]])
    x = apply_filters(probs.log(), [SamplingParams(min_p=0.1)])
    assert torch.isfinite(x).nonzero()[:, 1].tolist() == [0, 1, 2]


def test_temperature_alone_skips_the_masks_and_keeps_every_value() -> None:
    """Rows that no top-k, top-p or min-p can cut take the shortcut (logits / T); a row that takes the masks but
    drops nothing gives the same values, so either way a seeded draw is the same token."""
    torch.manual_seed(0)
    logits = torch.randn(2, 100)
    plain = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3, top_k=100, top_p=1.0)]
    x = apply_filters(logits, plain)
    assert torch.equal(x, logits / torch.tensor([[0.7], [1.3]]))
    masked = apply_filters(logits, [SamplingParams(temperature=0.7, min_p=1e-30),
                                    SamplingParams(temperature=1.3, min_p=1e-30)])  # the masks, nothing dropped
    assert torch.equal(x, masked)
    assert sample(logits, plain, [_gen(5), _gen(6)]).tolist() == sample(
        logits, [SamplingParams(temperature=0.7, min_p=1e-30), SamplingParams(temperature=1.3, min_p=1e-30)],
        [_gen(5), _gen(6)]).tolist()


def test_seeded_rows_independent_of_batch() -> None:
    torch.manual_seed(0)
    logits = torch.randn(4, 100)
    p = SamplingParams(temperature=1.0, seed=7)
    alone = [sample(logits[2:3], [p], [_gen(7)]).item() for _ in range(1)]
    batch = sample(logits, [SamplingParams(temperature=0.5)] * 2 + [p, SamplingParams(temperature=0)],
                   [_gen(1), _gen(2), _gen(7), _gen(3)])
    assert batch[2].item() == alone[0]


def test_sampling_follows_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0]])
    g = _gen(0)
    counts = torch.zeros(3)
    for _ in range(3000):
        counts[sample(logits, [SamplingParams(temperature=1.0)], [g]).item()] += 1
    assert torch.allclose(counts / 3000, logits.softmax(-1)[0], atol=0.03)
