"""No NaN reaches the sampler, whatever the float32 temperature: below rulebook.rules.MIN_TEMPERATURE a row is
greedy (a subnormal T such as 1e-40, or 1e-300 which rounds to 0 in float32, overflowed logits / T to inf and
sampled token id 0 from NaN probabilities); above it, every draw is a token the filters kept. Scoring rows at any
temperature the rulebook admits are finite. Property tests over float32's subnormal and extreme ranges."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.runner.logprobs import score_rows
from engine.runner.sampler import apply_filters, sample
from protocol.sampling import SamplingParams
from rulebook import rules

VOCAB = 64
FLOAT32_MAX = 3.4028234663852886e38

# Every float32 below the threshold: 0, subnormals (down to 1.4e-45), tiny normals; as Python floats also values
# that round to 0 in float32 (1e-300).
BELOW_32 = 9.999999747378752e-06  # the largest float32 below MIN_TEMPERATURE
tiny = st.one_of(st.floats(0.0, BELOW_32, width=32, allow_subnormal=True),
                 st.floats(0.0, 1e-38, exclude_max=True, allow_subnormal=True))
# Up to float32's largest and beyond (a Python float above it is inf once it is a float32 tensor).
ample = st.floats(rules.MIN_TEMPERATURE, 1e300, allow_nan=False, allow_infinity=False)
# Logits of a real model are bounded; these go well past any (|x| up to 1e4) with a wide spread.
logit_rows = st.lists(st.floats(-1e4, 1e4, width=32), min_size=VOCAB, max_size=VOCAB)


def _gen(seed: int) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed)
    return g


@settings(max_examples=200, deadline=None)
@given(temp=tiny, row=logit_rows, seed=st.integers(0, 2**32))
def test_below_threshold_is_greedy(temp: float, row: list[float], seed: int) -> None:
    logits = torch.tensor([row], dtype=torch.float32)
    p = SamplingParams(temperature=temp, seed=seed)
    assert p.greedy
    assert sample(logits, [p], [_gen(seed)]).item() == logits.argmax(-1).item()


@settings(max_examples=200, deadline=None)
@given(temp=ample, row=logit_rows, seed=st.integers(0, 2**32), top_k=st.integers(-1, VOCAB),
       top_p=st.floats(1e-6, 1.0), min_p=st.floats(0.0, 1.0))
def test_above_threshold_draws_a_kept_token(temp: float, row: list[float], seed: int, top_k: int, top_p: float,
                                            min_p: float) -> None:
    logits = torch.tensor([row], dtype=torch.float32)
    p = SamplingParams(temperature=temp, seed=seed, top_k=top_k, top_p=top_p, min_p=min_p)
    assert rules.sampling_violation(p, VOCAB) is None and not p.greedy
    filtered = apply_filters(logits, [p])
    probs = filtered.softmax(-1)
    assert not torch.isnan(filtered).any() and torch.isfinite(probs).all()
    tok = sample(logits, [p], [_gen(seed)]).item()
    assert 0 <= tok < VOCAB and math.isfinite(filtered[0, tok].item())


def test_the_threshold_itself_samples_and_just_below_is_greedy() -> None:
    assert not SamplingParams(temperature=rules.MIN_TEMPERATURE).greedy
    assert SamplingParams(temperature=math.nextafter(rules.MIN_TEMPERATURE, 0)).greedy
    # The case a client found: six tokens, all id 0, from T = 1e-40 on logits whose argmax is elsewhere.
    logits = torch.zeros(6, VOCAB)
    logits[:, 17] = 5.0
    params = [SamplingParams(temperature=t) for t in (1e-40, 1e-300, 1e-30, 1e-6, 0.0, 9.9e-6)]
    assert sample(logits, params, [_gen(i) for i in range(6)]).tolist() == [17] * 6


def test_non_finite_probabilities_take_the_argmax() -> None:
    """The last guard: a row whose logits are not finite (a model fault) is never drawn from NaN."""
    logits = torch.zeros(2, VOCAB)
    logits[0, 5], logits[1, 9] = float("inf"), 3.0
    out = sample(logits, [SamplingParams(temperature=1.0)] * 2, [_gen(0), _gen(1)])
    assert out[0].item() == 5 and 0 <= out[1].item() < VOCAB


@settings(max_examples=200, deadline=None)
@given(temp=st.one_of(tiny, ample, st.floats(allow_nan=True, allow_infinity=True)), row=logit_rows)
def test_scoring_temperature_admitted_means_finite_rows(temp: float, row: list[float]) -> None:
    """input_logprob_temperature: the rulebook admits exactly the values whose log_softmax(logits / T) is finite
    (refused otherwise, with the field named); admitted ones score as the plain float32 reference does."""
    broken = rules.input_logprob_temperature(temp)
    if broken is not None:
        assert broken.param == "input_logprob_temperature"
        assert not rules.MIN_TEMPERATURE <= temp < math.inf
        return
    logits = torch.tensor([row], dtype=torch.float32)
    temps = torch.tensor([temp], dtype=torch.float32)
    got = score_rows(logits, lambda h: h, torch.tensor([3]), [2], "raw_logprobs", 8, temps=temps)
    want = torch.log_softmax(logits / temps[:, None], -1)
    assert math.isfinite(got.values[0][0]) and got.values[0][0] == want[0, 3].item()
    assert all(math.isfinite(v) for v, _ in got.tops[0])


def test_float32_reference_is_what_the_threshold_protects() -> None:
    """Why refuse, not compute: below the threshold float32 itself has no answer (the client's reference is NaN)."""
    logits = torch.tensor([[1e4, 0.0, -1e4]])
    assert torch.isnan(torch.log_softmax(logits / torch.tensor(1e-40), -1)).any()
    assert torch.isfinite(torch.log_softmax(logits / torch.tensor(rules.MIN_TEMPERATURE), -1)).all()
    assert FLOAT32_MAX / 1e4 > 1 / rules.MIN_TEMPERATURE
