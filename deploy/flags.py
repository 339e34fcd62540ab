"""AppConfig's fields as command-line flags (`rayscore serve` and `rayscore config`): one declaration per setting, the
field in deploy/config.py, and its flag derived from it. A flag takes vLLM's name where vLLM has the setting
(`--served-model-name`, `--enable-prefix-caching`, `--api-key`, `--lora-modules`, `--enable-expert-parallel`;
`--tensor-parallel-size`, `--max-model-len`, `--dtype`, ... are already named alike), else the field's name with
dashes. Only the flags given reach `args:`, so every other field keeps AppConfig's default, as in a Serve YAML that
leaves it out."""

from __future__ import annotations

import argparse
import json
import types
import typing
from typing import Any, Literal, get_args, get_origin

from pydantic import SecretStr

from deploy.config import AppConfig

# field -> vLLM's flag (without dashes) for the same setting.
VLLM_NAMES: dict[str, str] = {
    "model_name": "served-model-name",
    "enable_prefix_cache": "enable-prefix-caching",
    "api_keys": "api-key",
    "admin_api_keys": "admin-api-key",
    "lora_adapters": "lora-modules",
    "expert_parallel": "enable-expert-parallel",
}
# The model is `rayscore serve MODEL`'s positional argument, not a flag.
POSITIONAL = "model"


def flag_of(field: str) -> str:
    return "--" + VLLM_NAMES.get(field, field.replace("_", "-"))


def _plain(annotation: Any) -> Any:
    """`int | None` -> int: the type a value on the command line is read as."""
    if get_origin(annotation) in (types.UnionType, typing.Union):
        inner = [a for a in get_args(annotation) if a is not type(None)]
        return inner[0] if len(inner) == 1 else annotation
    return annotation


def _name_path(text: str) -> tuple[str, str]:
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=PATH, got {text[:80]!r}")
    return name, path


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise argparse.ArgumentTypeError(f"expected JSON ({e.msg}), got {text[:80]!r}") from None


def add_config_flags(parser: argparse.ArgumentParser) -> None:
    """One flag per AppConfig field but the model; absent unless given (argparse.SUPPRESS)."""
    for name, field in AppConfig.model_fields.items():
        if name == POSITIONAL:
            continue
        kind = _plain(field.annotation)
        help_text = (field.description or "").replace("%", "%%") + f" [args: {name}]"
        common: dict[str, Any] = {"dest": name, "default": argparse.SUPPRESS, "help": help_text}
        if kind is bool:
            parser.add_argument(flag_of(name), action=argparse.BooleanOptionalAction, **common)
        elif get_origin(kind) is Literal:
            parser.add_argument(flag_of(name), choices=get_args(kind), **common)
        elif kind in (int, float, str):
            parser.add_argument(flag_of(name), type=kind, metavar=name.upper(), **common)
        elif get_origin(kind) is list and get_args(kind) == (SecretStr,):  # repeated, as vLLM's --api-key
            parser.add_argument(flag_of(name), action="append", metavar="KEY", **common)
        elif name == "lora_adapters":  # vLLM's --lora-modules NAME=PATH [NAME=PATH ...]
            parser.add_argument(flag_of(name), nargs="+", type=_name_path, metavar="NAME=PATH", **common)
        elif get_origin(kind) in (dict, list):
            parser.add_argument(flag_of(name), type=_json, metavar="JSON", **common)
        else:  # a new field of a type this file does not read: fail at once, in the tests, not at a user's prompt
            raise TypeError(f"AppConfig field {name!r} has a type the command line cannot take: {field.annotation}")


def config_args(ns: argparse.Namespace) -> dict[str, Any]:
    """The `args:` the given flags make, in AppConfig's field order."""
    given = vars(ns)
    out: dict[str, Any] = {}
    for name in AppConfig.model_fields:
        if name == POSITIONAL or name not in given:
            continue
        value = given[name]
        out[name] = dict(value) if name == "lora_adapters" else value
    return out
