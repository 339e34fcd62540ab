"""The RL teacher request (input_logprob_temperature, top-k, token_ids_logprob) over HTTP, and its check against
transformers' log_softmax(logits / T)."""

from __future__ import annotations

from pathlib import Path

import torch

from tests.helpers.reference import hf_logits

LABELS = [5, 17, 300]


def teacher(ids: list[int]) -> dict:
    return {"input_ids": ids, "max_tokens": 0, "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": 20, "input_logprob_temperature": 0.7, "token_ids_logprob": LABELS}


def check_teacher(meta: dict, path: Path, ids: list[int], version: str) -> None:
    lp = torch.log_softmax(hf_logits(path, ids) / 0.7, -1)
    pos = torch.arange(len(ids) - 1)
    want = lp[pos, torch.tensor(ids[1:])].tolist()
    assert [t for _, t in meta["input_token_logprobs"]] == ids[1:]
    assert max(abs(v - w) for (v, _), w in zip(meta["input_token_logprobs"], want, strict=True)) <= 1e-4
    for p, (top, labels) in enumerate(zip(meta["input_top_logprobs"], meta["input_token_ids_logprobs"],
                                          strict=True)):
        v, i = torch.topk(lp[p], 20)
        assert [t for _, t in top] == i.tolist()
        assert max(abs(a - b) for (a, _), b in zip(top, v.tolist(), strict=True)) <= 1e-4
        assert max(abs(a - lp[p, t].item()) for a, t in labels) <= 1e-4 and [t for _, t in labels] == LABELS
    assert meta["input_logprob_temperature"] == 0.7 and meta["weight_version"] == version
