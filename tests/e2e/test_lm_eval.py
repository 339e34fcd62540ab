"""lm-evaluation-harness, unmodified, against rayscore: its `local-completions` backend (OpenAI legacy
completions, echo + logprobs) over the served app must give exactly what its `hf` backend gives on the
same model: the same accuracy, and every request's loglikelihood within 1e-4 (float32). The task and the
runs are checks/lm_eval_compare.py's (also a script, for timings on a bigger task)."""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
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
def runs(url: str, task_dir: Path, smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory):
    """The module's three lm-eval runs, two at a time (a process's start-up, most of its time, is one core's work,
    and a served run mostly waits on the server; three at once on two cores only slow each other): lm-eval's `hf`
    backend on the task, the one reference both served runs are compared with, beside its `local-completions`
    backend against the app, then its `sglang-generate` backend as soon as one of them ends."""
    out = tmp_path_factory.mktemp("lm_eval_runs")
    with ThreadPoolExecutor(2) as pool:
        yield {
            "hf": pool.submit(run_lm_eval, "hf", hf_args(smollm2_path), task_dir, out / "hf"),
            "local-completions": pool.submit(run_lm_eval, "local-completions", rayscore_args(url), task_dir,
                                             out / "completions", batch_size=4),
            "sglang-generate": pool.submit(run_lm_eval, "sglang-generate",
                                           sglang_args(url + "/generate", smollm2_path), task_dir, out / "sglang",
                                           batch_size=4),
        }


def test_lm_eval_local_completions_equals_its_hf_backend(runs: dict[str, Future]) -> None:
    ours, ref = runs["local-completions"].result(), runs["hf"].result()
    assert "remote tokenizer" in ours["log"].lower()
    agreement = compare(ours, ref)
    print(f"lm-eval wall time: rayscore {ours['wall_s']:.1f} s, hf {ref['wall_s']:.1f} s; {agreement}")
    assert agreement["requests"] == QUESTIONS * 4
    assert agreement["max_abs_loglikelihood_diff"] <= ATOL
    assert agreement["acc"][0] == agreement["acc"][1] and agreement["acc_norm"][0] == agreement["acc_norm"][1]
    assert agreement["is_greedy_agree"] == f"{QUESTIONS * 4}/{QUESTIONS * 4}"


def test_lm_eval_sglang_generate_equals_its_hf_backend(runs: dict[str, Future]) -> None:
    """lm-eval's `sglang-generate` backend, unmodified: SGLang's dialect of /generate (a batch of id lists,
    max_new_tokens 1, logprob_start_len 0, top-1), parsed by lm-eval's own indexing of input_token_logprobs. Its
    is_greedy is not compared: sglang-generate computes it as `token != top token` for every row, the opposite of hf."""
    ours, ref = runs["sglang-generate"].result(), runs["hf"].result()
    agreement = compare(ours, ref)
    print(f"lm-eval sglang-generate wall time: rayscore {ours['wall_s']:.1f} s, hf {ref['wall_s']:.1f} s; {agreement}")
    assert agreement["requests"] == QUESTIONS * 4
    assert agreement["max_abs_loglikelihood_diff"] <= ATOL
    assert agreement["acc"][0] == agreement["acc"][1] and agreement["acc_norm"][0] == agreement["acc_norm"][1]
