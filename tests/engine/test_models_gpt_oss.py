"""gpt-oss (engine/models/gpt_oss.py) on the tiny checkpoint of tests/helpers/tiny_gpt_oss.py, against transformers'
float32 uncached forward and generate: every feature shown to move transformers' rows (so a check below fails if the
engine ignored it), then the family checks of tests/helpers/families.py on the torch path (prompts of 5 windows,
chunk budgets below the window, mixed batches with top-k, prefix hits past the window, batched greedy decode), the
varlen backend with the reference kernel and with the Triton kernel (sinks in both), and the refusals."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.helpers import engine as engine_helpers
from tests.helpers.engine import assert_rows, greedy, make_engine, rand_ids, scoring
from tests.helpers.families import (
    check_feature_matters,
    check_greedy,
    check_mixed_batch,
    check_prefix_cache,
    check_scoring_any_chunking,
    hf_generate,
)
from tests.helpers.reference import hf_model, hf_scores
from tests.helpers.tiny_gpt_oss import gpt_oss_path

# Config patches, each turning one feature off.
CONFIG_OFF: list[dict[str, Any]] = [
    {"layer_types": ["full_attention"] * 3},  # the sliding windows
    {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}},  # YaRN
    {"swiglu_limit": 1e9},  # the SwiGLU's clamp
]


def _zero(t: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(t)


# Weight patches (name suffix -> new value), each turning one feature off: a sink of -1e4 adds exp(-1e4) = 0.
WEIGHTS_OFF: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "self_attn.sinks": lambda t: torch.full_like(t, -1e4),
    "mlp.router.bias": _zero,
    "self_attn.q_proj.bias": _zero,
    "self_attn.o_proj.bias": _zero,
    "mlp.experts.gate_up_proj_bias": _zero,
    "mlp.experts.down_proj_bias": _zero,
}


@pytest.mark.parametrize("patch", CONFIG_OFF, ids=[next(iter(p)) for p in CONFIG_OFF])
def test_config_feature_changes_the_scores(tmp_path: Path, patch: dict[str, Any]) -> None:
    check_feature_matters(gpt_oss_path(), tmp_path, patch)


@pytest.mark.parametrize("suffix", list(WEIGHTS_OFF))
def test_weight_feature_changes_the_scores(tmp_path: Path, suffix: str) -> None:
    path, other = gpt_oss_path(), tmp_path / "off"
    shutil.copytree(path, other)
    state = load_file(str(other / "model.safetensors"))
    hit = [n for n in state if n.endswith(suffix)]
    assert hit, suffix
    for n in hit:
        state[n] = WEIGHTS_OFF[suffix](state[n])
    save_file(state, str(other / "model.safetensors"), metadata={"format": "pt"})
    ids = rand_ids(37, seed=4)
    a, b = hf_scores(path, ids, 0), hf_scores(other, ids, 0)
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) >= 1e-2, suffix


def test_scoring_any_chunking() -> None:
    """One token a step (every chunk after a cached context), 16 (chunks past the window) and the whole prompt."""
    check_scoring_any_chunking(gpt_oss_path(), budgets=(1, 16, 1000))


def test_mixed_batch() -> None:
    check_mixed_batch(gpt_oss_path())


def test_prefix_cache_past_the_window() -> None:
    check_prefix_cache(gpt_oss_path())


def test_greedy_equals_generate() -> None:
    check_greedy(gpt_oss_path())


def test_varlen_reference_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-call-per-layer backend with the pure-torch reference kernel: sinks through varlen_attention_reference
    (every request's rows in one call: prefill chunks after cached context, and batched decodes)."""
    monkeypatch.setitem(engine_helpers.DEFAULTS, "attention_backend", "varlen")
    check_scoring_any_chunking(gpt_oss_path(), budgets=(3,))
    check_greedy(gpt_oss_path())


def test_triton_kernel_in_the_engine() -> None:
    """Sinks, windows and GQA on our Triton kernel, float32 (on CPU in Triton's interpreter): chunked scoring and
    batched greedy decode within 1e-4 of transformers."""
    from engine.layers.varlen_triton import varlen_attention_triton
    from tests.helpers.triton_device import kernel_device

    kernel_device()
    path = gpt_oss_path()
    eng = make_engine(path, max_num_batched_tokens=16, attention_backend="varlen")
    eng.runner.backend.kernel = varlen_attention_triton
    ids = rand_ids(37, seed=4)
    for start in (0, 17):
        out = eng.generate([ids], scoring(start), check=True)[0]
        assert_rows(out.input_token_logprobs, ids, start, hf_scores(path, ids, start))
    prompts = [rand_ids(n, seed=100 + n) for n in (3, 11)]
    outs = eng.generate(prompts, greedy(9), check=True)
    ref = hf_model(str(path))
    for p, o in zip(prompts, outs, strict=True):
        assert o.new_token_ids == hf_generate(ref, p, 9).sequences[0, len(p):].tolist()


