"""The messages of LoRA adapter selection on a request, written once (ingress/adapters/select.py and /generate's
`adapter` / SGLang's `lora_path` raise them)."""

from __future__ import annotations

UNKNOWN_ADAPTER = ("The {param} {name!r} names no loaded LoRA adapter; loaded: {loaded} (POST /load_lora_adapter "
                   "loads one).")
ADAPTER_TWICE = "Send the adapter in `adapter` or in SGLang's `lora_path`, not both."
UNKNOWN_MODEL = ("The model `{model}` does not exist: this server serves `{served}` and the LoRA adapters {loaded} "
                 "(GET /v1/models).")
