"""rayscore-batch on a classifier: each row (ids, or text with the tokenizer's special tokens) gets its raw scores,
equal to transformers' within 1e-4; a bad row is its own error; the output columns are num_tokens, scores, error."""

from __future__ import annotations

from pathlib import Path

from offline.columns import result_columns
from offline.dataset_scorer import DatasetScorer, RowInput
from tests.helpers.engine import make_engine, rand_ids
from tests.helpers.tiny_classifiers import build_classifier, reference_scores


def test_classifier_rows(tmp_path: Path) -> None:
    path = build_classifier(tmp_path / "qwen2-3", "qwen2", 3)
    engine = make_engine(path, enable_prefix_cache=True)
    scorer = DatasetScorer(engine, None)
    ids = rand_ids(11, seed=1)
    text = "Hello world! Ray Serve routes requests"
    rows = [RowInput(label="1", ids=ids), RowInput(label="2", text=text), RowInput(label="3", ids=["x"])]
    results = scorer.score(rows)
    text_ids = engine.tokenizer.encode(text, add_special_tokens=True)
    for result, want_ids in zip(results[:2], [ids, text_ids], strict=True):
        want = reference_scores(path, want_ids)
        assert result.scores is not None and max(abs(a - b) for a, b in zip(result.scores, want, strict=True)) < 1e-4
        assert result.num_tokens == len(want_ids) and result.error is None
    assert results[2].error is not None and "row 3" in results[2].error
    cols = result_columns(results, 0, False, classify=True)
    assert list(cols) == ["num_tokens", "scores", "error"]
