"""The deploy edge's config (no Ray): every Serve YAML validates, the engine's fields and defaults come from
EngineConfig itself, and a bad engine value is refused when the YAML is read, with the engine's message."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deploy.config import AppConfig, check_user_configs
from engine.config import EngineConfig


@pytest.mark.parametrize("path", sorted(Path("configs").glob("*.yaml")))
def test_every_config_file_builds_a_valid_engine_config(path):
    for app in yaml.safe_load(path.read_text())["applications"]:
        EngineConfig(**AppConfig.model_validate(app["args"]).engine_config())


def test_engine_defaults_are_the_engine_configs():
    engine = AppConfig(worker_num_gpus=1).engine_config()  # on a GPU worker, threads stay torch's default
    assert engine == dataclasses.asdict(EngineConfig())
    assert AppConfig().engine_config()["num_threads"] == 1  # a 1-CPU worker: its CPU count


def test_every_engine_field_can_be_set_and_is_described():
    schema = AppConfig.model_json_schema()["properties"]
    for f in dataclasses.fields(EngineConfig):
        name = "kv_cache_mb" if f.name == "kv_cache_bytes" else f.name
        assert schema[name]["description"], name
    assert AppConfig(kv_cache_mb=3, num_kv_blocks=7).engine_config()["kv_cache_bytes"] == 3 * 2**20


def test_each_application_sets_its_own_head_dtype():
    """vLLM's hf_overrides head_dtype as an `args:` field: one application's bfloat16 teacher projects its head in
    float32 while another's keeps its own."""
    apps = [{"dtype": "bfloat16", "head_dtype": "float32"}, {"dtype": "bfloat16"}]
    configs = [EngineConfig(**AppConfig.model_validate(args).engine_config()) for args in apps]
    assert [c.float32_head for c in configs] == [True, False]


@pytest.mark.parametrize("args, words", [
    ({"block_size": 0}, "block_size must be positive"),
    ({"max_model_len": 0}, "max_model_len must be positive"),
    ({"dtype": "int8"}, "dtype"),
    ({"kv_cache_mb": 0}, "kv_cache_mb"),
    ({"head_dtype": "float16"}, "head_dtype"),
    ({"dtype": "bfloat16", "head_dtype": "float32", "batch_invariant": True}, "not available with batch_invariant"),
    ({"http_port": 8000}, "http_port"),  # no HTTP fields: `serve run` takes them from the YAML's http_options
])
def test_bad_args_are_refused_when_read(args, words):
    with pytest.raises(ValidationError) as e:
        AppConfig.model_validate(args)
    assert words in str(e.value)


@pytest.mark.parametrize("deployments, words", [
    ([{"name": "EngineWorker", "user_config": {"max_num_seqs": 8}}],
     "`max_num_seqs` is not a runtime setting of the worker; these are: max_num_batched_tokens"),
    ([{"name": "EngineWorker", "user_config": {"max_queued_tokens": 0}}], "max_queued_tokens must be positive"),
    ([{"name": "Ingress", "user_config": {"max_top_logprobs": 3}}], "set it in the EngineWorker deployment's"),
    ([{"name": "Ingress", "user_config": {"model": "x"}}], "`model` is not a runtime setting of the ingress"),
])
def test_a_user_config_replicas_would_refuse_is_refused_when_read(deployments, words):
    app = {"args": {"batch_invariant": False}, "deployments": deployments}
    with pytest.raises(ValueError, match=words):
        check_user_configs(app)


def test_runtime_user_configs_pass_the_check():
    check_user_configs({"args": {}, "deployments": [
        {"name": "Ingress", "user_config": {"max_batch_items": 64}},
        {"name": "EngineWorker", "num_replicas": 2, "user_config": {"max_top_logprobs": 5, "pause_timeout_s": 9}}]})
