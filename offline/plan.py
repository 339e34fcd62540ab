"""How one dataset row becomes scoring requests ("pieces"), with no engine and no Ray: plain token arithmetic.

A row is ids (or a text, tokenized as /generate tokenizes a prompt) with a start N, or an lm-eval
context/continuation pair. Its answer is the concatenation of its pieces' rows, in order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

Tokenize = Callable[[str], list[int]]


class RowError(ValueError):
    """What is wrong with one row (empty text, too long, bad start, ...): reported on that row only."""


@dataclass(frozen=True)
class Piece:
    """One scoring request: its rows are log p(ids[p+1] | ids[:p+1]) for p = start .. len(ids)-2."""

    ids: list[int]
    start: int


@dataclass(frozen=True)
class RowPlan:
    num_tokens: int  # tokens of the whole row (context + continuation for a pair)
    pieces: list[Piece]
    # lm-eval pairs: is_greedy is asked for (the pieces then need the top-1 token of each row).
    wants_greedy: bool = False


@dataclass(frozen=True)
class Windows:
    """The fixed-length-perplexity windows: window k covers ids[k*stride : k*stride + size]."""

    size: int
    stride: int

    def __post_init__(self) -> None:
        if self.size < 2:
            raise ValueError(f"the window must hold at least 2 tokens, got {self.size}")
        # stride < size: every window after the first then starts inside the previous one, so each new token
        # has context in its window (stride == size would leave every window's first token unscored).
        if not 0 < self.stride < self.size:
            raise ValueError(f"the stride must be between 1 and window - 1 = {self.size - 1}, got {self.stride}")


def plan_windows(num_tokens: int, start: int, windows: Windows) -> list[tuple[int, int, int]]:
    """(begin, end, local_start) of each window that scores a token: Hugging Face's "perplexity of
    fixed-length models" method. Token j >= 1 is scored once, in the first window holding it at a position
    no earlier window reached; only tokens j > start are kept. local_start is the window's
    logprob_start_len, so its rows score exactly ids[max(prev_end, start + 1) : end]."""
    out: list[tuple[int, int, int]] = []
    prev_end = 0
    for begin in range(0, num_tokens, windows.stride):
        end = min(begin + windows.size, num_tokens)
        first = max(prev_end, start + 1, begin + 1)  # first token this window scores
        if first < end:
            out.append((begin, end, first - 1 - begin))
        prev_end = end
        if end == num_tokens:
            break
    return out


def plan_ids(ids: list[int], start: int, windows: Windows | None, max_len: int) -> RowPlan:
    """Rows start .. L-2 of ids, in windows when given (and the row is longer than one window)."""
    n = len(ids)
    if n < 2:
        raise RowError(f"the row has {n} token{'s' * (n != 1)}; scoring needs at least 2")
    if not 0 <= start <= n - 2:
        raise RowError(f"the start {start} leaves no token to score in {n} tokens (start must be 0 .. {n - 2})")
    if windows is None:
        if n > max_len:
            raise RowError(f"the row has {n} tokens, more than the {max_len} allowed (the engine's max_model_len / "
                           f"KV cache); score it in windows (--window)")
        return RowPlan(n, [Piece(ids, start)])
    if windows.size > max_len:
        raise RowError(f"the window of {windows.size} tokens is longer than the {max_len} allowed (the engine's "
                       f"max_model_len / KV cache)")
    pieces = [Piece(ids[b:e], s) for b, e, s in plan_windows(n, start, windows)]
    return RowPlan(n, pieces)


def split_pair(tokenize: Tokenize, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """lm-eval's _encode_pair for causal models: the context's trailing spaces move to the continuation, and
    the continuation's tokens are those of context + continuation beyond the context's own tokens."""
    if not context.strip():
        raise RowError("the context is empty (lm-eval pairs need a context; score a lone text with --text-column)")
    if not continuation:
        raise RowError("the continuation is empty")
    n_spaces = len(context) - len(context.rstrip())
    if n_spaces:
        continuation = context[-n_spaces:] + continuation
        context = context[:-n_spaces]
    whole = tokenize(context + continuation)
    ctx = tokenize(context)
    return ctx, whole[len(ctx):]


def plan_pair(tokenize: Tokenize, context: str, continuation: str, max_len: int) -> RowPlan:
    """One request over context + continuation scoring the continuation's tokens (never windowed: lm-eval's
    loglikelihood conditions on the whole context)."""
    ctx, cont = split_pair(tokenize, context, continuation)
    if not cont:
        raise RowError("the continuation has no tokens of its own (they merge into the context's last token)")
    ids = ctx + cont
    if len(ids) > max_len:
        raise RowError(f"context + continuation has {len(ids)} tokens, more than the {max_len} allowed (the "
                       f"engine's max_model_len / KV cache); pairs are not windowed")
    return RowPlan(len(ids), [Piece(ids, len(ctx) - 1)], wants_greedy=True)


def plan_text(tokenize: Tokenize, text: str, start: int, windows: Windows | None, max_len: int) -> RowPlan:
    if not text:
        raise RowError("the text is empty")
    return plan_ids(tokenize(text), start, windows, max_len)
