"""The workers' model-info version on the real EngineWorker (in process, the embedded model): every answer carries
it, and it moves with a user_config change and a weight update, so the ingress asks for ModelInfo only then
(ingress/transport/worker_client.py), never on a timer while answers come."""

from __future__ import annotations

from pathlib import Path

from engine.loading.weight_update import apply_weights, stage_weights
from protocol import GenerateRequest, SamplingParams
from workers.worker import EngineWorker


async def test_answers_carry_the_version_and_it_moves_with_settings_and_weights(smollm2_path: Path) -> None:
    worker = EngineWorker({"model": str(smollm2_path), "dtype": "float32"})
    first = await worker.model_info()
    assert first.version and (await worker.model_info()).version == first.version  # stable while nothing changes
    req = GenerateRequest("a", [1, 504, 3458], SamplingParams(max_tokens=2))
    (whole,) = await worker.generate_whole([req])
    assert whole.info_version == first.version

    await worker.reconfigure({"max_top_logprobs": 3})  # a user_config change
    settings = await worker.model_info()
    assert settings.max_top_logprobs == 3 and settings.version not in ("", first.version)
    chunks = [c async for c in worker.generate(GenerateRequest("b", [1, 504, 3458], SamplingParams(max_tokens=2)))]
    assert {c.info_version for c in chunks} == {settings.version}  # every delta of a stream

    eng = worker.engine.engine
    apply_weights(eng, stage_weights(eng, str(smollm2_path)), "step-1")  # a weight update (same tensors, new name)
    weights = await worker.model_info()
    assert weights.version not in (first.version, settings.version)
    (whole,) = await worker.generate_whole([GenerateRequest("c", [1, 504, 3458], SamplingParams(max_tokens=1))])
    assert whole.info_version == weights.version and whole.weight_version == "step-1"
