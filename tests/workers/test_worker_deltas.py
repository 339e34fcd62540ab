"""What the real EngineWorker (in process, a tiny checkpoint) streams: the engine's own RequestOutput deltas, with
what only the worker knows set on them. The rows are the engine's tuples (nothing copied per delta), a field not
asked for is None in every delta and one asked for is [] once it has nothing new, and the final delta carries only
what is new (the deltas concatenate to the whole answer, never replaying the last output)."""

from __future__ import annotations

from pathlib import Path

from protocol import GenerateRequest, RequestOutput, SamplingParams, merge_outputs
from workers.worker import EngineWorker

PROMPT = [5, 17, 29, 41, 53, 65]


async def test_deltas_are_the_engines_none_apart_from_empty_and_no_replay(tiny_models: dict[str, Path]) -> None:
    worker = EngineWorker({"model": str(tiny_models["llama"]), "dtype": "float32"})
    info = await worker.model_info()
    asked = SamplingParams(max_tokens=5, ignore_eos=True, temperature=0.0, return_logprob=True, logprob_start_len=0,
                           top_logprobs_num=2)
    deltas: list[RequestOutput] = [d async for d in worker.generate(GenerateRequest("lp", PROMPT, asked))]
    assert type(deltas[0]) is RequestOutput and len(deltas) > 1
    # Input rows come once, then [] (asked, nothing new): never None, never repeated.
    assert len(deltas[0].input_token_logprobs or []) == len(PROMPT) - 1
    assert all(d.input_token_logprobs == [] for d in deltas[1:])
    # Not asked: None in every delta, the final one included.
    assert all(d.output_token_ids_logprobs is None and d.output_token_ranks is None for d in deltas)
    # The engine's (value, token_id) tuples as they are: the worker copied none of them into lists.
    rows = [r for d in deltas for r in d.output_token_logprobs or []]
    assert rows and all(type(r) is tuple for r in rows)
    assert all(type(r) is tuple for d in deltas for top in d.output_top_logprobs or [] for r in top)
    # No replay: the ids concatenate to the generated count, and the final delta holds only its own token(s).
    assert sum(len(d.new_token_ids) for d in deltas) == deltas[-1].completion_tokens == 5
    assert deltas[-1].finished and len(deltas[-1].new_token_ids) <= 1
    # What the worker sets on each delta.
    assert {(d.info_version, d.weight_version, d.input_logprob_temperature) for d in deltas} == {
        (info.version, "default", None)}
    whole = merge_outputs(deltas)
    assert [t for _, t in whole.output_token_logprobs or []] == whole.new_token_ids

    plain = SamplingParams(max_tokens=3, ignore_eos=True, temperature=0.0)
    deltas = [d async for d in worker.generate(GenerateRequest("plain", PROMPT, plain))]
    assert all(d.output_token_logprobs is None and d.input_token_logprobs is None for d in deltas)
    # The unary call's whole answer is the streamed deltas merged.
    (unary,) = await worker.generate_whole([GenerateRequest("plain-2", PROMPT, plain)])
    assert unary.new_token_ids == merge_outputs(deltas).new_token_ids and unary.input_token_logprobs is None
