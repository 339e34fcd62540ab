"""`rayscore-batch` end to end on SmolLM2: the console script on a JSONL of texts (one a long document scored in
windows of 512, stride 256), its main() on a CSV of ids with a start column, each row against transformers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import torch
from transformers import AutoTokenizer

from tests.helpers.reference import hf_logits, hf_scores

TOL = 1e-4
SCRIPT = Path(sys.executable).parent / "rayscore-batch"
CONFIG = Path(__file__).parents[2] / "configs" / "test.yaml"


def batch(ray_cluster, src: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    """The installed console script, connected to the session's cluster as a second driver."""
    address = ray_cluster.get_runtime_context().gcs_address
    assert address.startswith("127.0.0.1:"), address  # the session's cluster is on loopback (tests/conftest.py)
    return subprocess.run([str(SCRIPT), str(src), str(out), "--config", str(CONFIG), "--min-actors", "1",
                           "--max-actors", "1", "--address", address, *flags],
                          capture_output=True, text=True, timeout=300, env={**os.environ})


def windowed_reference(path: Path, ids: list[int], size: int, stride: int) -> list[float]:
    """Hugging Face's fixed-length perplexity loop: each token scored once, in the first window reaching it."""
    out: list[float] = []
    prev_end = 0
    for begin in range(0, len(ids), stride):
        end = min(begin + size, len(ids))
        lp = torch.log_softmax(hf_logits(path, ids[begin:end]), dim=-1)
        out += [lp[j - 1 - begin, ids[j]].item() for j in range(max(begin + 1, prev_end), end)]
        prev_end = end
        if end == len(ids):
            break
    return out


def assert_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= TOL


def test_texts_and_a_long_document_in_windows(ray_cluster, smollm2_path: Path, tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(smollm2_path))
    long_doc = " ".join(f"Paragraph {i}: the river crossed the valley {i % 7} times before the sea." for i in
                        range(60))
    texts = {"a": "The capital of France is Paris.", "long": long_doc, "empty": "",
             "b": "Ray Data scores whole datasets offline."}
    src = tmp_path / "texts.jsonl"
    src.write_text("".join(json.dumps({"id": k, "text": t, "source": "unit"}) + "\n" for k, t in texts.items()))
    proc = batch(ray_cluster, src, tmp_path / "out", "--window", "512", "--stride", "256")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "4 rows written" in proc.stderr and "1 with an error" in proc.stderr
    rows = pq.read_table(tmp_path / "out").to_pylist()
    assert [r["id"] for r in rows] == list(texts) and {r["source"] for r in rows} == {"unit"}
    ids = tok.encode(long_doc, add_special_tokens=False)
    assert len(ids) > 768  # four windows: at 0, 256, 512 and 768
    assert_close(rows[1]["token_logprobs"], windowed_reference(smollm2_path, ids, 512, 256))
    assert rows[1]["num_scored"] == len(ids) - 1
    for i in (0, 3):
        ids = tok.encode(rows[i]["text"], add_special_tokens=False)
        assert_close(rows[i]["token_logprobs"], hf_scores(smollm2_path, ids, 0))
    assert rows[2]["error"] == "row id='empty': the text is empty"


def test_ids_from_csv_with_a_start_column(ray_cluster, smollm2_path: Path, tmp_path: Path) -> None:
    from offline.cli import main

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 49152, (n,), generator=g).tolist() for n in (9, 30, 17)]
    src = tmp_path / "ids.csv"  # CSV has no lists: an ids cell is the JSON text of one
    src.write_text("id,input_ids,n\n" + "".join(f'{i},"{json.dumps(p)}",{i * 3}\n' for i, p in enumerate(prompts)))
    # In this process, on the session's cluster (the console script itself is the test above).
    assert main([str(src), str(tmp_path / "out"), "--config", str(CONFIG), "--max-actors", "1", "--ids-column",
                 "input_ids", "--start-column", "n", "--top-k", "3"]) == 0
    rows = pq.read_table(tmp_path / "out").to_pylist()
    for i, (p, r) in enumerate(zip(prompts, rows, strict=True)):
        assert r["id"] == i and r["error"] is None
        assert_close(r["token_logprobs"], hf_scores(smollm2_path, p, i * 3))
        assert len(r["top_logprobs"]) == len(p) - 1 - i * 3 and len(r["top_logprobs"][0]) == 3


