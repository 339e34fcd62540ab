"""Classifiers through the Serve app (real local Ray cluster, HTTP): a one-label reward model (Llama) and a
three-label classifier (Qwen2) answer vLLM's /classify and /pooling and SGLang's /classify within 1e-4 of
transformers, cold and warm (from the prefix cache); /generate on a classifier is a 400 naming its routes."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from ray import serve

from ingress.classify.activation import activate
from tests.helpers.engine import rand_ids
from tests.helpers.serve import app_args, deploy
from tests.helpers.tiny_classifiers import LABELS, build_classifier, reference_scores

ATOL = 1e-4


def _close(got: list[float], want: list[float]) -> bool:
    return len(got) == len(want) and max(abs(a - b) for a, b in zip(got, want, strict=True)) <= ATOL


@pytest.mark.parametrize(("family", "num_labels"), [("llama", 1), ("qwen2", 3)])
def test_classifier_served_exactly(serve_url: str, tmp_path: Path, family: str, num_labels: int) -> None:
    path = build_classifier(tmp_path / family, family, num_labels, seed=num_labels)
    name = f"classifier-{family}"
    deploy(name, f"/{name}", app_args(model=str(path), model_name=name, num_workers=1, kv_cache_mb=8))
    url = f"{serve_url}/{name}"
    try:
        prompts = [rand_ids(n, seed=n) for n in (5, 16, 23)]
        raws = [reference_scores(path, ids) for ids in prompts]
        for warm in (False, True):
            r = httpx.post(f"{url}/classify", json={"model": name, "input": prompts}, timeout=120)
            assert r.status_code == 200, r.text
            for item, raw in zip(r.json()["data"], raws, strict=True):
                assert item["num_classes"] == num_labels and _close(item["probs"], activate(raw, None))
                assert item["label"] in LABELS[num_labels].values()
            r = httpx.post(f"{url}/classify", json={"input_ids": prompts}, timeout=120)
            assert r.status_code == 200, r.text
            for answer, raw, ids in zip(r.json(), raws, prompts, strict=True):
                assert _close(answer["embedding"], raw)
                if warm:  # every full block of the prompt comes from the prefix cache (the app's block size: 16)
                    assert answer["meta_info"]["cached_tokens"] == len(ids) // 16 * 16
            r = httpx.post(f"{url}/pooling", json={"input": prompts[1], "use_activation": False}, timeout=120)
            assert r.status_code == 200, r.text
            assert _close(r.json()["data"][0]["data"], raws[1])
        r = httpx.post(f"{url}/generate", json={"input_ids": prompts[0], "max_tokens": 2}, timeout=60)
        assert r.status_code == 400 and "POST /classify" in r.text, r.text
    finally:
        serve.delete(name)
