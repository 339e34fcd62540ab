"""`rayscore` (deploy/cli.py): every AppConfig field is a flag, named as vLLM names the setting where vLLM has it; the
flags given, and only those, become the application's `args:`; a refused value is a usage error naming its flag; the
printed config is one Serve and AppConfig accept; a hub id resolves from the local Hugging Face cache only."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
import yaml
from ray.serve.schema import ServeDeploySchema

from deploy.cli import build, main
from deploy.config import AppConfig
from deploy.flags import VLLM_NAMES, flag_of
from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from engine.loading.default_model import resolve_model_path
from engine.loading.hub_cache import looks_like_hub_id
from protocol.sampling import SamplingParams
from tests.helpers.reference import hf_scores

ROOT = Path(__file__).resolve().parents[2]


def config_of(*argv: str) -> dict:
    config, _ = build(list(argv), "rayscore config")
    return config


def test_every_field_but_the_model_is_a_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["config", "--help"])
    assert done.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help at the terminal's width
    for name in AppConfig.model_fields:
        if name != "model":
            assert re.search(re.escape(flag_of(name)) + "[ ,]", text) and f"[args: {name}]" in text, name


def test_vllm_names_and_only_the_given_flags_reach_args() -> None:
    config = config_of("/ckpt", "--served-model-name", "teacher", "--tensor-parallel-size", "2", "--max-model-len",
                       "4096", "--dtype", "bfloat16", "--no-enable-prefix-caching", "--api-key", "k1", "--api-key",
                       "k2", "--lora-modules", "a=/lora/a", "b=/lora/b", "--max-num-seqs", "32", "--kv-cache-mb", "128",
                       "--enable-expert-parallel")
    args = config["applications"][0]["args"]
    assert args == {"model": "/ckpt", "dtype": "bfloat16", "max_num_seqs": 32, "enable_prefix_cache": False,
                    "max_model_len": 4096, "tensor_parallel_size": 2, "lora_adapters": {"a": "/lora/a", "b": "/lora/b"},
                    "model_name": "teacher", "kv_cache_mb": 128, "api_keys": ["k1", "k2"], "expert_parallel": True}
    cfg = AppConfig.model_validate(args)
    assert cfg.engine_config()["max_model_len"] == 4096 and not cfg.enable_prefix_cache
    assert {flag_of(f) for f in VLLM_NAMES} == {"--served-model-name", "--enable-prefix-caching", "--api-key",
                                                "--admin-api-key", "--lora-modules", "--enable-expert-parallel"}


def test_the_printed_config_is_servable(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["config", "smollm2-135m-instruct", "--port", "8011", "--autoscale", "1:3", "--num-threads", "2"]) == 0
    config = yaml.safe_load(capsys.readouterr().out)
    schema = ServeDeploySchema.model_validate(config)
    assert schema.http_options.port == 8011 and schema.http_options.host == "127.0.0.1"
    assert config["proxy_location"] == "HeadOnly"  # loopback: one proxy, as configs/local.yaml
    cfg = AppConfig.model_validate(schema.applications[0].args)
    assert cfg.worker_autoscaling["min_replicas"] == 1 and cfg.worker_autoscaling["max_replicas"] == 3
    assert cfg.worker_autoscaling["policy"]["policy_function"] == "workers.autoscaling:TokenLoadPolicy"
    assert config_of("m", "--host", "0.0.0.0")["proxy_location"] == "EveryNode"


def test_a_config_file_is_the_base_the_flags_update() -> None:
    config = config_of("/other", "--config", str(ROOT / "configs/local.yaml"), "--port", "9001", "--max-num-seqs", "8")
    local = yaml.safe_load((ROOT / "configs/local.yaml").read_text())
    args = config["applications"][0]["args"]
    assert args == {**local["applications"][0]["args"], "model": "/other", "max_num_seqs": 8}
    assert config["http_options"] == {**local["http_options"], "port": 9001}


@pytest.mark.parametrize(("argv", "says"), [
    (["m", "--max-num-seqs", "0"], "max_num_seqs must be positive"),
    (["m", "--tensor-parallel-size", "two"], "--tensor-parallel-size: invalid int value"),
    (["m", "--dtype", "fp8"], "--dtype: invalid choice"),
    (["m", "--lora-modules", "nopath"], "--lora-modules: expected NAME=PATH"),
    (["m", "--worker-autoscaling", "{min"], "--worker-autoscaling: expected JSON"),
    (["m", "--autoscale", "3:1"], "--autoscale: expected MIN:MAX"),
    (["m", "--autoscale", "1:2", "--num-workers", "2"], "--autoscale replaces --num-workers"),
    (["m", "--kv-cache-mb", "0"], "--kv-cache-mb [args: kv_cache_mb]"),
    (["m", "--bogus"], "unrecognized arguments: --bogus"),
])
def test_a_refused_value_names_its_flag(argv: list[str], says: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        build(argv, "rayscore config")
    assert done.value.code == 2
    assert says in capsys.readouterr().err


def test_unknown_command_and_aliases(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nope"]) == 2
    assert "unknown command 'nope'" in capsys.readouterr().err
    for command in ("score", "batch"):  # the older tools, as subcommands
        with pytest.raises(SystemExit) as done:
            main([command, "--help"])
        assert done.value.code == 0
    assert "rayscore-batch INPUT OUTPUT" in capsys.readouterr().out


def _into_hub_cache(checkpoint: Path, cache: Path, repo_id: str) -> Path:
    """`checkpoint` laid out as huggingface_hub's cache holds a download of `repo_id` (refs/main -> snapshot)."""
    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    shutil.copytree(checkpoint, repo / "snapshots" / commit)
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    return repo / "snapshots" / commit


def test_a_hub_id_serves_the_local_cache_snapshot(tiny_models: dict[str, Path], tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    snapshot = _into_hub_cache(tiny_models["llama"], tmp_path, "tiny-org/tiny-llama")
    assert looks_like_hub_id("tiny-org/tiny-llama") and not looks_like_hub_id("./a/b")
    assert resolve_model_path("tiny-org/tiny-llama").resolve() == snapshot.resolve()
    engine = LLMEngine(EngineConfig(model="tiny-org/tiny-llama", kv_cache_bytes=8 * 2**20))
    ids = [5, 9, 2, 31, 7, 12, 40, 3]
    out = engine.generate([ids], SamplingParams(max_tokens=0, return_logprob=True, logprob_start_len=1))[0]
    got = [v for v, _ in out.input_token_logprobs]
    want = hf_scores(snapshot, ids, 1)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1e-4
    with pytest.raises(FileNotFoundError, match="not in the local Hugging Face cache"):
        resolve_model_path("tiny-org/absent")


def test_serve_refuses_an_absent_model_before_starting_anything(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(SystemExit) as done:
        main(["serve", "nobody/nothing", "--port", "8011"])
    assert "rayscore serve: model 'nobody/nothing' is not in the local Hugging Face cache" in str(done.value.code)
