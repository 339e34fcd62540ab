"""Shared fixtures: tiny local checkpoints, transformers references, one model load per process."""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.tiny_models import build_tiny_model

LLAMA3_ROPE = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64}

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("tiny")
    return {
        "llama": build_tiny_model(root / "llama", "llama"),
        "llama-tied-llama3": build_tiny_model(root / "llama3", "llama", tie=True, rope_scaling=LLAMA3_ROPE, seed=1),
        "qwen2": build_tiny_model(root / "qwen2", "qwen2", seed=2),
    }


@lru_cache(maxsize=8)
def hf_model(path: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@torch.inference_mode()
def hf_logits(path: str | Path, ids: list[int]) -> torch.Tensor:
    """transformers' single full forward: [L, V] float32 logits."""
    return hf_model(str(path))(torch.tensor([ids])).logits[0].float()


def hf_scores(path: str | Path, ids: list[int], start: int) -> list[float]:
    """log_softmax(logits)[p, ids[p+1]] for p = start .. L-2."""
    lp = torch.log_softmax(hf_logits(path, ids), dim=-1)
    pos = torch.arange(start, len(ids) - 1)
    return lp[pos, torch.tensor(ids[start + 1:])].tolist()


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    """The embedded default model's converted folder (converted once per machine, then cached)."""
    from engine.default_model import ensure_default_model

    return ensure_default_model()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def metrics_port() -> int:
    """The Prometheus port of the session's Ray cluster (`metrics_url` fixture: its /metrics page)."""
    return _free_port()


@pytest.fixture(scope="session")
def metrics_url(serve_url: str, metrics_port: int) -> str:
    return f"http://127.0.0.1:{metrics_port}/metrics"


@pytest.fixture(scope="session")
def ray_cluster(smollm2_path: Path, metrics_port: int):
    """One real local Ray cluster for the whole test session (see shared ray-notes): 8 logical CPUs so an
    ingress and several workers place on 2 cores, 2 fake GPUs for the placement test. Serve (serve_url) and
    Ray Data (tests/test_batch_*.py) share it."""
    import ray

    ray.init(num_cpus=8, num_gpus=2, include_dashboard=False, log_to_driver=False, _metrics_export_port=metrics_port,
             runtime_env={"env_vars": {"RAYSCORE_CACHE_DIR": str(smollm2_path.parent)}})
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def serve_url(ray_cluster):
    """One Serve instance on the session's cluster, on 127.0.0.1 and a free port, access logs off."""
    from ray import serve

    port = _free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port},
                logging_config={"enable_access_log": False})
    yield f"http://127.0.0.1:{port}"
    serve.shutdown()
