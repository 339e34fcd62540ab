"""Field-by-field comparison of two answers of vLLM's /inference/v1/generate (rayscore's and vLLM's own): the
structure (every key, in order), ids and decoded_token equal; ranks equal up to ties; values within a tolerance
(each side is within 1e-4 of transformers, so 2e-4 between them). Pure functions: bench/serving/peer_vllm.py feeds
them the two servers' answers.

What may differ by design, and is compared by shape only: request_id (a random id when the body names none),
created, model (each server's name for the folder), the sampled token ids (temperature 1 draws differently), and the
finish_reason / stop_reason of a choice whose sampled tokens differ (one side may draw the end-of-text token).
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass, field
from typing import Any

import numpy as np

TOL = 2e-4
SHAPE_ONLY = frozenset({"request_id", "created", "model"})
# A choice's fields that follow its sampled token: compared only when both sides drew the same one.
SAMPLED = frozenset({"finish_reason", "stop_reason"})


@dataclass
class Verdict:
    """Differences found (empty: the answers agree), and how many ranks / top-k ids were accepted as ties."""

    diffs: list[str] = field(default_factory=list)
    ties: int = 0
    values: int = 0
    max_diff: float = 0.0

    def add(self, path: str, what: str) -> None:
        if len(self.diffs) < 50:
            self.diffs.append(f"{path}: {what}")


def _close(a: float, b: float, v: Verdict, path: str) -> None:
    v.values += 1
    if a == b:
        return
    d = abs(a - b)
    v.max_diff = max(v.max_diff, d)
    if d > TOL:
        v.add(path, f"values {a} vs {b} differ by {d:.2e}")


def _row(a: dict[str, Any], b: dict[str, Any], v: Verdict, path: str) -> None:
    """One prompt_logprobs row: the prompt token first; the top-k ids equal up to ties at the k-th value."""
    ka, kb = list(a), list(b)
    if ka[:1] != kb[:1]:
        v.add(path, f"first id {ka[:1]} vs {kb[:1]}")
        return
    floor = min((e["logprob"] for e in [*a.values(), *b.values()]), default=0.0)
    for only, side in ((set(ka) - set(kb), a), (set(kb) - set(ka), b)):
        for tid in only:  # an id at the k-th place on one side only: a tie with the other side's k-th
            if abs(side[tid]["logprob"] - floor) <= TOL or abs(side[tid]["logprob"] - _kth(a, b, side)) <= TOL:
                v.ties += 1
            else:
                v.add(f"{path}[{tid}]", "id on one side only")
    for tid in set(ka) & set(kb):
        ea, eb = a[tid], b[tid]
        if list(ea) != list(eb):
            v.add(f"{path}[{tid}]", f"keys {list(ea)} vs {list(eb)}")
        _close(ea["logprob"], eb["logprob"], v, f"{path}[{tid}].logprob")
        if ea.get("decoded_token") != eb.get("decoded_token"):
            v.add(f"{path}[{tid}].decoded_token", f"{ea.get('decoded_token')!r} vs {eb.get('decoded_token')!r}")
        if ea.get("rank") != eb.get("rank"):
            near = [e for e in [*a.values(), *b.values()] if e is not ea and abs(e["logprob"] - ea["logprob"]) <= TOL]
            if near or abs((ea.get("rank") or 0) - (eb.get("rank") or 0)) <= 2:
                v.ties += 1
            else:
                v.add(f"{path}[{tid}].rank", f"{ea.get('rank')} vs {eb.get('rank')}")


def _kth(a: dict[str, Any], b: dict[str, Any], side: dict[str, Any]) -> float:
    other = b if side is a else a
    return min((e["logprob"] for e in list(other.values())[1:]), default=0.0)


def _npy(text: str) -> np.ndarray:
    return np.load(io.BytesIO(base64.b64decode(text)), allow_pickle=False)


def compare(a: Any, b: Any, v: Verdict | None = None, path: str = "") -> Verdict:
    """Walk both answers together; record every difference beyond what the module's docstring allows."""
    v = v if v is not None else Verdict()
    if isinstance(a, dict) and isinstance(b, dict):
        if list(a) != list(b):
            v.add(path or "body", f"keys {list(a)} vs {list(b)}")
        for key in a.keys() & b.keys():
            sub = f"{path}.{key}" if path else key
            if key in SHAPE_ONLY:
                if type(a[key]) is not type(b[key]):
                    v.add(sub, f"type {type(a[key]).__name__} vs {type(b[key]).__name__}")
            elif key == "prompt_logprobs" and isinstance(a[key], list) and isinstance(b[key], list):
                if len(a[key]) != len(b[key]):
                    v.add(sub, f"{len(a[key])} rows vs {len(b[key])}")
                for i, (ra, rb) in enumerate(zip(a[key], b[key], strict=False)):
                    if not ra or not rb:
                        if ra != rb:
                            v.add(f"{sub}[{i}]", f"{ra!r} vs {rb!r}")
                    else:
                        _row(ra, rb, v, f"{sub}[{i}]")
            elif key == "prompt_token_id_logprobs" and isinstance(a[key], str) and isinstance(b[key], str):
                xa, xb = _npy(a[key]), _npy(b[key])
                if xa.shape != xb.shape or xa.dtype != xb.dtype:
                    v.add(sub, f"{xa.dtype}{xa.shape} vs {xb.dtype}{xb.shape}")
                else:
                    for x, y in zip(xa.ravel().tolist(), xb.ravel().tolist(), strict=True):
                        _close(x, y, v, sub)
            elif key == "token_ids" and "choices" in path:
                if len(a[key] or []) != len(b[key] or []):
                    v.add(sub, f"{len(a[key] or [])} ids vs {len(b[key] or [])}")
            elif key in SAMPLED and "choices" in path and a.get("token_ids") != b.get("token_ids"):
                if type(a[key]) is not type(b[key]) and None not in (a[key], b[key]):
                    v.add(sub, f"type {type(a[key]).__name__} vs {type(b[key]).__name__}")
            else:
                compare(a[key], b[key], v, sub)
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            v.add(path, f"{len(a)} entries vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            compare(x, y, v, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        _close(a, b, v, path)
    elif a != b or type(a) is not type(b):
        v.add(path, f"{a!r} vs {b!r}")
    return v
