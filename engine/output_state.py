"""Per-request output state, owned by LLMEngine: what a request has produced for its caller (ids, logprob rows; no
text: that is the ingress's) and how much of it was sent, so each RequestOutput carries only the delta. The scheduler
and the model runner never see it."""

from __future__ import annotations

from engine.core.sequence import Sequence
from protocol.outputs import RequestOutput, TokenLogprob
from protocol.sampling import SamplingParams


class OutputState:
    def __init__(self, params: SamplingParams) -> None:
        # Scoring-only requests have no output rows: null, not [] (the contract). None = not requested.
        want = params.return_logprob and params.max_tokens > 0
        # Scoring rows accumulate in order across prefill chunks (and preemptions).
        self.input_token_logprobs: list[TokenLogprob] | None = [] if params.scores_input else None
        self.input_top_logprobs: list[list[TokenLogprob]] | None = (
            [] if params.scores_input and params.top_logprobs_num > 0 else None)
        self.input_token_ids_logprobs: list[list[TokenLogprob]] | None = (
            [] if params.scores_input and params.asks_token_ids else None)
        self.input_token_ranks: list[int] | None = [] if params.scores_input and params.return_input_ranks else None
        self.output_token_logprobs: list[TokenLogprob] | None = [] if want else None
        self.output_top_logprobs: list[list[TokenLogprob]] | None = (
            [] if want and params.top_logprobs_num > 0 else None)
        # A classify request's raw scores at its pooled position, once its prompt is computed.
        self.pooled: list[float] | None = None
        self.output_token_ids_logprobs: list[list[TokenLogprob]] | None = (
            [] if want and params.output_token_ids is not None else None)
        self.output_token_ranks: list[int] | None = [] if want and params.return_output_ranks else None
        # How much was sent: output token ids, output logprob rows; input rows go once.
        self.num_ids_sent = 0
        self.num_output_logprobs_sent = 0
        self.input_rows_sent = False

    def add_input_rows(self, values: list[TokenLogprob], tops: list[list[TokenLogprob] | None],
                       token_ids: list[list[TokenLogprob] | None], ranks: list[int | None] | None = None) -> None:
        if self.input_token_logprobs is not None and values:
            self.input_token_logprobs.extend(values)
            if self.input_top_logprobs is not None:
                self.input_top_logprobs.extend(t or [] for t in tops)
            if self.input_token_ids_logprobs is not None:
                self.input_token_ids_logprobs.extend(t or [] for t in token_ids)
            if self.input_token_ranks is not None:
                self.input_token_ranks.extend(r or 0 for r in (ranks or [None] * len(values)))

    def add_sampled(self, value: TokenLogprob | None, top: list[TokenLogprob] | None,
                    token_ids: list[TokenLogprob] | None = None, rank: int | None = None) -> None:
        if self.output_token_logprobs is not None and value is not None:
            self.output_token_logprobs.append(value)
            if self.output_token_ranks is not None:
                self.output_token_ranks.append(rank or 0)
            if self.output_top_logprobs is not None:
                self.output_top_logprobs.append(top or [])
            if self.output_token_ids_logprobs is not None:
                self.output_token_ids_logprobs.append(token_ids or [])

    def delta(self, seq: Sequence) -> RequestOutput:
        """The output since the previous delta of this request; marks it sent."""
        out_ids = seq.output_token_ids
        n_lp = self.num_output_logprobs_sent
        out = RequestOutput(
            request_id=seq.request_id,
            new_token_ids=out_ids[self.num_ids_sent:],
            finished=seq.is_finished,
            finish_reason=seq.finish_reason if seq.is_finished else None,
            prompt_tokens=seq.num_prompt_tokens,
            completion_tokens=seq.num_output_tokens,
            cached_tokens=seq.num_cached_tokens,
            # Input rows are sent once, with the output that ends the prefill.
            input_token_logprobs=self._once(self.input_token_logprobs),
            input_top_logprobs=self._once(self.input_top_logprobs),
            input_token_ids_logprobs=self._once(self.input_token_ids_logprobs),
            input_token_ranks=self._once(self.input_token_ranks),
            output_token_logprobs=_since(self.output_token_logprobs, n_lp),
            output_top_logprobs=_since(self.output_top_logprobs, n_lp),
            pooled=self.pooled if seq.is_finished else None,
            output_token_ids_logprobs=_since(self.output_token_ids_logprobs, n_lp),
            output_token_ranks=_since(self.output_token_ranks, n_lp),
            arrival_time=seq.arrival_time, scheduled_time=seq.scheduled_time, finished_time=seq.finished_time,
        )
        self.num_ids_sent = len(out_ids)
        if self.output_token_logprobs is not None:
            self.num_output_logprobs_sent = len(self.output_token_logprobs)
        self.input_rows_sent = True
        return out

    def _once(self, rows: list | None) -> list | None:
        if rows is None:
            return None
        return [] if self.input_rows_sent else list(rows)


def _since(rows: list | None, start: int) -> list | None:
    return None if rows is None else rows[start:]
