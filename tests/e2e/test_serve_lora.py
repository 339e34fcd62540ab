"""LoRA adapters through the Serve app on 2 workers (real local Ray cluster, HTTP): an adapter from the config and
one loaded at run time (vLLM's route) are each scored within 1e-4 of transformers + PEFT, beside the base model's
rows, by /generate (`adapter`, SGLang's `lora_path`; the OpenAI `model` field:
tests/ingress/test_adapter_routes.py); a repeat of an adapter's prompt
is routed to the replica holding the adapter and its prefix (Serve multiplexing + the prefix router); an adapter
over max_lora_rank is a 400 naming it; an unloaded adapter is refused. A worker with one adapter slot serves requests
for three adapters and the base sent at once: each waits for the slot, none is refused, every token's logprob
exact."""

from __future__ import annotations

import concurrent.futures
from pathlib import Path

import httpx
from ray import serve

from tests.helpers.engine import rand_ids
from tests.helpers.reference import hf_scores
from tests.helpers.serve import app_args, deploy, worker_stats
from tests.helpers.tiny_adapters import build_adapter, peft_scores

ATOL = 1e-4


def _rows(url: str, ids: list[int], **fields: object) -> dict:
    body = {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0, **fields}
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


def _close(rows: list, want: list[float]) -> float:
    return max(abs(v - w) for (v, _), w in zip(rows, want, strict=True))


def test_adapters_served_and_routed(serve_url: str, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    base = tiny_models["llama"]
    a = build_adapter(tmp_path / "a", base, rank=4, seed=11)
    b = build_adapter(tmp_path / "b", base, rank=8, seed=12, targets=["q_proj", "v_proj", "up_proj", "down_proj"])
    big = build_adapter(tmp_path / "big", base, rank=32, seed=13)
    name = "lora"
    deploy(name, f"/{name}", app_args(model=str(base), model_name="tiny", num_workers=2, kv_cache_mb=8,
                                      prefix_aware_routing=True, lora_adapters={"a": str(a)},
                                      open_admin_routes=True))
    url = f"{serve_url}/{name}"
    try:
        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(b)}, timeout=60)
        assert r.status_code == 200 and "added successfully" in r.text, r.text
        models = [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=30).json()["data"]]
        assert models == ["tiny", "a", "b"]

        ids = rand_ids(20, seed=14)
        asks = [{}, {"adapter": "a"}, {"lora_path": "b"}]
        with concurrent.futures.ThreadPoolExecutor(3) as pool:  # base and both adapters at once
            metas = list(pool.map(lambda f: _rows(url, ids, **f), asks))
        assert _close(metas[0]["input_token_logprobs"], hf_scores(base, ids, 0)) <= ATOL
        assert _close(metas[1]["input_token_logprobs"], peft_scores(base, a, ids, 0)) <= ATOL
        assert _close(metas[2]["input_token_logprobs"], peft_scores(base, b, ids, 0)) <= ATOL
        for _ in range(3):  # routed to the replica holding b and this prefix: served from its cache
            again = _rows(url, ids, adapter="b")
            assert again["cached_tokens"] == 16 and _close(again["input_token_logprobs"],
                                                           peft_scores(base, b, ids, 0)) <= ATOL

        r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "big", "lora_path": str(big)}, timeout=60)
        assert r.status_code == 400 and "max_lora_rank" in r.text, r.text
        r = httpx.post(f"{url}/unload_lora_adapter", json={"lora_name": "b"}, timeout=60)
        assert r.status_code == 200 and r.json()["loaded_adapters"] == {"a": str(a)}, r.text
        r = httpx.post(f"{url}/generate", json={"input_ids": ids, "max_tokens": 1, "adapter": "b"}, timeout=60)
        assert r.status_code == 400 and "'b' names no loaded LoRA adapter" in r.text, r.text
    finally:
        serve.delete(name)


def test_more_adapters_than_slots_wait_and_run(serve_url: str, tiny_models: dict[str, Path], tmp_path: Path) -> None:
    base = tiny_models["llama"]
    paths = {n: build_adapter(tmp_path / n, base, rank=4, seed=20 + i) for i, n in enumerate("abc")}
    name = "lora-queue"
    deploy(name, f"/{name}", app_args(model=str(base), model_name="tiny", num_workers=1, kv_cache_mb=8, max_loras=1,
                                      lora_adapters={n: str(p) for n, p in paths.items()}))
    url = f"{serve_url}/{name}"
    try:
        asks = [None, "a", "b", "c", "a", None, "b", "c", "a"]
        prompts = [rand_ids(12 + i, seed=30 + i) for i in range(len(asks))]

        def ask(i: int) -> dict:
            fields = {"adapter": asks[i]} if asks[i] else {}
            r = httpx.post(f"{url}/generate", json={"input_ids": prompts[i], "max_tokens": 24, "ignore_eos": True,
                                                    "temperature": 0.0, "return_logprob": True, **fields},
                           timeout=120)
            assert r.status_code == 200, r.text  # waited for the slot: never a 400 naming max_loras
            return r.json()

        with concurrent.futures.ThreadPoolExecutor(len(asks)) as pool:
            answers = list(pool.map(ask, range(len(asks))))
        for ids, adapter, answer in zip(prompts, asks, answers, strict=True):
            full, start = ids + answer["output_ids"], len(ids) - 1  # the reference scores what was generated
            want = hf_scores(base, full, start) if adapter is None else peft_scores(base, paths[adapter], full, start)
            assert _close(answer["meta_info"]["output_token_logprobs"], want) <= ATOL, adapter
        (stats,) = worker_stats(name, samples=2).values()
        assert stats.requests_finished == len(asks) and stats.waiting == 0 and stats.running == 0
    finally:
        serve.delete(name)
