"""Model families through the Serve app (real local Ray cluster, HTTP): a windowed, soft-capped family (Gemma 2),
an MoE family (Qwen3-MoE), DeepSeek-V3 (latent attention, group-limited experts), gpt-oss (sinks, windows, YaRN,
biased experts) and the hybrid linear-attention families (Qwen3.5 dense and MoE), each from a local checkpoint
folder. Scoring rows of a prompt five windows long (top-k included) are within 1e-4 of transformers' float32 forward,
and greedy generation equals its generate (for the hybrids: the argmax of its uncached forwards, since transformers'
own cached generation is not what the engine is held to)."""

from __future__ import annotations

import httpx
import pytest
import torch
from ray import serve

from tests.helpers.engine import rand_ids
from tests.helpers.families import ATOL, family_path, hf_generate
from tests.helpers.reference import hf_logits, hf_model, hf_scores
from tests.helpers.serve import app_args, deploy, score_body
from tests.helpers.tiny_deepseek_v3 import VARIANTS, dsv3_path
from tests.helpers.tiny_families import WINDOW
from tests.helpers.tiny_gpt_oss import gpt_oss_path
from tests.helpers.tiny_qwen3_5 import QWEN3_5_FAMILIES, qwen3_5_path


def _greedy_by_full_forwards(path: object, ids: list[int], n: int) -> list[int]:
    text = list(ids)
    for _ in range(n):
        text.append(int(hf_logits(path, text)[-1].argmax()))  # type: ignore[arg-type]
    return text[len(ids):]


@pytest.mark.parametrize("family", ["gemma2", "qwen3-moe", "dsv3", "gpt-oss", *QWEN3_5_FAMILIES])
def test_family_served_exactly(serve_url: str, family: str) -> None:
    # dsv3, gpt-oss and Qwen3.5: their own tiny checkpoints (tests/helpers/tiny_deepseek_v3.py, tiny_gpt_oss.py,
    # tiny_qwen3_5.py).
    hybrid = family in QWEN3_5_FAMILIES
    if hybrid:
        path = qwen3_5_path(family)
    elif family in VARIANTS:
        path = dsv3_path(family)
    else:
        path = gpt_oss_path() if family == "gpt-oss" else family_path(family)
    name = f"family-{family}"
    deploy(name, f"/{name}", app_args(model=str(path), num_workers=1, kv_cache_mb=8))
    url = f"{serve_url}/{name}/generate"
    try:
        ids = rand_ids(5 * WINDOW + 2, seed=21)
        r = httpx.post(url, json=score_body(ids, 2, k=3), timeout=120)
        assert r.status_code == 200, r.text
        meta = r.json()["meta_info"]
        rows = meta["input_token_logprobs"]
        assert [t for _, t in rows] == ids[3:]
        assert max(abs(v - e) for (v, _), e in zip(rows, hf_scores(path, ids, 2), strict=True)) <= ATOL
        lp = torch.log_softmax(hf_logits(path, ids), -1)
        for row, pos in zip(meta["input_top_logprobs"], range(2, len(ids) - 1), strict=True):
            assert [t for _, t in row] == torch.topk(lp[pos], 3).indices.tolist()

        prompt = rand_ids(2 * WINDOW, seed=22)
        body = {"input_ids": prompt, "max_tokens": 10, "temperature": 0.0, "ignore_eos": True}
        r = httpx.post(url, json=body, timeout=120)
        assert r.status_code == 200, r.text
        if hybrid:
            assert r.json()["output_ids"] == _greedy_by_full_forwards(path, prompt, 10)
        else:
            with torch.inference_mode():
                want = hf_generate(hf_model(str(path)), prompt, 10).sequences
            assert r.json()["output_ids"] == want[0, len(prompt):].tolist()
    finally:
        serve.delete(name)