def test_teacher_rows_at_a_temperature() -> None:
    """A distillation teacher's request (input_logprob_temperature 0.7, top-3, token_ids_logprob), chunked: rows,
    top-k and the asked ids within 1e-4 of log_softmax(transformers logits / 0.7)."""
    from protocol.sampling import SamplingParams
    from tests.helpers.reference import hf_logits

    path, ids, asked = gpt_oss_path(), rand_ids(30, seed=8), [2, 3, 50]
    params = SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=4, top_logprobs_num=3,
                            input_logprob_temperature=0.7, token_ids_logprob=asked)
    out = make_engine(path, max_num_batched_tokens=6).generate([ids], params, check=True)[0]
    lp = torch.log_softmax(hf_logits(path, ids) / 0.7, -1)
    worst = 0.0
    for pos, (row, top, by_id) in enumerate(zip(out.input_token_logprobs, out.input_top_logprobs,
                                                out.input_token_ids_logprobs, strict=True), start=4):
        worst = max(worst, abs(row[0] - lp[pos, ids[pos + 1]].item()))
        assert [t for _, t in top] == torch.topk(lp[pos], 3).indices.tolist()
        worst = max([worst] + [abs(v - lp[pos, t].item()) for v, t in top + by_id])
        assert [t for _, t in by_id] == asked
    assert worst <= 1e-4, worst


def test_lora_on_the_attention(tmp_path: Path) -> None:
    """A PEFT adapter on q/k/v/o (biased projections; the experts are no LoRA target): rows within 1e-4 of PEFT's
    forward, beside a base-model request in the same step."""
    from protocol.sampling import AdapterRef
    from tests.helpers.tiny_adapters import build_adapter, peft_scores

    base = gpt_oss_path()
    adapter = build_adapter(tmp_path / "lora", base, rank=4, seed=3, targets=["q_proj", "k_proj", "v_proj",
                                                                                  "o_proj"])
    eng = make_engine(base, lora_adapters={"ad": str(adapter)}, max_num_batched_tokens=8)
    ids = rand_ids(15, seed=6)
    with_ad = scoring(0)
    with_ad.adapter = AdapterRef("ad")
    got = eng.generate([ids, ids], [with_ad, scoring(0)], check=True)
    assert_rows(got[0].input_token_logprobs, ids, 0, peft_scores(base, adapter, ids, 0))
    assert_rows(got[1].input_token_logprobs, ids, 0, hf_scores(base, ids, 0))


def test_classifier(tmp_path: Path) -> None:
    """GptOssForSequenceClassification: the pooled row's scores within 1e-4 of transformers', chunked."""
    from protocol.sampling import PoolingParams, SamplingParams
    from tests.helpers.tiny_classifiers import reference_scores
    from tests.helpers.tiny_gpt_oss import build_gpt_oss

    path = build_gpt_oss(tmp_path / "cls", seed=5, num_labels=3)
    eng = make_engine(path, max_num_batched_tokens=5)
    prompts = [rand_ids(n, seed=n) for n in (3, 21)]
    for ids, out in zip(prompts, eng.generate(prompts, SamplingParams(max_tokens=0, pooling=PoolingParams()),
                                               check=True), strict=True):
        want = reference_scores(path, ids)
        assert out.pooled is not None and max(abs(a - b) for a, b in zip(out.pooled, want, strict=True)) <= 1e-4


def test_batch_invariant_mode_refused_naming_the_fields() -> None:
    with pytest.raises(ValueError, match="batch_invariant is not available for GptOssForCausalLM") as err:
        make_engine(gpt_oss_path(), batch_invariant=True)
    for field in ("sinks", "sliding_window", "num_experts"):
        assert field in str(err.value)


def test_unknown_layer_type_refused(tmp_path: Path) -> None:
    other = tmp_path / "odd"
    shutil.copytree(gpt_oss_path(), other)
    cfg = json.loads((other / "config.json").read_text())
    cfg["layer_types"] = ["sliding_attention", "linear_attention", "full_attention"]
    (other / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match=r"layer_types\[1\]"):
        make_engine(other)
