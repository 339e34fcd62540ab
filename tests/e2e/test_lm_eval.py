"""lm-evaluation-harness, unmodified, against rayscore: its `local-completions` backend (OpenAI legacy
completions, echo + logprobs) over the served app must give exactly what its `hf` backend gives on the
same model: the same accuracy, and every request's loglikelihood within 1e-4 (float32). The task and the
runs are checks/lm_eval_compare.py's (also a script, for timings on a bigger task)."""

from __future__ import annotations

from pathlib import Path

import pytest

from checks.lm_eval_compare import compare, hf_args, rayscore_args, run_lm_eval, sglang_args, write_task

ATOL = 1e-4
QUESTIONS = 20  # 80 loglikelihood requests per backend (an lm-eval process's start-up is most of its time)

# --- the test --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def url(serve_url: str) -> str:
    """The session's shared one-worker app (tests/helpers/serve.py): this module only sends requests to it."""
    from tests.helpers.serve import shared_app

    return shared_app(serve_url, num_workers=1)


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("lm_eval")
    return write_task(tmp_path_factory.mktemp("lm_eval") / "task", QUESTIONS)


@pytest.fixture(scope="module")
def ref(task_dir: Path, smollm2_path: Path) -> dict:
    """lm-eval's `hf` backend on the task: the one reference both backends' runs are compared with (run once)."""
    return run_lm_eval("hf", hf_args(smollm2_path), task_dir, task_dir.parent / "hf")


def test_lm_eval_local_completions_equals_its_hf_backend(url: str, task_dir: Path, ref: dict, tmp_path: Path) -> None:
    ours = run_lm_eval("local-completions", rayscore_args(url), task_dir, tmp_path / "rayscore", batch_size=4)
    assert "remote tokenizer" in ours["log"].lower()
    agreement = compare(ours, ref)
    print(f"lm-eval wall time: rayscore {ours['wall_s']:.1f} s, hf {ref['wall_s']:.1f} s; {agreement}")
    assert agreement["requests"] == QUESTIONS * 4
    assert agreement["max_abs_loglikelihood_diff"] <= ATOL
    assert agreement["acc"][0] == agreement["acc"][1] and agreement["acc_norm"][0] == agreement["acc_norm"][1]
    assert agreement["is_greedy_agree"] == f"{QUESTIONS * 4}/{QUESTIONS * 4}"


def test_lm_eval_sglang_generate_equals_its_hf_backend(url: str, smollm2_path: Path, task_dir: Path, ref: dict,
                                                      tmp_path: Path) -> None:
    """lm-eval's `sglang-generate` backend, unmodified: SGLang's dialect of /generate (a batch of id lists,
    max_new_tokens 1, logprob_start_len 0, top-1), parsed by lm-eval's own indexing of input_token_logprobs. Its
    is_greedy is not compared: sglang-generate computes it as `token != top token` for every row, the opposite of hf."""
    ours = run_lm_eval("sglang-generate", sglang_args(url + "/generate", smollm2_path), task_dir,
                       tmp_path / "rayscore", batch_size=4)
    agreement = compare(ours, ref)
    print(f"lm-eval sglang-generate wall time: rayscore {ours['wall_s']:.1f} s, hf {ref['wall_s']:.1f} s; {agreement}")
    assert agreement["requests"] == QUESTIONS * 4
    assert agreement["max_abs_loglikelihood_diff"] <= ATOL
    assert agreement["acc"][0] == agreement["acc"][1] and agreement["acc_norm"][0] == agreement["acc_norm"][1]
