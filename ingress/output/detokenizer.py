"""Incremental detokenization of one generated stream, with stop strings: the text side of an answer, run where
the tokenizer lives (the ingress, as vLLM's API server runs its IncrementalDetokenizer), never in the engine.

The engine generates ids and stops on stop token ids, EOS and length; stop strings are matched here, token by
token, and the caller ends the request in the engine (the ingress closes the worker call, which aborts it).

Each step decodes a window of a few ids, as vLLM's detokenize_incrementally does: the ids since the last point
where the text was complete (`_prefix`), less the text those already gave (`_read`), so a merge across tokens,
a multi-byte character split over several tokens and a tokenizer that drops the first token's leading space all
come out as a whole decode gives them, at a cost that does not grow with the output. For a byte-level BPE without
`clean_up_tokenization_spaces` (SmolLM2, Llama 3, Qwen) the text is exactly `decode(ids, skip_special_tokens)`;
a tokenizer that cleans up spaces cleans each window. (The engine decoded all the ids after every token, a cost
that grows with the output.)

The tokenizer is duck-typed (`decode(ids, skip_special_tokens=...)`): importing this module loads neither
transformers nor the engine. The output processor (processor.py) runs it on each delta.
"""

from __future__ import annotations

from typing import Any

from protocol.sampling import SamplingParams

REPLACEMENT = "\ufffd"  # what decode writes for the bytes of a character not yet complete


class IncrementalDetokenizer:
    """One request's generated ids -> its text, cut at the first stop string.

    `add(ids)` takes the ids a delta brings and returns how many of them belong to the answer: all of them, or up to
    and including the token whose text completed a stop string (the engine may have generated more before it was
    stopped; those never reach the answer). `delta(finished)` is the text to send now: it holds back a trailing
    incomplete character and the last `max_stop_len - 1` characters, which could still become a stop string, so no
    text is ever taken back; at the end it sends the rest.
    """

    def __init__(self, tokenizer: Any, params: SamplingParams) -> None:
        self._tokenizer = tokenizer
        self._skip_special = params.skip_special_tokens
        self._stops = params.stop_strings
        self._max_stop_len = params.max_stop_len
        self._include_stop = params.include_stop_str_in_output
        self.ids: list[int] = []
        # The text of self.ids (the decode of a character still incomplete included), cut at the stop string once
        # one matched.
        self.text = ""
        # The stop string that ended the text (None while none has).
        self.stopped_by: str | None = None
        self._sent = 0
        # The text up to self.ids[:_read] is final (_done); the next window decodes from _prefix, a few ids before,
        # so that the ids at its start give their text in context.
        self._done = ""
        self._prefix = 0
        self._read = 0

    def add(self, ids: list[int]) -> int:
        """Take the next generated ids; returns how many of them count (fewer only when a stop string matched)."""
        if self.stopped_by is not None:
            return 0
        if not self._stops:
            self.ids += ids
            if ids:
                self.text = self._decode()
            return len(ids)
        for n, tok in enumerate(ids, start=1):
            # Per token, as the engine did: the answer ends at the first token whose text holds a stop string.
            self.ids.append(tok)
            if self._match(self._decode()):
                return n
        return len(ids)

    def _decode(self) -> str:
        """The text of self.ids from the window since _prefix; the window moves on once its text ends in a complete
        character (vLLM's prefix and read offsets)."""
        decode = self._tokenizer.decode
        skip = self._skip_special
        context: str = decode(self.ids[self._prefix:self._read], skip_special_tokens=skip) if self._read else ""
        window: str = decode(self.ids[self._prefix:], skip_special_tokens=skip)
        new = window[len(context):]
        if len(window) > len(context) and not window.endswith(REPLACEMENT):
            self._done += new
            self._prefix, self._read = self._read, len(self.ids)
            return self._done
        return self._done + new

    def _match(self, text: str) -> bool:
        """Search `text` for the first stop string, where a new match can be: past what the previous token's text
        had, less a stop's length. Cuts the text at a match (keeping the stop string when asked)."""
        begin = max(0, len(self.text) - self._max_stop_len)
        best, matched = -1, None
        for s in self._stops:
            at = text.find(s, begin)
            if at >= 0 and (best < 0 or at < best):
                best, matched = at, s
        if matched is None:
            self.text = text
            return False
        self.text = text[:best + (len(matched) if self._include_stop else 0)]
        self.stopped_by = matched
        return True

    def delta(self, finished: bool) -> str:
        """The text not sent yet that may be sent now (all of it once the stream is finished or stopped)."""
        end = len(self.text)
        if not finished and self.stopped_by is None:
            while end > 0 and self.text[end - 1] == REPLACEMENT:
                end -= 1
            # Counted from the last complete character: a stop string that ends in the character still being
            # decoded starts at most max_stop_len - 1 characters before it. (The engine counted from the text's
            # end, so a stop ending in a multi-byte character could stream its first character before the match.)
            end -= max(0, self._max_stop_len - 1)
        end = max(end, self._sent)
        out = self.text[self._sent:end]
        self._sent = end
        return out
