"""Requests for more LoRA adapters than a worker has slots (max_loras) are queued, not refused: each waits for a
slot, then runs exact against transformers + PEFT; base-model and resident-adapter requests behind it are not held
up; newer requests do not starve it; aborting a waiting one frees nothing it never held, and an adapter whose
files went away while its request waited ends that request with the reason, not the engine
(engine/core/adapter_queue.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from engine.llm_engine import LLMEngine
from engine.loading.lora import LoraError
from protocol.outputs import RequestOutput, merge_outputs
from protocol.sampling import AdapterRef, SamplingParams
from tests.helpers.engine import make_engine, rand_ids
from tests.helpers.reference import hf_scores
from tests.helpers.tiny_adapters import build_adapter, peft_scores

ATOL = 1e-4


@pytest.fixture(scope="module")
def adapters(tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("queued-adapters")
    base = tiny_models["llama"]
    return {"a": build_adapter(root / "a", base, rank=4, seed=11),
            "b": build_adapter(root / "b", base, rank=8, seed=12, targets=["q_proj", "v_proj", "down_proj"]),
            "c": build_adapter(root / "c", base, rank=2, seed=13, targets=["o_proj", "up_proj"])}


def _params(adapter: str | None, max_tokens: int) -> SamplingParams:
    """Scores the whole prompt and generates greedily: every row it returns has a reference."""
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True, return_logprob=True,
                          logprob_start_len=0, adapter=None if adapter is None else AdapterRef(adapter))


def _run(engine: LLMEngine, max_loras: int) -> tuple[dict[str, list[RequestOutput]], list[set[str]]]:
    """Step to the end, checking after each step that no more than max_loras adapters ran in it; returns each
    request's deltas and, per step, the requests that started in it."""
    streams: dict[str, list[RequestOutput]] = {rid: [] for rid in engine.seqs}
    started: list[set[str]] = []
    seen: set[str] = set()
    while engine.has_unfinished():
        live = list(engine.seqs.values())
        outs = engine.step()
        engine.check_integrity()
        started.append({s.request_id for s in live if s.scheduled_time is not None} - seen)
        seen |= started[-1]
        in_step = {s.params.adapter.name for s in engine.scheduler.running if s.params.adapter is not None}
        assert len(in_step) <= max_loras
        for out in outs:
            streams[out.request_id].append(out)
    return streams, started


def _idle(engine: LLMEngine) -> bool:
    """No adapter is held or wanted by any request (every count back to zero)."""
    lora = engine.lora
    assert lora is not None
    return all(v == 0 for v in (*lora.pins.values(), *lora.users.values()))


def _assert_exact(base: Path, adapters: dict[str, Path], ids: list[int], adapter: str | None,
                  out: RequestOutput) -> None:
    """Prompt rows and generated tokens' logprobs both equal the reference forward over prompt + generated."""
    assert out.finish_reason is not None and out.finish_reason.type == "length", out.finish_reason
    full = ids + out.new_token_ids
    want = hf_scores(base, full, 0) if adapter is None else peft_scores(base, adapters[adapter], full, 0)
    assert out.input_token_logprobs is not None and out.output_token_logprobs is not None
    got = [v for v, _ in out.input_token_logprobs] + [v for v, _ in out.output_token_logprobs]
    assert max(abs(g - w) for g, w in zip(got, want, strict=True)) <= ATOL, adapter


@pytest.mark.parametrize("max_loras", [1, 2])
def test_more_adapters_than_slots_all_run_exact(tiny_models: dict[str, Path], adapters: dict[str, Path],
                                                max_loras: int) -> None:
    base = tiny_models["llama"]
    engine = make_engine(base, max_loras=max_loras, enable_prefix_cache=True, max_num_batched_tokens=128,
                         lora_adapters={name: str(path) for name, path in adapters.items()})
    names = ["a", "b", None, "c", "a", None, "b", "c", None, "a"]
    prompts = {f"r{i}": rand_ids(6 + i, seed=40 + i) for i in range(len(names))}
    for (rid, ids), name in zip(prompts.items(), names, strict=True):
        engine.add_request(rid, ids, _params(name, 3 + len(ids) % 3))
    streams, started = _run(engine, max_loras)
    for (rid, ids), name in zip(prompts.items(), names, strict=True):
        _assert_exact(base, adapters, ids, name, merge_outputs(streams[rid]))
    # Base-model requests behind a waiting adapter request start in the first step, with the first adapters'.
    assert {"r0", "r2", "r5", "r8"} <= started[0] and not {"r3", "r7"} & started[0]
    assert _idle(engine)


