"""Qwen3.5 (dense and MoE), the hybrid of Gated DeltaNet and gated full attention, against transformers' float32
forward without cache: the delta rule's two forms and the conv against transformers' torch fallbacks from a carried
state; every row at several lengths and starts, prefilled in chunks smaller than the prompt (the state carried across
chunks and steps), batched with other requests, preempted and recomputed, with the prefix cache on; greedy tokens equal
to the argmax of full forwards; images (Qwen3_5ForConditionalGeneration); each part of the layer shown to move the
rows; refusals naming their field."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers.models.qwen3_5 import modeling_qwen3_5 as hf

from engine.layers.gated_delta import causal_conv1d, chunk_gated_delta_rule, recurrent_gated_delta_rule
from engine.layers.gated_delta_cuda import cuda_rules, fla_rules
from engine.loading.lora import LoraError
from protocol.sampling import PoolingParams, SamplingParams
from tests.helpers.engine import greedy, make_engine, rand_ids, scoring
from tests.helpers.families import ATOL, check_mixed_batch, check_scoring_any_chunking
from tests.helpers.reference import hf_logits, hf_model, hf_scores
from tests.helpers.tiny_classifiers import reference_scores
from tests.helpers.tiny_qwen3_5 import QWEN3_5_FAMILIES, build_qwen3_5_classifier, build_qwen3_5_vl, qwen3_5_path
from tests.helpers.tiny_vision import expand, image_input, random_image, text_ids
from tests.helpers.vision_reference import vl_scores


def _rule_inputs(b: int, length: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(b, length, 2, 16, generator=gen), torch.randn(b, length, 2, 16, generator=gen)
    v = torch.randn(b, length, 4, 8, generator=gen)
    g = -torch.rand(b, length, 4, generator=gen)
    beta = torch.rand(b, length, 4, generator=gen)
    return q, k, v, g, beta


@pytest.mark.parametrize("length", [1, 70])  # within one block of the chunked form; across two
def test_rules_equal_transformers_from_a_carried_state(length: int) -> None:
    q, k, v, g, beta = _rule_inputs(2, length, seed=length)
    state = torch.randn(2, 4, 16, 8, generator=torch.Generator().manual_seed(1))
    want, want_s = hf.torch_chunk_gated_delta_rule(q, k, v, g, beta, initial_state=state, output_final_state=True,
                                                   use_qk_l2norm_in_kernel=True)
    for rule in (chunk_gated_delta_rule, recurrent_gated_delta_rule):
        got, got_s = rule(q, k, v, g, beta, state)
        assert (got - want).abs().max() <= 1e-5 and (got_s - want_s).abs().max() <= 1e-5, rule.__name__


def test_rule_and_conv_split_anywhere_equal_whole() -> None:
    """A prompt cut in chunks (the state carried) equals it whole: the delta rule and the conv."""
    q, k, v, g, beta = _rule_inputs(1, 75, seed=3)
    whole, whole_s = chunk_gated_delta_rule(q, k, v, g, beta, None)
    x = torch.randn(1, 12, 75)
    w = torch.randn(12, 4)
    conv_whole = hf.causal_conv1d_fn(x, w, None, activation=None)
    parts, s, conv_parts, cs = [], None, [], torch.zeros(1, 12, 3)
    for lo, hi in ((0, 5), (5, 6), (6, 70), (70, 75)):
        o, s = chunk_gated_delta_rule(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], g[:, lo:hi], beta[:, lo:hi], s)
        parts.append(o)
        c, cs = causal_conv1d(x[:, :, lo:hi], cs, w)
        conv_parts.append(c)
    assert (torch.cat(parts, 1) - whole).abs().max() <= 1e-5 and (s - whole_s).abs().max() <= 1e-5
    assert (torch.cat(conv_parts, -1) - conv_whole).abs().max() <= 1e-6


# Budgets: one token a step (every chunk a one-token chunk after a context: the recurrent form, batched), chunks of
# 5 (the chunked form from a carried state), the whole prompt at once (from zeros).
@pytest.mark.parametrize(("family", "budgets"), [("qwen3_5", (1, 5, 1000)), ("qwen3_5-moe", (5, 1000))])
def test_scoring_any_chunking(family: str, budgets: tuple[int, ...]) -> None:
    """37 tokens from 0, 17 and the end (each chunk carries the state to the next)."""
    check_scoring_any_chunking(qwen3_5_path(family), budgets=budgets)


def test_mixed_batch() -> None:
    """Scoring and greedy requests of mixed lengths share steps: decodes batched in the recurrent form (the MoE
    block's batching is the shared one's: test_models_qwen3_moe.py)."""
    check_mixed_batch(qwen3_5_path("qwen3_5"), budgets=(3,))


def test_long_prompt_across_blocks_of_the_chunked_form() -> None:
    """150 tokens (three blocks of 64 in transformers' one call) in chunks of 50 and whole."""
    path = qwen3_5_path("qwen3_5")
    ids = rand_ids(150, seed=8)
    for budget in (50, 1000):
        out = make_engine(path, max_num_batched_tokens=budget).generate([ids], scoring(0), check=True)[0]
        diff = max(abs(v - e) for (v, _), e in zip(out.input_token_logprobs, hf_scores(path, ids, 0), strict=True))
        assert diff <= ATOL, (budget, diff)


def test_greedy_equals_argmax_of_full_forwards() -> None:
    """Tokens decoded together (the recurrent form over a batch) equal the argmax of transformers' uncached forward
    of the text so far; each token's logprob within ATOL of it."""
    path = qwen3_5_path("qwen3_5")
    prompts = [rand_ids(n, seed=100 + n) for n in (3, 11, 26)]
    outs = make_engine(path, max_num_batched_tokens=5).generate(prompts, greedy(8), check=True)
    for ids, out in zip(prompts, outs, strict=True):
        text = list(ids)
        for tok, (v, t) in zip(out.new_token_ids, out.output_token_logprobs, strict=True):
            lp = torch.log_softmax(hf_logits(path, text)[-1], -1)
            assert tok == t == int(lp.argmax())
            assert abs(v - lp[tok].item()) <= ATOL
            text.append(tok)


def test_preempted_requests_recompute_their_state() -> None:
    """Too few KV blocks for every request at once: the newest are preempted (their state slot freed) and recomputed
    from position 0; every row still exact, every slot back."""
    path = qwen3_5_path("qwen3_5")
    prompts = [rand_ids(n, seed=200 + n) for n in (30, 25, 28)]
    eng = make_engine(path, num_kv_blocks=16, max_num_batched_tokens=8)
    outs = eng.generate(prompts, [greedy(4)] * 3, check=True)
    assert eng.scheduler.num_preemptions > 0
    alone = make_engine(path).generate(prompts, greedy(4))
    for out, want in zip(outs, alone, strict=True):
        assert out.new_token_ids == want.new_token_ids
    assert eng.kv.states is not None and len(eng.kv.states.free) == eng.kv.states.running


def _shared_prefix_cases() -> list[tuple[list[int], int]]:
    """Two 22-token contexts, three endings each; rows from 0 or from inside the ending."""
    cases = []
    for c in range(2):
        ctx = rand_ids(22, seed=300 + c)
        cases += [(ctx + rand_ids(6, seed=400 + 10 * c + e), 21 if e else 0) for e in range(3)]
    return cases


@pytest.mark.parametrize("cfg", [
    {},  # snapshots every 8 tokens: a hit resumes at 16
    {"num_kv_blocks": 16},  # blocks (and their snapshots) evicted while others are planned
])
def test_prefix_cache_resumes_from_snapshots(cfg: dict) -> None:
    """Prompts sharing a prefix, twice, the prefix cache on: a hybrid's hit ends at its last kept snapshot, the
    request's state starts from it, and every row is still exact."""
    path = qwen3_5_path("qwen3_5")
    cases = _shared_prefix_cases()
    want = [hf_scores(path, ids, n) for ids, n in cases]
    eng = make_engine(path, enable_prefix_cache=True, max_num_batched_tokens=16, hybrid_state_interval=8, **cfg)
    for _ in range(2):
        outs = eng.generate([ids for ids, _ in cases], [scoring(n) for _, n in cases], check=True)
        for out, rows in zip(outs, want, strict=True):
            diff = max(abs(v - e) for (v, _), e in zip(out.input_token_logprobs, rows, strict=True))
            assert diff <= ATOL, diff
    hits = eng.stats().prefix_cache_hit_tokens
    if "num_kv_blocks" not in cfg:
        assert hits > 0
    assert eng.kv.pool.num_free == eng.kv.pool.num_blocks


def test_generation_after_a_snapshot_hit() -> None:
    """Greedy continuations of prompts sharing 17 tokens: the second request resumes at 16 from the snapshot and
    decodes the same tokens as alone in a fresh engine."""
    path = qwen3_5_path("qwen3_5")
    ctx = rand_ids(17, seed=500)
    prompts = [ctx + rand_ids(3, seed=501), ctx + rand_ids(5, seed=502)]
    eng = make_engine(path, enable_prefix_cache=True, hybrid_state_interval=8)
    first = eng.generate(prompts[:1], greedy(6), check=True)[0]
    second = eng.generate(prompts[1:], greedy(6), check=True)[0]
    assert second.cached_tokens == 16
    for ids, out in zip(prompts, (first, second), strict=True):
        assert out.new_token_ids == make_engine(path).generate([ids], greedy(6))[0].new_token_ids


# Each part of a linear layer (and the attention's output gate), zeroed in transformers' model: the rows move.
PARTS = ["linear_attn.conv1d", "linear_attn.A_log", "linear_attn.dt_bias", "linear_attn.in_proj_b",
         "linear_attn.in_proj_a", "linear_attn.in_proj_z", "linear_attn.norm", "self_attn.q_norm", "mlp.shared_expert"]


def test_every_part_moves_the_rows() -> None:
    ids = rand_ids(37, seed=4)
    for family in QWEN3_5_FAMILIES:
        model = hf_model(str(qwen3_5_path(family)))
        base = hf_logits(qwen3_5_path(family), ids)
        # The MoE checkpoint's linear layers are the dense one's code: its own part alone.
        for part in PARTS if family == "qwen3_5" else PARTS[-1:]:
            params = [p for n, p in model.named_parameters() if f".{part}." in n or n.endswith(f".{part}")]
            if not params:  # the dense model has no shared expert
                assert part == "mlp.shared_expert" and family == "qwen3_5"
                continue
            saved = [p.detach().clone() for p in params]
            with torch.no_grad():
                for p in params:
                    p.zero_()
            try:
                moved = (hf_logits(qwen3_5_path(family), ids) - base).abs().max().item()
            finally:
                with torch.no_grad():
                    for p, s in zip(params, saved, strict=True):
                        p.copy_(s)
            assert moved >= 1e-2, (family, part, moved)


def test_batch_invariant_refused_naming_layer_types() -> None:
    with pytest.raises(ValueError, match=r"batch_invariant .*Gated DeltaNet.*layer_types"):
        make_engine(qwen3_5_path("qwen3_5"), batch_invariant=True)


def test_images_through_the_vision_path(tmp_path: Path) -> None:
    """Qwen3_5ForConditionalGeneration: an image's rows (Qwen3-VL's tower without DeepStack, interleaved M-RoPE over
    the partial rotary) within ATOL of transformers' forward, prefilled in chunks of 7 that cut the image's run; the
    image is seen (another one behind the same placeholders moves the rows)."""
    path = build_qwen3_5_vl(tmp_path / "vl", seed=3)
    images = [image_input("qwen3_vl", random_image(150, 100, 0))]
    ids = expand(text_ids(20, 0), images, [7])
    want = vl_scores(path, ids, images, 0)
    out = make_engine(path, max_num_batched_tokens=7).generate([ids], scoring(0), check=True, images=[images])[0]
    assert max(abs(v - e) for (v, _), e in zip(out.input_token_logprobs, want, strict=True)) <= ATOL
    other = [image_input("qwen3_vl", random_image(150, 100, 99))]
    assert max(abs(v - e) for v, e in zip(vl_scores(path, ids, other, 0), want, strict=True)) > 1e-3


def test_lora_refused_naming_the_field() -> None:
    """An adapter (at start from lora_adapters, or loaded later) asks the model for its targets: refused, a 400."""
    eng = make_engine(qwen3_5_path("qwen3_5"))
    with pytest.raises(LoraError, match="lora_adapters"):
        eng.model.lora_targets(1)


def test_fla_kernels_chosen_on_cuda_half_precision_only() -> None:
    """fla's rules serve CUDA half precision only (Triton's float32 dots are TF32); the torch reference elsewhere."""
    assert cuda_rules(torch.device("cpu"), torch.bfloat16) is None
    assert cuda_rules(torch.device("cuda"), torch.float32) is None


def test_fla_recurrent_kernel_equals_the_reference_in_triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Where fla-core is installed: its recurrent kernel, run by Triton's interpreter on CPU, equals the reference
    from a carried state (its chunked kernel autotunes on a device, which the interpreter has not)."""
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    pytest.importorskip("fla")
    rules = fla_rules()
    assert rules is not None
    q, k, v, g, beta = _rule_inputs(2, 1, seed=5)
    state = torch.randn(2, 4, 16, 8)
    got, got_s = rules[1](q, k, v, g, beta, state)
    want, want_s = recurrent_gated_delta_rule(q, k, v, g, beta, state)
    assert (got - want).abs().max() <= 1e-5 and (got_s - want_s).abs().max() <= 1e-5


def test_classifier_scores_as_transformers(tmp_path: Path) -> None:
    """Qwen3_5TextForSequenceClassification: the pooled row's raw scores, prefilled in chunks of 5, cold and warm."""
    path = build_qwen3_5_classifier(tmp_path / "cls", 3)
    eng = make_engine(path, enable_prefix_cache=True, hybrid_state_interval=8, max_num_batched_tokens=5)
    prompts = [rand_ids(n, seed=n) for n in (3, 21)]
    for _ in range(2):
        outs = eng.generate(prompts, SamplingParams(max_tokens=0, pooling=PoolingParams()), check=True)
        for ids, out in zip(prompts, outs, strict=True):
            want = reference_scores(path, ids)
            assert max(abs(a - b) for a, b in zip(out.pooled, want, strict=True)) <= ATOL
