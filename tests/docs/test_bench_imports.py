"""bench/ measures; the checks live with the tests. No test outside tests/bench/ imports `bench` (at module level or
inside a function), and neither does `checks/`, which those tests import: a correctness tool the tests need is a
module of checks/ (or tests/helpers/), and bench may import it, never the reverse."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def imported_roots(source: str) -> Iterator[tuple[int, str]]:
    """(line, top-level package) of every absolute import in `source`, wherever it stands."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name.split(".")[0]) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.lineno, node.module.split(".")[0]


def bench_imports(paths: list[Path]) -> list[str]:
    return [f"{p.relative_to(ROOT)}:{line}" for p in paths for line, root in imported_roots(p.read_text())
            if root == "bench"]


def test_no_test_outside_tests_bench_imports_bench() -> None:
    tests = sorted(p for p in (ROOT / "tests").rglob("*.py") if (ROOT / "tests" / "bench") not in p.parents)
    assert len(tests) > 100  # the tree was read
    assert bench_imports(tests) == []


def test_checks_import_no_bench() -> None:
    checks = sorted((ROOT / "checks").rglob("*.py"))
    assert {p.name for p in checks} >= {"fuzz.py", "reliability.py", "lm_eval_compare.py", "invariant_device.py"}
    assert bench_imports(checks) == []


def test_the_scan_sees_every_form() -> None:
    src = ("import bench\nimport os, bench.lib.harness as h\nfrom bench.serving import stages\n"
           "def f():\n    from bench.lib.report import Row\nfrom . import bench\nfrom checks.fuzz import fuzz_schema\n")
    assert [r for r in imported_roots(src) if r[1] == "bench"] == [(1, "bench"), (2, "bench"), (3, "bench"),
                                                                     (5, "bench")]
