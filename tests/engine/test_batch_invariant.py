"""Batch-invariant mode end to end in the engine, in the style of vLLM's determinism test
(test_batch_invariance.py): needle requests alone, then amid random other requests that arrive
before, with and after them, under other chunk budgets, cache states (cold, warm, partly evicted) and preemption.
What the needles return must have the same bits every time, compared as served in JSON (a float's repr round-trips
its bits). The same cases in the default mode are the control: there the bits move, so these tests can fail.

SmolLM2's real weights, its first LAYERS layers (tests/helpers/truncated.py): the same embeddings, head and shapes,
so the same kernels see the same row counts, at a fraction of the 30 layers' time; a layer's bits move or hold
alike in any of them."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from checks.invariant_device import BESIDE, run_case, served
from checks.invariant_device import NEEDLES as SHORT_NEEDLES
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from protocol.outputs import RequestOutput, merge_outputs
from protocol.sampling import SamplingParams
from tests.helpers.reference import hf_scores
from tests.helpers.truncated import first_layers

VOCAB = 49152
LAYERS = 4
# Longer than one attention key block (invariant_attention.KEY_BLOCK), so the blocks' online softmax carries over.
NEEDLE = [random.Random(17).randrange(VOCAB) for _ in range(300)]
# Scoring with top-k; greedy generation with its logprobs and top-k; seeded sampling.
NEEDLES = {
    "score": SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=5, top_logprobs_num=5),
    "greedy": SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True, return_logprob=True,
                             top_logprobs_num=3),
    "sampled": SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, seed=3, ignore_eos=True,
                              return_logprob=True, logprob_start_len=290),
}
# Engines the needles meet: the chunk budget, and a KV cache small enough to evict and preempt in the last.
ENGINES = {
    "roomy": dict(max_num_batched_tokens=2048, num_kv_blocks=256),
    "small budget": dict(max_num_batched_tokens=19, num_kv_blocks=256),
    "tight cache": dict(max_num_batched_tokens=256, num_kv_blocks=34),
}


def _other(rng: random.Random) -> tuple[list[int], SamplingParams]:
    """A random request: scoring or generation (greedy or sampled), short or long, often sharing a prefix of the
    needle so its blocks are shared, cached or evicted."""
    n = rng.choice([2, 3, 17, 40, 130, 200])
    ids = [rng.randrange(VOCAB) for _ in range(n)]
    if rng.random() < 0.5:
        ids = NEEDLE[:rng.randrange(8, len(NEEDLE))] + ids
    kind = rng.choice(["score", "greedy", "sampled"])
    if kind == "score":
        return ids, SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=rng.randrange(len(ids) - 1),
                                   top_logprobs_num=rng.choice([0, 2]))
    return ids, SamplingParams(max_tokens=rng.randint(1, 12), temperature=0.0 if kind == "greedy" else 1.0,
                               seed=rng.randrange(1000), ignore_eos=True, return_logprob=rng.random() < 0.5)


def _long_generation(rng: random.Random) -> tuple[list[int], SamplingParams]:
    """Grows its KV while it decodes: several at once outgrow a small cache (preemption)."""
    return [rng.randrange(VOCAB) for _ in range(rng.randint(60, 120))], SamplingParams(
        max_tokens=32, temperature=0.0, ignore_eos=True)


def run_amid(engine: LLMEngine, rng: random.Random, num_others: int, num_long: int = 0) -> dict[str, str]:
    """The needles, `num_others` random requests and `num_long` long generations, arriving in random groups
    between engine steps (the needles among them at a random place); returns what each needle served."""
    arrivals: list[tuple[str, list[int], SamplingParams]] = [
        (f"other-{rng.random()}", *_other(rng)) for _ in range(num_others)]
    arrivals += [(f"long-{rng.random()}", *_long_generation(rng)) for _ in range(num_long)]
    rng.shuffle(arrivals)
    for name, params in NEEDLES.items():
        arrivals.insert(rng.randrange(len(arrivals) + 1), (f"needle-{name}-{rng.random()}", NEEDLE, params))
    rid = {name: next(r for r, _, _ in arrivals if r.startswith(f"needle-{name}-")) for name in NEEDLES}
    streams: dict[str, list[RequestOutput]] = {r: [] for r in rid.values()}
    pending = iter(arrivals)
    while True:
        for request in _take(pending, rng.randint(1, 3)):
            engine.add_request(*request)
        if not engine.has_unfinished():
            break
        for _ in range(rng.randint(0, 2)):
            for out in engine.step():
                if out.request_id in streams:
                    streams[out.request_id].append(out)
    while engine.has_unfinished():
        for out in engine.step():
            if out.request_id in streams:
                streams[out.request_id].append(out)
    engine.check_integrity()
    return {name: served(merge_outputs(streams[r])) for name, r in rid.items()}


def _take(it: Iterator, n: int) -> list:
    return [x for _, x in zip(range(n), it, strict=False)]


def alone(engine: LLMEngine) -> dict[str, str]:
    return {name: served(out) for name, out in
            zip(NEEDLES, engine.generate([NEEDLE] * len(NEEDLES), list(NEEDLES.values())), strict=True)}


def cases(path: Path, invariant: bool) -> Iterator[tuple[str, dict[str, str], LLMEngine]]:
    """Every case, the first being the needles alone on a cold cache: (label, what the needles served, engine)."""
    rng = random.Random(2026)
    for label, cfg in ENGINES.items():
        engine = LLMEngine(EngineConfig(model=str(path), batch_invariant=invariant, **cfg))  # type: ignore[arg-type]
        if label == "roomy":
            yield "alone, cold", alone(engine), engine
            yield "alone, warm", alone(engine), engine
        num_long = 4 if label == "tight cache" else 0
        yield f"{label}: amid others", run_amid(engine, rng, rng.randint(3, 6), num_long), engine
        if label == "tight cache":
            yield "alone after evictions", alone(engine), engine


@pytest.fixture(scope="module")
def model(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return first_layers(smollm2_path, tmp_path_factory.mktemp("smollm2") / f"first-{LAYERS}", LAYERS)


@pytest.fixture(scope="module")
def invariant_runs(model: Path) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
    runs, stats = {}, {}
    for label, served_, engine in cases(model, True):
        runs[label] = served_
        stats = engine.stats()
    return runs, stats


def test_invariant_mode_serves_the_same_bits_in_every_case(invariant_runs) -> None:  # noqa: ANN001
    runs, tight_stats = invariant_runs
    ref = runs["alone, cold"]
    differ = [(label, name) for label, out in runs.items() for name in NEEDLES if out[name] != ref[name]]
    assert differ == []
    # The tight cache did evict cached blocks and preempt running requests: those cases were exercised.
    assert tight_stats.prefix_cache_evictions > 0 and tight_stats.preemptions > 0, tight_stats


def test_invariant_mode_stays_exact(invariant_runs, model: Path) -> None:  # noqa: ANN001
    """Within 1e-4 of a plain transformers forward: the scoring rows, and each greedy token's logprob."""
    ref = {name: json.loads(text) for name, text in invariant_runs[0]["alone, cold"].items()}
    rows, _, _, _, _ = ref["score"]
    assert [t for _, t in rows] == NEEDLE[6:]
    want = hf_scores(model, NEEDLE, 5)
    assert max(abs(v - w) for (v, _), w in zip(rows, want, strict=True)) <= 1e-4
    _, _, tokens, out_rows, _ = ref["greedy"]
    want = hf_scores(model, NEEDLE + tokens, len(NEEDLE) - 1)
    assert max(abs(v - w) for (v, _), w in zip(out_rows, want, strict=True)) <= 1e-4


