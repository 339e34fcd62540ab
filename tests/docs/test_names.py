"""One name per concept: no module-level assignment gives a class or a constant a second name
(`FinishInfo = FinishReason`, `CausalLM = LlamaForCausalLM`, `DEFAULT_MODEL_NAME = DEFAULT_MODEL`). A re-export
is an import (`from protocol.outputs import FinishReason`), never an assignment."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("engine", "ingress", "workers", "deploy", "rulebook", "offline", "checks", "bench", "tests")
CLASS_OR_CONSTANT = re.compile(r"^(?:[A-Z][A-Z0-9_]*|_?[A-Z][a-z0-9]+(?:[A-Z][a-z0-9]*)*)$")


def aliases(source: str) -> list[str]:
    """`Name = OtherName` at module level where OtherName reads as a class (CapWords) or a constant (UPPER)."""
    found = []
    for node in ast.parse(source).body:
        target = value = None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Name | ast.Attribute):
            name = value.id if isinstance(value, ast.Name) else value.attr
            if CLASS_OR_CONSTANT.match(name):
                found.append(f"{node.lineno}: {target.id} = {ast.unparse(value)}")
    return found


def test_no_class_or_constant_aliases() -> None:
    paths = sorted(p for package in PACKAGES for p in (ROOT / package).rglob("*.py"))
    found = [f"{path.relative_to(ROOT)}:{hit}" for path in paths for hit in aliases(path.read_text())]
    assert found == []


def test_the_scan_sees_an_alias() -> None:
    src = ("FinishInfo = FinishReason\nDEFAULT_MODEL_NAME = DEFAULT_MODEL\nCausalLM: type = llama.LlamaForCausalLM\n"
           "log = logging.getLogger(__name__)\nMIB = 1024 * 1024\nRow = list[int]\nx = y\n")
    assert aliases(src) == ["1: FinishInfo = FinishReason", "2: DEFAULT_MODEL_NAME = DEFAULT_MODEL",
                            "3: CausalLM = llama.LlamaForCausalLM"]