def test_a_waiting_adapter_is_not_starved(tiny_models: dict[str, Path], adapters: dict[str, Path]) -> None:
    """One slot held by a long generation of `a`: the request for `b` waits; newer requests of `a` (resident, but
    the slot `b` waits for) wait behind it, while a newer base-model request starts at once."""
    base = tiny_models["llama"]
    engine = make_engine(base, max_loras=1, lora_adapters={"a": str(adapters["a"]), "b": str(adapters["b"])})
    order = {"a1": ("a", 8), "b1": ("b", 2), "a2": ("a", 2), "base": (None, 2), "a3": ("a", 1)}
    prompts = {rid: rand_ids(7, seed=60 + i) for i, rid in enumerate(order)}
    for rid, (name, n) in order.items():
        engine.add_request(rid, prompts[rid], _params(name, n))
    streams, started = _run(engine, 1)
    assert [s for s in started if s] == [{"a1", "base"}, {"b1"}, {"a2", "a3"}]
    for rid, (name, _) in order.items():
        _assert_exact(base, adapters, prompts[rid], name, merge_outputs(streams[rid]))


def test_abort_a_waiting_adapter_request(tiny_models: dict[str, Path], adapters: dict[str, Path]) -> None:
    base = tiny_models["llama"]
    engine = make_engine(base, max_loras=1, lora_adapters={"a": str(adapters["a"]), "b": str(adapters["b"])})
    assert engine.lora is not None
    ids = rand_ids(9, seed=70)
    engine.add_request("a1", ids, _params("a", 6))
    engine.add_request("b1", ids, _params("b", 2))
    first = engine.step()
    assert engine.seqs["b1"].scheduled_time is None and engine.seqs["b1"].lora_slot is None  # waiting
    with pytest.raises(LoraError, match="in use by 1 request"):  # a queued request keeps its adapter loaded
        engine.lora.unregister("b")
    out = engine.abort_request("b1")
    assert out is not None and out.finished and out.finish_reason is not None and out.finish_reason.type == "abort"
    assert engine.lora.users["b"] == 0 and engine.lora.pins["a"] == 1
    engine.lora.unregister("b")  # nothing uses it now
    streams, _ = _run(engine, 1)
    _assert_exact(base, adapters, ids, "a", merge_outputs(first + streams["a1"]))
    assert _idle(engine) and engine.lora.names() == ["a"]


def test_adapter_gone_while_waiting_ends_that_request(tiny_models: dict[str, Path], adapters: dict[str, Path],
                                                      tmp_path: Path) -> None:
    """The adapter is read again when it is loaded into a slot: files removed meanwhile end its request with a
    400-coded error naming the adapter; the engine and the other requests go on."""
    base = tiny_models["llama"]
    gone = shutil.copytree(adapters["b"], tmp_path / "b")
    engine = make_engine(base, max_loras=1, lora_adapters={"a": str(adapters["a"]), "b": str(gone)})
    ids = rand_ids(8, seed=80)
    engine.add_request("a1", ids, _params("a", 3))
    engine.add_request("b1", ids, _params("b", 2))
    engine.add_request("n1", ids, _params(None, 2))
    shutil.rmtree(gone)
    streams, _ = _run(engine, 1)
    refused = merge_outputs(streams["b1"])
    assert refused.finish_reason is not None and refused.finish_reason.type == "error"
    assert refused.finish_reason.code == 400 and "'b'" in (refused.finish_reason.message or "")
    _assert_exact(base, adapters, ids, "a", merge_outputs(streams["a1"]))
    _assert_exact(base, adapters, ids, None, merge_outputs(streams["n1"]))
