"""The peer bench's loads (bench/serving/peer_load.py) without a server: the load syntax and its refusals, and each
phase's prompts its own."""

from __future__ import annotations

import pytest

from bench.serving import peer_load
from bench.serving.peer_load import Load


def _window(rng, n: int) -> list[int]:  # noqa: ANN001  # PromptSource.window's shape over a fixed stream
    start = rng.randrange(0, 10_000)
    return [(start + i) % 997 + 3 for i in range(n)]


def test_loads_parse_in_order() -> None:
    assert peer_load.parse_loads("32x512@8, 96x48@16") == [Load(32, 512, 8), Load(96, 48, 16)]
    assert Load(96, 48, 16).name == "96 x 48 tokens, 16 clients"


@pytest.mark.parametrize("text", ["32x512", "32x512@0", "ax48@16", "4x1@2"])
def test_a_load_not_of_the_form_is_refused_by_name(text: str) -> None:
    with pytest.raises(ValueError, match="--loads"):
        peer_load.parse_loads(text)


def test_each_phase_has_prompts_of_its_own() -> None:
    load = Load(6, 12, 2)
    warm, timed = peer_load.prompt_sets(_window, load, seed=1)
    assert len(warm) == 2 and len(timed) == 6 and all(len(p) == 12 for p in warm + timed)
    _, other = peer_load.prompt_sets(_window, load, seed=2)
    assert not {tuple(p) for p in timed} & {tuple(p) for p in other}
    assert peer_load.prompt_sets(_window, load, seed=1)[1] == timed  # the same seed, the same set


def test_the_table_gives_medians_and_ratios_to_vllm_and_generate() -> None:
    load = Load(4, 8, 2)
    results = {load.name: {
        "vLLM": [peer_load.Phase(100.0, 1.0, {"server": 5.0})],
        "/generate": [peer_load.Phase(v, 1.0, {"worker": w}) for v, w in ((90.0, 4.0), (110.0, 6.0), (200.0, 9.0))],
        "token": [peer_load.Phase(99.0, 1.0, {"worker": 3.0})]}}
    lines = peer_load.summary(results, [load], "vLLM", "/generate")
    assert lines[3] == f"| {load.name} | /generate | 110 (90, 110, 200) | 1.10 | 1.00 | worker 6.0 |"
    assert lines[4] == f"| {load.name} | token | 99 | 0.99 | 0.90 | worker 3.0 |"
