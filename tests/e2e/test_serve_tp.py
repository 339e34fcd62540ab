"""Tensor-parallel workers on the real local cluster: each replica reserves one bundle per rank (placement group,
STRICT_PACK), runs rank 0 itself and N - 1 rank actors; rows equal transformers' within 1e-4, with LoRA adapters
(from the config and loaded at run time) those of transformers + PEFT, and for mixture-of-experts models (their
experts split over the ranks: Qwen3-MoE at TP 2, each MoE family (Qwen3.5-MoE, Qwen3-MoE, gpt-oss, DeepSeek-V3)
at TP 2 x PP 2); the ranks die with their replica; a killed rank takes the replica down and Serve replaces it."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import ray
import torch
import yaml
from ray import serve

from tests.helpers.engine import rand_ids
from tests.helpers.families import family_path
from tests.helpers.reference import hf_logits, hf_model, hf_scores
from tests.helpers.serve import deploy, deploy_config, ids_of, score_body
from tests.helpers.tiny_adapters import build_adapter, peft_scores
from tests.helpers.tiny_deepseek_v3 import dsv3_path
from tests.helpers.tiny_gpt_oss import gpt_oss_path
from tests.helpers.tiny_qwen3_5 import qwen3_5_path
from workers.ranks import RANK_PREFIX

ATOL = 1e-4
FAST_HEALTH = {"name": "EngineWorker", "health_check_period_s": 1}  # Serve's own option, in the config


def _tp_args(**overrides: object) -> dict:
    args = yaml.safe_load(open("configs/tp.yaml"))["applications"][0]["args"]
    args.update({"kv_cache_mb": 32, "max_num_batched_tokens": 256, "worker_num_cpus": 0.5, "ingress_num_cpus": 0.1,
                 **overrides})
    return args


def _alive_ranks() -> list[dict]:
    """Named rank actors that are alive (Ray drops a dead actor's name)."""
    return [a for a in ray.util.list_named_actors(all_namespaces=True) if a["name"].startswith(RANK_PREFIX)]


def _wait(cond, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


def _greedy(url: str, ids: list[int], n: int) -> dict:
    body = {"input_ids": ids, "max_tokens": n, "temperature": 0, "ignore_eos": True, "return_logprob": True}
    r = httpx.post(url + "/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def _check_greedy(path, ids: list[int], answer: dict, n: int) -> None:
    with torch.inference_mode():
        g = hf_model(str(path)).generate(torch.tensor([ids]), max_new_tokens=n, min_new_tokens=n, do_sample=False,
                                         output_logits=True, return_dict_in_generate=True)
    rows = answer["meta_info"]["output_token_logprobs"]
    assert [t for _, t in rows] == g.sequences[0, len(ids):].tolist()
    for (v, t), step in zip(rows, g.logits, strict=True):
        assert abs(v - torch.log_softmax(step[0].float(), -1)[t].item()) <= ATOL


def test_three_ranks_serve_smollm2_exactly_and_leave_with_the_app(serve_url: str, smollm2_path) -> None:
    app, url = "tp3", serve_url + "/tp3"
    deploy(app, "/tp3", _tp_args())
    try:
        assert len(_alive_ranks()) == 2  # ranks 1 and 2; rank 0 is the replica
        pgs = [p for p in ray.util.placement_group_table().values()
               if p["state"] == "CREATED" and len(p["bundles"]) == 3]
        assert [p["strategy"] for p in pgs] == ["STRICT_PACK"]
        ids = ids_of(40, 11)
        rows = httpx.post(url + "/generate", json=score_body(ids, 3, k=2), timeout=120).json()["meta_info"]
        expected = hf_scores(smollm2_path, ids, 3)
        assert max(abs(v - e) for (v, _), e in zip(rows["input_token_logprobs"], expected, strict=True)) <= ATOL
        # The same prompt again: its rows come from rank 0's hidden-state store (the vocab-parallel shortcut).
        warm = httpx.post(url + "/generate", json=score_body(ids, 3), timeout=120).json()["meta_info"]
        assert warm["cached_tokens"] > 0
        assert max(abs(v - e) for (v, _), e in zip(warm["input_token_logprobs"], expected, strict=True)) <= ATOL
        _check_greedy(smollm2_path, ids[:12], _greedy(url, ids[:12], 6), 6)
    finally:
        serve.delete(app)
    _wait(lambda: not _alive_ranks(), 30, "rank actors outlived their replica")


def test_two_ranks_serve_qwen3_moe_exactly(serve_url: str) -> None:
    """Qwen3-MoE (sparse layers 0 and 2, a dense layer 1) over 2 ranks, every expert split by width: scored rows
    (top-k) within 1e-4 of transformers, greedy tokens equal (and their logprobs within 1e-4)."""
    path = family_path("qwen3-moe")
    app, url = "tpmoe", serve_url + "/tpmoe"
    deploy(app, "/tpmoe", _tp_args(model=str(path), tensor_parallel_size=2))
    try:
        ids = rand_ids(30, seed=31)
        r = httpx.post(url + "/generate", json=score_body(ids, 2, k=3), timeout=120)
        assert r.status_code == 200, r.text
        rows = r.json()["meta_info"]["input_token_logprobs"]
        assert max(abs(v - e) for (v, _), e in zip(rows, hf_scores(path, ids, 2), strict=True)) <= ATOL
        _check_greedy(path, ids[:10], _greedy(url, ids[:10], 6), 6)
    finally:
        serve.delete(app)
    _wait(lambda: not _alive_ranks(), 30, "rank actors outlived their replica")


def _moe_path(family: str) -> Path:
    if family == "qwen3_5-moe":
        return qwen3_5_path(family)
    if family == "gpt-oss":
        return gpt_oss_path()
    return dsv3_path(family) if family == "dsv3" else family_path(family)


@pytest.mark.parametrize("family", ["qwen3_5-moe", "qwen3-moe", "gpt-oss", "dsv3"])
def test_tp2_pp2_serve_each_moe_family_exactly(serve_url: str, family: str) -> None:
    """Each MoE family over 2 stages of 2 ranks on this node (experts split by width; gpt-oss's sinks and windows,
    DeepSeek-V3's latent heads, Qwen3.5-MoE's Gated DeltaNet and gated attention heads split within a stage): scored
    rows (top-k) within 1e-4 of transformers' uncached forward, the same prompt again from the prefix cache (32
    tokens; for the hybrid every stage's ranks resume their linear layers from their share of the snapshot), greedy
    tokens the argmax of full forwards (transformers' cached Qwen3.5 generate is not the reference: #46190)."""
    path = _moe_path(family)
    app = "tppp-" + family.replace("_", "-")
    url = f"{serve_url}/{app}"
    hybrid = {"hybrid_state_interval": 16} if family == "qwen3_5-moe" else {}
    deploy(app, f"/{app}", _tp_args(model=str(path), tensor_parallel_size=2, pipeline_parallel_size=2,
                                    block_size=16, **hybrid))
    try:
        ids = rand_ids(40, seed=41)
        expected = hf_scores(path, ids, 2)
        for cached in (False, True):
            r = httpx.post(url + "/generate", json=score_body(ids, 2, k=3), timeout=120)
            assert r.status_code == 200, r.text
            rows = r.json()["meta_info"]
            assert (rows["cached_tokens"] == 32) == cached  # two blocks of 16 (the hybrid: its snapshots) resumed
            assert max(abs(v - e) for (v, _), e in zip(rows["input_token_logprobs"], expected, strict=True)) <= ATOL
        prompt = ids[:10]
        out = _greedy(url, prompt, 5)["meta_info"]["output_token_logprobs"]
        lp = torch.log_softmax(hf_logits(path, prompt + [t for _, t in out]), dim=-1)
        for j, (v, t) in enumerate(out):
            assert t == int(lp[len(prompt) - 1 + j].argmax()) and abs(v - lp[len(prompt) - 1 + j, t].item()) <= ATOL
        assert len(_alive_ranks()) == 3  # ranks 1-3; rank 0 is the replica
    finally:
        serve.delete(app)
    _wait(lambda: not _alive_ranks(), 30, "rank actors outlived their replica")


@dataclass
class TwoRanks:
    path: Path  # the tiny Llama
    adapter_a: Path  # from the config's lora_adapters
    app: str
    url: str


@pytest.fixture(scope="module")
def tp2(serve_url: str, tiny_models, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TwoRanks]:
    """One app of 2-rank replicas on the tiny Llama for the tests below (each replica starts a rank actor and loads
    the model twice): fake GPUs, two replicas at half a GPU per rank take the session's 2 GPUs, a third waits;
    adapter `a` from the config. The adapters' test runs on it first, then the replacement test kills its ranks."""
    path = tiny_models["llama"]
    a = build_adapter(tmp_path_factory.mktemp("tp-adapters") / "a", path, rank=4, seed=21)
    app = "tp2"
    # Not waiting for RUNNING: the third replica never places.
    # From a config; Serve checks the workers' health every second (the app's 5 s is when the replacement test's
    # killed replica is seen dead at the latest).
    deploy_config(app, "/tp2", _app_args(path, num_workers=3, lora_adapters={"a": str(a)}), [FAST_HEALTH])
    try:
        # As long as wait_ready gives a deploy: four model loads (two replicas, two ranks each) on a busy machine.
        _wait(lambda: len(_alive_ranks()) == 2 and _running(app) == 2, 240, "two replicas of two ranks")
        yield TwoRanks(path, a, app, serve_url + "/tp2")
    finally:
        serve.delete(app)
    _wait(lambda: not _alive_ranks(), 30, "rank actors outlived their replica")


def test_adapters_over_two_ranks_from_the_config_and_loaded_at_run_time(tp2: TwoRanks, tmp_path: Path) -> None:
    """Every rank holds its share of each adapter: one from lora_adapters, one loaded through vLLM's route after the
    ranks started (rank 0 of each replica tells its other rank), scored beside the base model's rows."""
    base, url = tp2.path, tp2.url
    b = build_adapter(tmp_path / "b", base, rank=8, seed=22, targets=["q_proj", "v_proj", "down_proj"])
    r = httpx.post(f"{url}/v1/load_lora_adapter", json={"lora_name": "b", "lora_path": str(b)}, timeout=60)
    assert r.status_code == 200 and "added successfully" in r.text, r.text
    ids = rand_ids(20, seed=23)
    asks = [{}, {"adapter": "a"}, {"adapter": "b"}]
    with concurrent.futures.ThreadPoolExecutor(3) as pool:  # base and both adapters at once
        answers = list(pool.map(lambda f: httpx.post(url + "/generate", json={**score_body(ids, 0), **f},
                                                     timeout=120), asks))
    wants = [hf_scores(base, ids, 0), peft_scores(base, tp2.adapter_a, ids, 0), peft_scores(base, b, ids, 0)]
    for answer, want in zip(answers, wants, strict=True):
        assert answer.status_code == 200, answer.text
        rows = answer.json()["meta_info"]["input_token_logprobs"]
        assert max(abs(v - w) for (v, _), w in zip(rows, want, strict=True)) <= ATOL


def test_replicas_reserve_a_bundle_per_rank_and_a_killed_rank_replaces_the_replica(tp2: TwoRanks) -> None:
    """Fake GPUs: two replicas of 2 ranks at half a GPU per rank take the session's 2 GPUs; a third waits (its
    placement group pending, no GPU left); both serve exactly. A scale-down to one replica takes the removed
    replicas' ranks with them. Then the one replica's rank is killed during a long generation: the stream ends with
    an error, Serve replaces the replica (a new rank), and the app serves again."""
    path, app, url = tp2.path, tp2.app, tp2.url
    t0 = time.monotonic()
    # The third stays pending: no half-GPU bundle is left (its placement group waits, polled rather than slept on).
    _wait(lambda: any(p["state"] == "PENDING" and len(p["bundles"]) == 2
                      for p in ray.util.placement_group_table().values()), 30, "no pending third replica")
    assert _running(app) == 2 and len(_alive_ranks()) == 2
    assert ray.available_resources().get("GPU", 0) == 0
    ids = [5, 17, 200, 33, 41, 9, 90, 2, 300, 11]
    r = httpx.post(url + "/generate", json=score_body(ids, 0, k=3), timeout=60)
    assert r.status_code == 200, r.text
    expected = hf_scores(path, ids, 0)
    rows = r.json()["meta_info"]["input_token_logprobs"]
    assert max(abs(v - e) for (v, _), e in zip(rows, expected, strict=True)) <= ATOL
    _check_greedy(path, ids, _greedy(url, ids, 8), 8)
    print(f"\nserved and checked at {time.monotonic() - t0:.1f} s")

    # Scale-down to one replica: the removed replicas' ranks go with them (and the pending third with its group).
    # The same args with num_replicas 1 in the config: Serve's lightweight update, the kept replica not restarted.
    deploy_config(app, "/tp2", _app_args(path, num_workers=3, lora_adapters={"a": str(tp2.adapter_a)}),
                  [{**FAST_HEALTH, "num_replicas": 1}])
    _wait(lambda: len(_alive_ranks()) == 1 and _only_running(app) == 1, 60, "ranks outlived a scale-down")
    print(f"scaled down at {time.monotonic() - t0:.1f} s")

    # Kill the one replica's rank during a long generation: the replica is replaced (one replacement to wait for:
    # with two replicas the stream's replica is not known, and both had to be killed and replaced).
    events: list[str] = []
    done = threading.Event()

    def stream() -> None:
        body = {"input_ids": ids, "max_tokens": 400, "ignore_eos": True, "stream": True, "temperature": 0}
        with httpx.stream("POST", url + "/generate", json=body, timeout=90) as resp:
            events.extend(line[6:] for line in resp.iter_lines() if line.startswith("data: "))
        done.set()

    before = {a["name"] for a in _alive_ranks()}
    threading.Thread(target=stream, daemon=True).start()
    time.sleep(1.0)
    victims = _alive_ranks()
    assert len(victims) == 1, victims
    for victim in victims:  # rank 1 of the one replica, which streams
        ray.kill(ray.get_actor(victim["name"], namespace=victim["namespace"]))
    assert done.wait(60), "the in-flight request hung after a rank died"
    print(f"rank killed, the stream ended at {time.monotonic() - t0:.1f} s")
    assert events[-1] == "[DONE]" and len(events) >= 3
    # The step in flight failed on rank 0 (its peer's connection broke): the stream ends with an error.
    assert json.loads(events[-2])["meta_info"]["finish_reason"]["type"] == "error", events[-2]
    # Wait until the replica is replaced (a new rank), then the app serves again.
    _wait(lambda: len({a["name"] for a in _alive_ranks()} - before) >= 1 and _running(app) == 1, 180,
          "no replacement rank")
    print(f"the replica replaced at {time.monotonic() - t0:.1f} s")
    r = httpx.post(url + "/generate", json=score_body(ids, 0), timeout=120)
    assert r.status_code == 200, r.text


def _app_args(path, **overrides: object) -> dict:
    return _tp_args(model=str(path), tensor_parallel_size=2, worker_num_gpus=0.5, worker_num_cpus=0.25,
                    max_num_batched_tokens=64, worker_graceful_shutdown_timeout_s=2, open_admin_routes=True,
                    **overrides)


def _only_running(app: str) -> int:
    """The app's running worker replicas once it is RUNNING with no replica starting or stopping, else 0."""
    status = serve.status().applications.get(app)
    if status is None or status.status != "RUNNING":
        return 0
    states = {k: v for k, v in status.deployments["EngineWorker"].replica_states.items() if v}
    return states.get("RUNNING", 0) if len(states) == 1 else 0


def _running(app: str) -> int:
    status = serve.status().applications.get(app)
    if status is None:
        return 0
    dep = status.deployments.get("EngineWorker")
    return dep.replica_states.get("RUNNING", 0) if dep is not None else 0
