"""lm-evaluation-harness, unmodified, against rayscore: its `local-completions` backend (OpenAI legacy
completions, echo + logprobs) over a served app, and its `hf` backend on the same model, compared.

The task is written here (a local JSON dataset and a task YAML), so nothing touches the hub. Each
lm-eval run is its own process, started with its CLI. tests/e2e/test_lm_eval.py asserts the agreement on a
small task; this script times a bigger one against a running server (e.g. `make serve`):
    python -m bench lm_eval_compare --questions 300 --base-url http://127.0.0.1:8000
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TASK = "rayscore_mc"
MODEL = "smollm2-135m-instruct"
LM_EVAL_TIMEOUT_S = 900


def questions(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """Four-way multiple choice: sums and comparisons, with a few lengths of context."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randrange(2, 60), rng.randrange(2, 60)
        if i % 2:
            right = a + b
            wrong = rng.sample([x for x in range(right - 9, right + 10) if x not in (right, 0)], 3)
            question = f"What is {a} plus {b}?"
        else:
            words = rng.sample(["apple", "river", "mountain", "teacher", "window", "garden", "planet", "violin",
                                "bridge", "candle", "forest", "rocket"], 4)
            right, wrong = words[0], words[1:]
            question = f"Which word names something that grows in an orchard: {', '.join(sorted(words))}?"
        choices = [str(x) for x in [*wrong, right]]
        rng.shuffle(choices)
        out.append({"question": question, "choices": choices, "answer": choices.index(str(right))})
    return out


def write_task(folder: Path, n: int) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    data = folder / "data.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in questions(n)))
    (folder / f"{TASK}.yaml").write_text(
        f"task: {TASK}\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "Question: {{question}}\\nAnswer:"\n'
        'doc_to_choice: "{{choices}}"\n'
        "doc_to_target: answer\n"
        "metric_list:\n"
        "  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
        "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n")
    return folder


def run_lm_eval(model: str, model_args: str, task_dir: Path, out_dir: Path, batch_size: int = 1,
                timeout_s: float = LM_EVAL_TIMEOUT_S) -> dict[str, Any]:
    """One `lm-eval run` with --log_samples, offline: its outputs (`read_run`), its log and wall time."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_CACHE": str(out_dir / "datasets"), "TOKENIZERS_PARALLELISM": "false"}
    cmd = [sys.executable, "-m", "lm_eval", "run", "--model", model, "--model_args", model_args,
           "--tasks", TASK, "--include_path", str(task_dir), "--batch_size", str(batch_size),
           "--output_path", str(out_dir), "--log_samples"]
    if model == "hf":
        cmd += ["--device", "cpu"]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-4000:]
    return {**read_run(out_dir), "wall_s": wall, "log": proc.stderr}


def read_run(out_dir: Path) -> dict[str, Any]:
    """A finished run's metrics, and per request (doc_id, choice) its (loglikelihood, is_greedy)."""
    (results_file,) = out_dir.glob("*/results_*.json")
    (samples_file,) = out_dir.glob(f"*/samples_{TASK}_*.jsonl")
    metrics = json.loads(results_file.read_text())["results"][TASK]
    requests: dict[tuple[int, int], tuple[float, bool]] = {}
    for line in samples_file.read_text().splitlines():
        sample = json.loads(line)
        for choice, ((ll, greedy),) in enumerate(sample["resps"]):
            requests[(sample["doc_id"], choice)] = (float(ll), greedy == "True")
    return {"metrics": metrics, "requests": requests}


def hf_args(model_path: Path) -> str:
    return f"pretrained={model_path},dtype=float32"


def rayscore_args(base_url: str, tokenizer: Path | None = None, num_concurrent: int = 1) -> str:
    """local-completions against rayscore: the remote tokenizer (/tokenize, /tokenizer_info) unless a
    local tokenizer folder is given."""
    tok = f"tokenizer_backend=huggingface,tokenizer={tokenizer}" if tokenizer else "tokenizer_backend=remote"
    return (f"model={MODEL},base_url={base_url}/v1/completions,{tok},tokenized_requests=True,"
            f"num_concurrent={num_concurrent},max_retries=1")


def sglang_args(generate_url: str, tokenizer: Path) -> str:
    """sglang-generate against rayscore's /generate in SGLang's dialect (a local tokenizer: the backend sends ids)."""
    return (f"model={MODEL},base_url={generate_url},tokenizer_backend=huggingface,tokenizer={tokenizer},"
            "tokenized_requests=True,max_retries=1")


def compare(ours: dict[str, Any], ref: dict[str, Any]) -> dict[str, Any]:
    """Agreement of two runs: metric values, loglikelihoods (max |difference|), is_greedy flags."""
    assert ours["requests"].keys() == ref["requests"].keys()
    diffs = [abs(ours["requests"][k][0] - ref["requests"][k][0]) for k in ref["requests"]]
    greedy_same = sum(ours["requests"][k][1] == ref["requests"][k][1] for k in ref["requests"])
    return {
        "requests": len(diffs),
        "max_abs_loglikelihood_diff": max(diffs),
        "is_greedy_agree": f"{greedy_same}/{len(diffs)}",
        "acc": (ours["metrics"]["acc,none"], ref["metrics"]["acc,none"]),
        "acc_norm": (ours["metrics"]["acc_norm,none"], ref["metrics"]["acc_norm,none"]),
    }


# --- the timing script -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="lm-eval through rayscore vs lm-eval's hf backend.")
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="a running rayscore (make serve)")
    parser.add_argument("--questions", type=int, default=300)
    parser.add_argument("--out", default="/tmp/rayscore-lm-eval")
    parser.add_argument("--batch-size", type=int, default=8, help="local-completions prompts per request")
    parser.add_argument("--hf-batch-size", type=int, default=None,
                        help="lm-eval's --batch_size for its hf backend (default: --batch-size, the same batches)")
    parser.add_argument("--num-concurrent", type=int, default=1)
    parser.add_argument("--tokenizer", choices=["remote", "local"], default="local")
    args = parser.parse_args(argv)
    from engine.loading.default_model import ensure_default_model

    model_path = ensure_default_model()
    out = Path(args.out) / time.strftime("%Y%m%d-%H%M%S")
    task_dir = write_task(out / "task", args.questions)
    ours = run_lm_eval("local-completions", rayscore_args(args.base_url, model_path if args.tokenizer == "local"
                                                            else None, args.num_concurrent),
                       task_dir, out / "rayscore", batch_size=args.batch_size)
    hf_batch = args.batch_size if args.hf_batch_size is None else args.hf_batch_size
    ref = run_lm_eval("hf", hf_args(model_path), task_dir, out / "hf", batch_size=hf_batch)
    report = {"questions": args.questions, "rayscore_wall_s": round(ours["wall_s"], 1),
              "hf_wall_s": round(ref["wall_s"], 1), **compare(ours, ref),
              "rayscore_args": rayscore_args(args.base_url, model_path if args.tokenizer == "local" else None,
                                             args.num_concurrent), "batch_size": args.batch_size,
              "hf_batch_size": hf_batch}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
