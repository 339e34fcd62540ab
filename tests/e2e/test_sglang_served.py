"""SGLang's dialect of /generate on the served app (real Ray, SmolLM2), in the request shapes RL frameworks send,
read back by their own indexing, against a transformers float32 forward: slime's on-policy-distillation teacher
request and rollout request, AReaL's remote SGLang engine request, input rows together with generated tokens,
per-position candidate ids, and the same values as the seed's shape."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import torch

from tests.helpers.reference import hf_logits
from tests.helpers.serve import ids_of, shared_app

ATOL = 1e-4


@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    """The session's shared one-worker app (tests/helpers/serve.py): this module only sends requests to it."""
    return shared_app(serve_url, num_workers=1)


def post(url: str, body: dict) -> dict | list:
    resp = httpx.post(url + "/generate", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    return resp.json()


def logprobs(path: Path, ids: list[int]) -> torch.Tensor:
    return torch.log_softmax(hf_logits(path, ids), -1)


def test_slime_teacher_request(url: str, smollm2_path: Path) -> None:
    """slime/rollout/on_policy_distillation.py's payload; slime reads input_token_logprobs[1:][i][0]."""
    ids = ids_of(48, seed=341)
    payload = {"input_ids": ids, "sampling_params": {"temperature": 0, "max_new_tokens": 0,
                                                     "skip_special_tokens": False},
               "return_logprob": True, "logprob_start_len": 0}
    meta = post(url, payload)["meta_info"]
    teacher = torch.tensor([item[0] for item in meta["input_token_logprobs"][1:]], dtype=torch.float32)
    want = logprobs(smollm2_path, ids)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    assert meta["input_token_logprobs"][0] == [None, ids[0], None]
    assert float((teacher - want).abs().max()) <= ATOL
    assert meta["finish_reason"] == {"type": "length", "length": 0}


def test_input_rows_and_greedy_tokens_in_one_request(url: str, smollm2_path: Path) -> None:
    """max_new_tokens 4 with return_logprob and logprob_start_len 0: input rows and the greedy tokens of
    transformers, with their logprobs; also streamed (cumulative events, [DONE] last), ending as the same answer."""
    ids = ids_of(30, seed=342)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
            "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2, "rid": "gen4",
            "token_ids_logprob": [5, 9]}
    out = post(url, body)
    meta, gen = out["meta_info"], out["output_ids"]
    lp = logprobs(smollm2_path, ids + gen)
    for j, tok in enumerate(gen):
        assert tok == int(lp[len(ids) - 1 + j].argmax()), "greedy tokens equal transformers' argmax"
        assert abs(meta["output_token_logprobs"][j][0] - float(lp[len(ids) - 1 + j, tok])) <= ATOL
    rows = meta["input_token_logprobs"]
    assert [r[1] for r in rows] == ids and rows[0][0] is None
    assert max(abs(r[0] - float(lp[p - 1, ids[p]])) for p, r in enumerate(rows) if p) <= ATOL
    assert meta["input_top_logprobs"][0] is None and len(meta["input_top_logprobs"][5]) == 2
    assert meta["finish_reason"] == {"type": "length", "length": 4} and meta["completion_tokens"] == 4
    assert meta["input_token_ids_logprobs"][0] is None and len(meta["input_token_ids_logprobs"]) == len(ids)
    for j, row in enumerate(meta["output_token_ids_logprobs"]):  # SGLang's: the ids at every generated token
        assert [e[1] for e in row] == [5, 9]
        assert all(abs(e[0] - float(lp[len(ids) - 1 + j, e[1]])) <= ATOL for e in row)
    assert len(meta["output_token_ids_logprobs"]) == 4
    with httpx.stream("POST", url + "/generate", json={**body, "stream": True}, timeout=300) as resp:
        events = [line[6:] for line in resp.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["output_ids"] == gen and last["text"] == out["text"]
    assert len(last["meta_info"]["input_token_logprobs"]) == len(ids)
    diff = max(abs(a[0] - b[0]) for a, b in zip(last["meta_info"]["output_token_logprobs"],
                                                 meta["output_token_logprobs"], strict=True))
    assert diff <= ATOL


def test_per_position_candidate_ids(url: str, smollm2_path: Path) -> None:
    """On-policy distillation: a different candidate list at each scored row, at a scoring temperature, in both
    shapes (SGLang's answer has entry 0 null in front)."""
    ids = ids_of(26, seed=343)
    start = 10
    g = torch.Generator().manual_seed(7)
    cands = [torch.randint(0, 49152, (4,), generator=g).tolist() for _ in range(len(ids) - start - 1)]
    want = torch.log_softmax(hf_logits(smollm2_path, ids) / 0.7, -1)
    common = {"input_ids": ids, "return_logprob": True, "logprob_start_len": start, "token_ids_logprob": cands,
              "input_logprob_temperature": 0.7}
    sgl = post(url, {**common, "sampling_params": {"max_new_tokens": 0}})["meta_info"]["input_token_ids_logprobs"]
    seed = post(url, {**common, "max_tokens": 0})["meta_info"]["input_token_ids_logprobs"]
    assert sgl[0] is None and len(sgl) == len(seed) + 1
    for r, (row_s, row_g) in enumerate(zip(seed, sgl[1:], strict=True)):
        assert [t for _, t in row_s] == cands[r] == [e[1] for e in row_g]
        for (v, t), e in zip(row_s, row_g, strict=True):
            assert abs(v - float(want[start + r, t])) <= ATOL and abs(e[0] - v) <= ATOL


def test_areal_remote_engine_request(url: str, smollm2_path: Path) -> None:
    """areal/engine/sglang_remote.py's agenerate payload, parsed as AReaL parses it."""
    ids = ids_of(20, seed=344)
    payload = {"input_ids": ids.copy(), "image_data": None,
               "sampling_params": {"top_p": 1.0, "top_k": 100_000_000, "max_new_tokens": 5, "temperature": 0.0,
                                   "stop_token_ids": [], "frequency_penalty": 0.0},
               "return_logprob": True, "stream": False}
    meta = post(url, payload)["meta_info"]
    stop_reason = meta["finish_reason"]["type"]
    output_tokens = [x[1] for x in meta["output_token_logprobs"]]
    output_logprobs = [x[0] for x in meta["output_token_logprobs"]]
    assert stop_reason in ("stop", "length") and 1 <= len(output_tokens) <= 5
    lp = logprobs(smollm2_path, ids + output_tokens)
    for j, (tok, v) in enumerate(zip(output_tokens, output_logprobs, strict=True)):
        assert tok == int(lp[len(ids) - 1 + j].argmax()) and abs(v - float(lp[len(ids) - 1 + j, tok])) <= ATOL
    assert meta["input_token_logprobs"] == []


def test_slime_rollout_batch_with_text(url: str) -> None:
    """slime's rollout payload (sglang_rollout.py: text or input_ids, sampling_params from its args, return_logprob)
    as a batch of texts, n = 2: a list of prompts x n answers whose output_token_logprobs line up with output_ids."""
    sp = {"temperature": 0.8, "top_p": 0.95, "top_k": -1, "max_new_tokens": 6, "stop": ["\n\n"],
          "stop_token_ids": [2], "skip_special_tokens": False, "no_stop_trim": True,
          "spaces_between_special_tokens": False, "n": 2, "sampling_seed": 11}
    answers = post(url, {"text": ["The capital of France is", "1 + 1 ="], "sampling_params": sp,
                         "return_logprob": True})
    assert isinstance(answers, list) and len(answers) == 4
    for out in answers:
        rows = out["meta_info"]["output_token_logprobs"]
        assert [r[1] for r in rows] == out["output_ids"] and all(r[0] <= 0 for r in rows)
        assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")