def test_control_default_mode_moves_bits(model: Path) -> None:
    """The same cases in the default mode: some needle's bits move (stopping at the first case that shows it)."""
    ref, seen = None, []
    for label, served_, _ in cases(model, False):
        seen.append(label)
        if ref is None:
            ref = served_
        elif served_ != ref:
            return
    pytest.fail(f"the default mode served the same bits in every case ({seen}): the test cannot fail")


# The case that showed MKL's row bits moving with the call's row count on an AVX-512 Xeon: short needles whose
# steps have few rows alone (a 24-token prefill, then 1-row decode steps), and 57-255 rows when 60-180-token
# prompts are prefilled beside them, or over 256 rows when several are (checks/invariant_device.py's cases).
SHORT = NEEDLE[:24]


def short_cases(path: Path, invariant: bool) -> Iterator[tuple[str, dict[str, str]]]:
    rng = random.Random(57)
    engine = LLMEngine(EngineConfig(model=str(path), batch_invariant=invariant, max_num_batched_tokens=2048,
                                    num_kv_blocks=256, enable_prefix_cache=False))
    outs = engine.generate([SHORT] * len(SHORT_NEEDLES), list(SHORT_NEEDLES.values()))
    yield "alone", {name: served(out) for name, out in zip(SHORT_NEEDLES, outs, strict=True)}
    for sizes in BESIDE:
        yield f"beside {sizes}", run_case(engine, SHORT, sizes, rng, VOCAB)


def test_short_needles_keep_their_bits_beside_mid_sized_prefills(model: Path) -> None:
    runs = dict(short_cases(model, True))
    ref = runs["alone"]
    assert [(label, name) for label, out in runs.items() for name in SHORT_NEEDLES if out[name] != ref[name]] == []
    default = dict(short_cases(model, False))  # the control: the same cases move the default mode's bits
    assert any(out != default["alone"] for out in default.values())
