"""The deploy edge's config (no Ray): every Serve YAML validates, the engine's fields and defaults come from
EngineConfig itself, and a bad engine value is refused when the YAML is read, with the engine's message."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from deploy.config import AppConfig
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


@pytest.mark.parametrize("args, words", [
    ({"block_size": 0}, "block_size must be positive"),
    ({"max_model_len": 0}, "max_model_len must be positive"),
    ({"dtype": "int8"}, "dtype"),
    ({"kv_cache_mb": 0}, "kv_cache_mb"),
    ({"http_port": 8000}, "http_port"),  # no HTTP fields: `serve run` takes them from the YAML's http_options
])
def test_bad_args_are_refused_when_read(args, words):
    with pytest.raises(ValidationError) as e:
        AppConfig.model_validate(args)
    assert words in str(e.value)
