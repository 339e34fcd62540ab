"""Incremental detokenization with stop strings: streamed text never has to be taken back."""

from __future__ import annotations

from transformers import PreTrainedTokenizerBase

from engine.core.sequence import Sequence
from engine.output_state import OutputState


class Detokenizer:
    def __init__(self, tokenizer: PreTrainedTokenizerBase) -> None:
        self.tokenizer = tokenizer

    def update(self, seq: Sequence, state: OutputState) -> str | None:
        """Re-decode the output into state.text, cut at the first stop string. Returns the stop string matched,
        if any. Decoding the whole output each step is O(n^2) in tokens but exact across merges and multi-byte
        characters; outputs here are short next to the prompt. OutputState.streamable decides what is sent."""
        p = seq.params
        text = self.tokenizer.decode(seq.output_token_ids, skip_special_tokens=p.skip_special_tokens)
        matched: str | None = None
        if p.stop_strings:
            # Only text after what was already searched (minus a stop's length) can hold a new match.
            begin = max(0, len(state.text) - p.max_stop_len)
            best = -1
            for s in p.stop_strings:
                at = text.find(s, begin)
                if at >= 0 and (best < 0 or at < best):
                    best, matched = at, s
            if matched is not None:
                text = text[:best + (len(matched) if p.include_stop_str_in_output else 0)]
        state.text = text
        return matched