def test_per_token_candidate_ids_column(ray_cluster, smollm2_path: Path, tmp_path: Path) -> None:
    """--token-ids-column on JSONL: one candidate list per scored token (on-policy distillation), each value equal
    to transformers' at that position; a flat list on another row applies to every scored token."""
    from offline.cli import main

    g = torch.Generator().manual_seed(5)
    ids = torch.randint(0, 49152, (21,), generator=g).tolist()
    cands = [torch.randint(0, 49152, (3,), generator=g).tolist() for _ in range(len(ids) - 4 - 1)]
    src = tmp_path / "rows.jsonl"
    src.write_text(json.dumps({"id": 0, "input_ids": ids, "n": 4, "cands": cands}) + "\n"
                   + json.dumps({"id": 1, "input_ids": ids[:8], "n": 0, "cands": [[5, 9]] * 7}) + "\n")
    assert main([str(src), str(tmp_path / "out"), "--config", str(CONFIG), "--max-actors", "1", "--ids-column",
                 "input_ids", "--start-column", "n", "--token-ids-column", "cands"]) == 0
    rows = pq.read_table(tmp_path / "out").to_pylist()
    lp = torch.log_softmax(hf_logits(smollm2_path, ids), -1)
    got = rows[0]["token_ids_logprobs"]
    assert [[e["token_id"] for e in row] for row in got] == cands
    assert max(abs(e["logprob"] - lp[4 + j, e["token_id"]].item()) for j, row in enumerate(got) for e in row) <= TOL
    assert len(rows[1]["token_ids_logprobs"]) == 7 and rows[1]["error"] is None


def test_missing_column_fails_before_any_work(ray_cluster, tmp_path: Path, capsys) -> None:
    from offline.cli import main

    src = tmp_path / "in.jsonl"
    src.write_text('{"id": 1, "body": "no text column here"}\n')
    assert main([str(src), str(tmp_path / "out"), "--config", str(CONFIG)]) == 2  # on the session's cluster
    err = capsys.readouterr().err
    assert "no column 'text'" in err and "'body'" in err


@pytest.mark.parametrize("flags,message", [(["--window", "8", "--stride", "8"], "stride"),
                                           (["--context-column", "c"], "continuation column"),
                                           (["--context-column", "c", "--continuation-column", "x", "--window",
                                             "64"], "scored whole")])
def test_bad_flags_are_usage_errors(tmp_path: Path, capsys, flags: list[str], message: str) -> None:
    from offline.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["in.jsonl", str(tmp_path / "out"), *flags])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_config_and_pool_bounds_come_from_the_serve_yaml() -> None:
    from deploy.config import AppConfig
    from offline.cli import actor_bounds, load_app_config

    cfg = load_app_config(CONFIG)
    assert (cfg.num_workers, cfg.worker_num_cpus, cfg.kv_cache_mb) == (2, 0.5, 96)
    assert actor_bounds(cfg, None, None) == (2, 2) and actor_bounds(cfg, None, 1) == (1, 1)
    auto = AppConfig(worker_autoscaling={"min_replicas": 0, "max_replicas": 4})
    assert actor_bounds(auto, None, None) == (1, 4) and actor_bounds(auto, 2, None) == (2, 4)
    with pytest.raises(ValueError, match="no application named 'x'"):
        load_app_config(CONFIG, "x")


def test_flat_logprobs_output_decodes_to_the_plain_output(ray_cluster, tmp_path: Path) -> None:
    """--flat-logprobs: the same rows, their token_logprobs and top-k written in the compact encoding; decoded with
    protocol/compact.py (as an HTTP answer is), equal to the plain run's bit for bit."""
    from protocol import compact

    src = tmp_path / "ids.jsonl"
    src.write_text("".join(json.dumps({"ids": ids}) + "\n" for ids in ([504, 3458, 282, 4649, 314], [30, 31, 32])))
    runs = {}
    for name, flags in (("plain", ()), ("flat", ("--flat-logprobs",))):
        proc = batch(ray_cluster, src, tmp_path / name, "--ids-column", "ids", "--top-k", "3", *flags)
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs[name] = pq.read_table(tmp_path / name).to_pylist()
    for plain, flat in zip(runs["plain"], runs["flat"], strict=True):
        assert "token_logprobs" not in flat and "top_logprobs" not in flat
        assert compact.unpack_values(flat["token_logprobs_val_flat_b64"]) == plain["token_logprobs"]
        assert compact.decode_top_rows(flat, "top_logprobs") == [
            [[e["logprob"], e["token_id"]] for e in row] for row in plain["top_logprobs"]]
        assert flat["sum_logprob"] == plain["sum_logprob"]
