"""Offline scoring's token arithmetic, without an engine: windows and lm-eval's context/continuation split."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoTokenizer

from offline.plan import RowError, Windows, plan_ids, plan_pair, plan_windows, split_pair


def scored_tokens(n: int, start: int, w: Windows) -> list[int]:
    """The absolute index of every token the windows score, in order."""
    out = []
    for begin, end, local in plan_windows(n, start, w):
        out.extend(range(begin + local + 1, end))
    return out


@pytest.mark.parametrize("n,size,stride,start", [(10, 4, 2, 0), (11, 4, 3, 0), (100, 16, 5, 0), (7, 8, 4, 0),
                                                 (33, 8, 4, 13), (20, 5, 1, 0), (9, 2, 1, 3)])
def test_windows_score_each_token_once_in_order(n: int, size: int, stride: int, start: int) -> None:
    w = Windows(size, stride)
    assert scored_tokens(n, start, w) == list(range(start + 1, n))
    for begin, end, local in plan_windows(n, start, w):
        assert end - begin <= size and begin % stride == 0 and local >= 0
        # Past the first window, a scored token has at least size - stride tokens of context in its window.
        if begin > 0:
            assert local + 1 >= size - stride


def test_windows_follow_the_hf_guide() -> None:
    # HF: for begin in range(0, L, S): end = min(begin + W, L); trg_len = end - prev_end (the last trg_len
    # labels of the window are scored); prev_end = end; stop at L.
    assert plan_windows(10, 0, Windows(4, 2)) == [(0, 4, 0), (2, 6, 1), (4, 8, 1), (6, 10, 1)]
    assert plan_windows(3, 0, Windows(8, 4)) == [(0, 3, 0)]


def test_window_and_stride_are_checked() -> None:
    with pytest.raises(ValueError, match="stride"):
        Windows(4, 4)
    with pytest.raises(ValueError, match="stride"):
        Windows(4, 0)
    with pytest.raises(ValueError, match="window"):
        Windows(1, 1)


def test_row_errors_name_the_limit() -> None:
    with pytest.raises(RowError, match="more than the 8 allowed"):
        plan_ids(list(range(9)), 0, None, max_len=8)
    with pytest.raises(RowError, match="start 5"):
        plan_ids([1, 2, 3], 5, None, max_len=8)
    with pytest.raises(RowError, match="at least 2"):
        plan_ids([1], 0, None, max_len=8)
    with pytest.raises(RowError, match="window of 16 tokens is longer"):
        plan_ids(list(range(20)), 0, Windows(16, 8), max_len=8)
    assert len(plan_ids(list(range(20)), 0, Windows(8, 4), max_len=8).pieces) == 4


@pytest.fixture(scope="module")
def tok(tiny_models):
    return AutoTokenizer.from_pretrained(str(tiny_models["llama"]))


@pytest.mark.parametrize("context,continuation", [
    ("The quick brown fox", " jumps over"), ("The quick brown fox ", "jumps over"),
    ("Question: digits?  ", " 0123"), ("Hello", "world!"), ("Scoring text", "."),
])
def test_split_is_lm_evals(tok, context: str, continuation: str) -> None:
    from lm_eval.api.model import TemplateLM

    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False)

    lm = SimpleNamespace(backend="causal", tok_encode=encode)
    assert split_pair(encode, context, continuation) == TemplateLM._encode_pair(lm, context, continuation)


def test_pair_errors(tok) -> None:
    def encode(s: str) -> list[int]:
        return tok.encode(s, add_special_tokens=False)

    with pytest.raises(RowError, match="context is empty"):
        plan_pair(encode, "  ", "x", 100)
    with pytest.raises(RowError, match="continuation is empty"):
        plan_pair(encode, "x", "", 100)
    with pytest.raises(RowError, match="not windowed"):
        plan_pair(encode, "The quick brown fox " * 5, "jumps", 10)
