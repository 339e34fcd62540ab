"""LoRA adapters in the engine: base rows and the rows of two PEFT adapters in ONE step, each equal to transformers
(+ PEFT with its adapter) within 1e-4; the prefix cache never gives one adapter's blocks to another or to the base;
adapters evicted and reloaded under max_loras stay exact; refusals name the module or the limit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from engine.layers import lora as lora_layer
from engine.llm_engine import RequestError
from engine.loading.lora import LoraError
from protocol.sampling import AdapterRef, SamplingParams
from tests.helpers.engine import make_engine, rand_ids, scoring
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_adapters import build_adapter, peft_scores

ATOL = 1e-4


@pytest.fixture(scope="module")
def adapters(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("adapters")
    base = tiny_models["llama"]
    return {"a": build_adapter(root / "a", base, rank=4, seed=1),
            "b": build_adapter(root / "b", base, rank=8, seed=2, targets=["q_proj", "v_proj", "down_proj"],
                               rslora=True),
            "big": build_adapter(root / "big", base, rank=32, seed=3)}


def _with(name: str | None, start: int = 0) -> SamplingParams:
    p = scoring(start)
    p.adapter = None if name is None else AdapterRef(name)
    return p


def _close(got: list, want: list[float]) -> float:
    return max(abs(v - w) for (v, _), w in zip(got, want, strict=True))


@pytest.mark.parametrize("grouped", [False, True], ids=["per-segment", "grouped"])
def test_base_and_two_adapters_in_one_step(tiny_models: dict[str, Path], adapters: dict[str, Path], grouped: bool,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    # Both forms of the adapter arithmetic (engine/layers/lora.py), forced whatever the step's segment lengths.
    monkeypatch.setattr(lora_layer, "GROUPED_ROWS_PER_THREAD", 10**9 if grouped else 0)
    base = tiny_models["llama"]
    engine = make_engine(base, lora_adapters={"a": str(adapters["a"]), "b": str(adapters["b"])})
    prompts = [rand_ids(n, seed=n) for n in (9, 13, 7, 11, 6)]
    names = [None, "a", "b", "a", None]
    steps = engine.counters.steps
    got = engine.generate(prompts, [_with(n) for n in names], check=True)
    assert engine.counters.steps == steps + 1  # every request, whatever its adapter, in the same step
    for ids, name, out in zip(prompts, names, got, strict=True):
        want = hf_scores(base, ids, 0) if name is None else peft_scores(base, adapters[name], ids, 0)
        assert _close(out.input_token_logprobs, want) <= ATOL, name
    # The adapter moves the values (the test would catch an adapter left unapplied).
    assert _close(got[1].input_token_logprobs, hf_scores(base, prompts[1], 0)) > 1e-2


def test_generation_with_an_adapter_chunked(tiny_models: dict[str, Path], adapters: dict[str, Path]) -> None:
    base = tiny_models["llama"]
    engine = make_engine(base, lora_adapters={"a": str(adapters["a"])}, max_num_batched_tokens=5)
    ids = rand_ids(17, seed=5)
    got = engine.generate([ids, ids], [_with("a", 3), _with(None, 3)], check=True)
    assert _close(got[0].input_token_logprobs, peft_scores(base, adapters["a"], ids, 3)) <= ATOL
    assert _close(got[1].input_token_logprobs, hf_scores(base, ids, 3)) <= ATOL


def test_prefix_cache_keyed_by_adapter(tiny_models: dict[str, Path], adapters: dict[str, Path]) -> None:
    base = tiny_models["llama"]
    engine = make_engine(base, enable_prefix_cache=True, lora_adapters={"a": str(adapters["a"]),
                                                                        "b": str(adapters["b"])})
    ids = rand_ids(16, seed=7)
    first = engine.generate([ids], _with("a"), check=True)[0]
    for name in (None, "b"):  # the same tokens, another adapter or none: nothing cached for them
        out = engine.generate([ids], _with(name), check=True)[0]
        assert out.cached_tokens == 0
        want = hf_scores(base, ids, 0) if name is None else peft_scores(base, adapters[name], ids, 0)
        assert _close(out.input_token_logprobs, want) <= ATOL
    warm = engine.generate([ids], _with("a"), check=True)[0]
    assert warm.cached_tokens == 16 and _close(warm.input_token_logprobs, [v for v, _ in first.input_token_logprobs]) \
        < 1e-5


def test_lru_eviction_and_reload(tiny_models: dict[str, Path], adapters: dict[str, Path]) -> None:
    base = tiny_models["llama"]
    engine = make_engine(base, max_loras=1, enable_prefix_cache=True,
                         lora_adapters={"a": str(adapters["a"]), "b": str(adapters["b"])})
    ids = rand_ids(12, seed=8)
    for name in ("a", "b", "a"):
        out = engine.generate([ids], _with(name), check=True)[0]
        assert _close(out.input_token_logprobs, peft_scores(base, adapters[name], ids, 0)) <= ATOL
        assert out.cached_tokens == 0  # each reload has a new cache salt
    # More adapters at once than slots: the others wait for one (test_lora_queue.py).


def test_runtime_load_and_refusals(tiny_models: dict[str, Path], adapters: dict[str, Path], tmp_path: Path) -> None:
    base = tiny_models["llama"]
    engine = make_engine(base)
    assert engine.lora is not None
    with pytest.raises(RequestError, match="'a' is not loaded"):
        engine.add_request("r", [3, 4, 5], _with("a"))
    engine.lora.register("a", str(adapters["a"]))
    ids = rand_ids(10, seed=9)
    out = engine.generate([ids], _with("a"), check=True)[0]
    assert _close(out.input_token_logprobs, peft_scores(base, adapters["a"], ids, 0)) <= ATOL
    with pytest.raises(LoraError, match="rank 32, above the server's max_lora_rank 16"):
        engine.lora.register("big", str(adapters["big"]))
    emb = tmp_path / "emb"
    emb.mkdir()
    cfg = json.loads((adapters["a"] / "adapter_config.json").read_text())
    cfg["target_modules"] = ["q_proj", "embed_tokens"]
    (emb / "adapter_config.json").write_text(json.dumps(cfg))
    with pytest.raises(LoraError, match="'embed_tokens'"):
        engine.lora.register("emb", str(emb))
    engine.lora.unregister("a")
    assert engine.lora.names() == []


FAMILY_TARGETS = {
    "qwen3": None, "mistral": None, "gemma2": None, "gemma3": None,
    "phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"],  # fused in Phi-3's checkpoint: PEFT's names
    "qwen3-moe": ["q_proj", "k_proj", "v_proj", "o_proj"],  # attention of an MoE model
}


@pytest.mark.parametrize("family", list(FAMILY_TARGETS))
def test_every_family_with_an_adapter(family: str, tmp_path: Path) -> None:
    from tests.helpers.families import family_path

    base = family_path(family)
    adapter = build_adapter(tmp_path / "ad", base, rank=4, seed=3, targets=FAMILY_TARGETS[family])
    engine = make_engine(base, lora_adapters={"ad": str(adapter)})
    ids = rand_ids(15, seed=6)
    got = engine.generate([ids, ids], [_with("ad"), _with(None)], check=True)
    assert _close(got[0].input_token_logprobs, peft_scores(base, adapter, ids, 0)) <= ATOL
    assert _close(got[1].input_token_logprobs, hf_scores(base, ids, 0)) <= ATOL


def test_a_folder_rewritten_in_place_is_read_again(tiny_models: dict[str, Path], tmp_path: Path) -> None:
    """An adapter retrained into the same folder (then unloaded and loaded again under its name, as an RL loop
    does): the next request that carries the folder, with no other request of the adapter live, is scored with the
    new weights, not the resident old ones, and no block cached under the old weights is hit."""
    base = tiny_models["llama"]
    folder = tmp_path / "policy"
    build_adapter(folder, base, rank=4, seed=11)
    engine = make_engine(base, enable_prefix_cache=True)
    ids = rand_ids(12, seed=12)

    def served() -> object:
        p = _with("policy")
        p.adapter = AdapterRef("policy", str(folder))
        return engine.generate([ids], p, check=True)[0]

    assert _close(served().input_token_logprobs, peft_scores(base, folder, ids, 0)) <= ATOL
    build_adapter(folder, base, rank=4, seed=12)  # new weights, same folder and name
    reference = shutil.copytree(folder, tmp_path / "retrained")  # peft_scores keeps a model per folder
    out = served()
    assert out.cached_tokens == 0
    assert _close(out.input_token_logprobs, peft_scores(base, reference, ids, 0)) <= ATOL
    assert served().cached_tokens > 0  # unchanged since: resident, and its own blocks are hit
