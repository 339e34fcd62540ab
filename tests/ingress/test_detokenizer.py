"""The incremental detokenizer on the embedded model's real tokenizer (SmolLM2's byte-level BPE): its text is a whole
decode's, fed in any split; stop strings across tokens; characters split over tokens; special tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from ingress.output.detokenizer import REPLACEMENT, IncrementalDetokenizer
from protocol import SamplingParams


@pytest.fixture(scope="module")
def tok(smollm2_path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_path)


def _stream(tok: Any, ids: list[int], params: SamplingParams, sizes: list[int]) -> tuple[list[str], int, Any]:
    """Feed `ids` in pieces of `sizes` (the last piece finishes the stream); the deltas, how many ids counted and
    the detokenizer."""
    d = IncrementalDetokenizer(tok, params)
    deltas, kept, at = [], 0, 0
    for i, n in enumerate(sizes):
        piece = ids[at:at + n]
        at += n
        kept += d.add(piece)
        deltas.append(d.delta(finished=i == len(sizes) - 1))
        if d.stopped_by is not None:
            break
    return deltas, kept, d


MIXED = "Hello world, this is a test. 日本語 café 🎉 done"


@pytest.mark.parametrize("sizes", [[1] * 40, [3, 5, 2, 30], [40]])
def test_text_is_a_whole_decode_whatever_the_split(tok: Any, sizes: list[int]) -> None:
    ids = tok.encode(MIXED, add_special_tokens=False)
    sizes = sizes[:len(ids)]
    sizes[-1] += len(ids) - sum(sizes)
    deltas, kept, d = _stream(tok, ids, SamplingParams(), sizes)
    assert kept == len(ids) and "".join(deltas) == tok.decode(ids) == MIXED
    # A character split over tokens is held back until complete: no delta carries half of one.
    assert not any(REPLACEMENT in x for x in deltas)


def test_a_character_split_over_tokens_waits_for_its_last_byte(tok: Any) -> None:
    ids = tok.encode("日", add_special_tokens=False)
    assert len(ids) > 1  # byte-level BPE: one character, several tokens
    d = IncrementalDetokenizer(tok, SamplingParams())
    d.add(ids[:1])
    assert d.delta(finished=False) == ""
    d.add(ids[1:])
    assert d.delta(finished=False) == "日"


def test_a_stop_string_across_tokens_ends_at_the_token_that_completes_it(tok: Any) -> None:
    ids = tok.encode("Hello world, this is a test.", add_special_tokens=False)  # Hello| world|,| this| is| a| ...
    stop = "ld, th"  # inside " world", all of ",", inside " this"
    for include, text in ((False, "Hello wor"), (True, "Hello world, th")):
        params = SamplingParams(stop=["zzz", stop], include_stop_str_in_output=include)
        for sizes in ([1] * len(ids), [len(ids)], [2, len(ids) - 2]):
            deltas, kept, d = _stream(tok, ids, params, sizes)
            assert kept == 4 and d.ids == ids[:4]  # up to and with " this", the token that completed it
            assert "".join(deltas) == text and d.stopped_by == stop


def test_the_first_stop_in_the_text_wins_and_later_tokens_do_not_count(tok: Any) -> None:
    ids = tok.encode("Hello world, this is a test.", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, SamplingParams(stop=["test", " is"]))
    assert d.add(ids) == 5 and d.stopped_by == " is" and d.text == "Hello world, this"
    assert d.add(ids) == 0 and d.delta(finished=False) == "Hello world, this"
    assert d.delta(finished=True) == ""


def test_streamed_text_holds_back_what_could_still_become_a_stop_string(tok: Any) -> None:
    ids = tok.encode("Hello world, this is a test.", add_special_tokens=False)
    d = IncrementalDetokenizer(tok, SamplingParams(stop=["xyz!"]))  # never matches; 3 characters held back
    d.add(ids[:2])
    assert d.delta(finished=False) == "Hello wo"
    d.add(ids[2:])
    assert d.delta(finished=False) == "rld, this is a te"
    assert d.delta(finished=True) == "st."


def test_special_tokens_are_skipped_unless_asked(tok: Any) -> None:
    ids = [*tok.encode("Hi there", add_special_tokens=False), tok.convert_tokens_to_ids("<|im_end|>")]
    skipped, _, _ = _stream(tok, ids, SamplingParams(), [len(ids)])
    kept, _, _ = _stream(tok, ids, SamplingParams(skip_special_tokens=False), [len(ids)])
    assert "".join(skipped) == "Hi there" and "".join(kept) == "Hi there<|im_end|>"
    # A stop string is matched in the text as decoded: a skipped special token's text cannot match.
    _, n, d = _stream(tok, ids, SamplingParams(stop=["<|im_end|>"]), [len(ids)])
    assert n == len(ids) and d.stopped_by is None
    _, n, d = _stream(tok, ids, SamplingParams(stop=["<|im_end|>"], skip_special_tokens=False), [len(ids)])
    assert n == len(ids) and d.stopped_by == "<|im_end|>" and d.text == "Hi there"


def test_a_stop_ending_in_a_split_character_streams_nothing_past_its_start(tok: Any) -> None:
    """The holdback counts from the last complete character: while "日" is half decoded, "t. " may still begin the
    stop string (the engine counted the half character and streamed the "t")."""
    ids = tok.encode("Hello world, this is a test. 日本語", add_special_tokens=False)
    deltas, kept, d = _stream(tok, ids, SamplingParams(stop=["t. 日"]), [1] * len(ids))
    assert "".join(deltas) == "Hello world, this is a tes" and d.stopped_by == "t. 日"
    assert tok.decode(ids[:kept]).endswith("日")
