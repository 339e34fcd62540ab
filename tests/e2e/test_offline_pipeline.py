"""Offline scoring on a real local Ray (the session's cluster): the Ray Data pipeline against transformers."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch

from offline.columns import Columns
from offline.pipeline import BatchJob, WindowSpec, run
from tests.helpers.reference import hf_logits, hf_scores

TOL = 1e-4


def engine_config(path: Path) -> dict:
    return dict(model=str(path), block_size=4, num_kv_blocks=512, max_num_batched_tokens=64,
                score_rows_per_block=16, num_threads=1)


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def score(tmp_path: Path, model: Path, rows: list[dict], columns: Columns, **kw) -> list[dict]:
    src = write_jsonl(tmp_path / "in.jsonl", rows)
    out = tmp_path / "out"
    run(BatchJob(src, str(out), columns, engine_config(model), **kw))
    return pq.read_table(out).to_pylist()


def hf_windowed(path: Path, ids: list[int], start: int, size: int, stride: int) -> list[float]:
    """Hugging Face's "perplexity of fixed-length models" loop, written out; tokens j <= start dropped."""
    out: list[tuple[int, float]] = []
    prev_end = 0
    for begin in range(0, len(ids), stride):
        end = min(begin + size, len(ids))
        trg_len = end - prev_end  # the window's last trg_len labels are scored (position 0 has no label)
        lp = torch.log_softmax(hf_logits(path, ids[begin:end]), dim=-1)
        for j in range(max(begin + 1, end - trg_len), end):
            out.append((j, lp[j - 1 - begin, ids[j]].item()))
        prev_end = end
        if end == len(ids):
            break
    return [v for j, v in out if j > start]


def close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0) <= TOL


@pytest.fixture(autouse=True)
def _cluster(ray_cluster):
    yield


def test_ids_start_windows_top_k_order_and_errors(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    model = tiny_models["llama"]
    g = torch.Generator().manual_seed(0)
    lengths = [12, 40, 7, 70, 3, 25, 16, 9]
    rows = [{"id": f"doc-{i}", "meta": i * 10, "input_ids": torch.randint(2, 320, (n,), generator=g).tolist(),
             "n": i % 3} for i, n in enumerate(lengths)]
    rows.insert(3, {"id": "empty", "meta": -1, "input_ids": [], "n": 0})
    rows.insert(6, {"id": "late-start", "meta": -2, "input_ids": [5, 6, 7], "n": 2})
    got = score(tmp_path, model, rows, Columns(ids="input_ids", start="n"), windows=WindowSpec(True, 16, 6),
                top_k=2, batch_size=3, max_actors=2)
    # The input's order, over several batches, actors and output files.
    assert [r["id"] for r in got] == [r["id"] for r in rows]
    assert len(list((tmp_path / "out").glob("*.parquet"))) > 1
    for src, r in zip(rows, got, strict=True):
        assert (r["meta"], r["input_ids"], r["n"]) == (src["meta"], src["input_ids"], src["n"])
        ids, start = src["input_ids"], src["n"]
        if src["id"] in ("empty", "late-start"):
            assert r["token_logprobs"] is None and r["error"].startswith(f"row id='{src['id']}': ")
            continue
        assert r["error"] is None
        want = hf_windowed(model, ids, start, 16, 6)
        assert close(r["token_logprobs"], want), src["id"]
        if len(ids) <= 16:  # one window: the plain /generate rows
            assert close(r["token_logprobs"], hf_scores(model, ids, start))
        assert r["num_tokens"] == len(ids) and r["num_scored"] == len(ids) - 1 - start
        assert r["sum_logprob"] == pytest.approx(sum(r["token_logprobs"]), abs=1e-4)
        assert r["perplexity"] == pytest.approx(torch.tensor(-r["mean_logprob"]).exp().item(), rel=1e-6)
        assert all(len(t) == 2 and t[0]["logprob"] >= t[1]["logprob"] for t in r["top_logprobs"])
    assert "empty" in got[3]["error"] or "0 tokens" in got[3]["error"]
    assert "start 2" in got[6]["error"]


def test_text_rows_without_windows(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    from transformers import AutoTokenizer

    model = tiny_models["qwen2"]
    tok = AutoTokenizer.from_pretrained(str(model))
    texts = ["The quick brown fox jumps over the lazy dog.", "", "Hello world! Ray Serve routes requests.",
             "digits 0123456789 " * 60]
    rows = [{"text": t, "k": i} for i, t in enumerate(texts)]  # no id column: rows are known by position
    got = score(tmp_path, model, rows, Columns(text="text"), windows=WindowSpec(enabled=False))
    assert [r["k"] for r in got] == [0, 1, 2, 3]
    for i in (0, 2):
        ids = tok.encode(texts[i], add_special_tokens=False)
        assert close(got[i]["token_logprobs"], hf_scores(model, ids, 0))
    assert got[1]["error"] == "the text is empty"
    assert "allowed" in got[3]["error"] and "--window" in got[3]["error"]


def test_context_continuation_pairs(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    from lm_eval.api.model import TemplateLM
    from transformers import AutoTokenizer

    model = tiny_models["llama-tied-llama3"]
    tok = AutoTokenizer.from_pretrained(str(model))
    ctx = "Question: which digits are in 0123456789? Answer:"
    pairs = [(ctx, " digits"), (ctx, " all of them"), (ctx + " ", "none"), ("The quick brown", " fox"),
             ("", " nothing")]
    rows = [{"id": i, "context": c, "continuation": x} for i, (c, x) in enumerate(pairs)]
    got = score(tmp_path, model, rows, Columns(context="context", continuation="continuation"))

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False)

    lm = type("LM", (), {"backend": "causal", "tok_encode": staticmethod(encode)})()
    for (c, x), r in zip(pairs[:4], got, strict=False):
        c_ids, x_ids = TemplateLM._encode_pair(lm, c, x)
        ids = c_ids + x_ids
        want = hf_scores(model, ids, len(c_ids) - 1)
        assert close(r["token_logprobs"], want) and r["num_scored"] == len(x_ids)
        assert r["sum_logprob"] == pytest.approx(sum(want), abs=1e-4)
        greedy = hf_logits(model, ids)[len(c_ids) - 1:-1].argmax(-1).tolist() == x_ids
        assert r["is_greedy"] is greedy
    assert got[4]["error"].startswith("row id=4: the context is empty")


def test_missing_column_is_a_clear_error(tmp_path: Path, tiny_models: dict[str, Path]) -> None:
    with pytest.raises(KeyError, match="no column 'input_ids'.*'text'"):
        score(tmp_path, tiny_models["llama"], [{"text": "x y z"}], Columns(ids="input_ids"))
