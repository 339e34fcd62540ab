"""schemathesis against the app's own OpenAPI document: every generated request must get an answer the
document describes (status, content type, body schema) and never a 5xx.

    run_fuzz(base_url, max_examples) -> (cases, failures)     the reliability script, against a live server
    fuzz_schema(schema, max_examples) -> FuzzReport           tests/ingress/test_openapi_fuzz.py, in-process (ASGI)

Each operation gets `max_examples` schema-conforming cases and as many that break the schema (negative), with
a fixed seed, so a run is repeatable. A failing case is counted and described, and the run goes on: the
figure is how many of the cases failed, not the first failure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# The checks docs/operating.md's Reliability names; a 5xx is a failure even where documented (a 503 needs no worker
# here: the fake backend always answers, and a live server under fuzzing has its workers).
CHECK_NAMES = ("not_a_server_error", "status_code_conformance", "response_schema_conformance",
               "content_type_conformance")


@dataclass
class FuzzReport:
    cases: int = 0
    failures: list[str] = field(default_factory=list)  # "<operation>: <what failed>", one per failing case


def _checks() -> list[Any]:
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import (
        content_type_conformance,
        response_schema_conformance,
        status_code_conformance,
    )

    return [not_a_server_error, status_code_conformance, response_schema_conformance, content_type_conformance]


def fuzz_schema(schema: Any, max_examples: int, headers: dict[str, str] | None = None,
                seed: int = 1234) -> FuzzReport:
    """Run every operation of a loaded schemathesis schema (`schemathesis.openapi.from_asgi/from_url`)."""
    from hypothesis.errors import Unsatisfiable
    from schemathesis import GenerationMode

    report = FuzzReport()
    for result in schema.get_all_operations():
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            try:
                _fuzz_operation(result.ok(), mode, max_examples, headers, seed, report)
            except Unsatisfiable:
                pass  # nothing to break in an operation without parameters or body (GET /v1/models)
    return report


def _fuzz_operation(operation: Any, mode: Any, max_examples: int, headers: dict[str, str] | None, seed: int,
                    report: FuzzReport) -> None:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed

    checks = _checks()

    @fixed_seed(seed)
    @settings(max_examples=max_examples, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        report.cases += 1
        try:
            case.call_and_validate(headers=headers, checks=checks)
        # schemathesis raises a group of check failures (a BaseExceptionGroup), or one failure; a transport
        # error is a failure too. Each is counted and the run goes on.
        except BaseException as exc:
            if not isinstance(exc, Exception) and not hasattr(exc, "exceptions"):
                raise  # KeyboardInterrupt, SystemExit
            report.failures.append(f"{operation.label} [{mode.value}]: {_describe(exc)}")

    one()


def run_fuzz(base_url: str, max_examples: int, api_key: str | None = None) -> tuple[int, int]:
    """Fuzz the live server at `base_url` (its /openapi.json); returns (cases, failures) and prints each
    failure. `api_key` is sent as a bearer key when the server has keys."""
    import schemathesis

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
    # With keys, the description itself needs the key (only /health is open).
    schema = schemathesis.openapi.from_url(base_url.rstrip("/") + "/openapi.json", headers=headers or {})
    schema.config.update(base_url=base_url.rstrip("/"))
    report = fuzz_schema(schema, max_examples, headers=headers)
    for failure in report.failures:
        print("fuzz failure:", failure)
    return report.cases, len(report.failures)


def _describe(exc: BaseException) -> str:
    """One line per failure: its title and the first lines of its message."""
    parts = getattr(exc, "exceptions", None) or (exc,)
    out = []
    for part in parts:
        title = getattr(part, "title", type(part).__name__)
        lines = [ln.strip() for ln in str(getattr(part, "message", part)).splitlines() if ln.strip()][:3]
        out.append(f"{title}: {' / '.join(lines)}")
    return " || ".join(out)
