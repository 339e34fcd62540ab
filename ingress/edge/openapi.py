"""The error answers each route documents: every status the app can send, with the body it sends.

One table, so that the OpenAPI document says what the code does (tests/ingress/test_openapi_fuzz.py runs
schemathesis against it): which errors a route can answer depends only on whether it takes a body, runs
worker requests and names a model. 499 (the client left) is not listed: nobody is there to read it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

RETRY_AFTER = {"Retry-After": {"description": "Seconds to wait before trying again; sent when a queue was full.",
                               "schema": {"type": "integer"}}}


def error_responses(schema: type[BaseModel], *, body: bool = False, generates: bool = False,
                    names_model: bool = False, own_422: bool = True) -> dict[int | str, dict[str, Any]]:
    """FastAPI `responses` for a route's errors, each with `schema` (its API's error body). Without
    `own_422` a body's 422 is FastAPI's own (its `detail` list, which FastAPI documents itself)."""
    out: dict[int | str, dict[str, Any]] = {}
    if body:
        out[400] = {"model": schema, "description": "A value the rules reject, or a request over a limit "
                    "(`max_top_logprobs`, `max_logprob_entries`); the message names the rule or config field."}
    out[401] = {"model": schema, "description": "API keys are set and the request has no valid "
                "`Authorization: Bearer <key>`."}
    if names_model:
        out[404] = {"model": schema, "description": "`model` is not the served model."}
    out[413] = {"model": schema, "description": "The body is over `max_request_bytes`."}
    if body and own_422:
        out[422] = {"model": schema, "description": "A body of the wrong shape, or not JSON."}
    if generates:
        out[500] = {"model": schema, "description": "The engine failed before the answer started."}
    out[503] = {"model": schema, "headers": RETRY_AFTER,
                "description": "No worker could answer (none ready, or lost past `retry_deadline_s`), or a "
                "queue is full (then with `Retry-After`)."}
    out[504] = {"model": schema, "description": "The request took longer than `request_timeout_s`."}
    return out
