"""The user-facing 400 messages are written once, in rulebook/, and docs/api.md quotes the code's own text.

- Every message docs/api.md's `/generate` contract quotes (`→ ``...```) is a template of rulebook/, the `{...}`
  placeholders aside; its full list of messages is generated from rulebook/ (test_generated_docs.py).
- No message is written in two files: the literals that a request's error is made of (the arguments of
  InvalidRequest, RequestError, Violation, error_chunk, NotFound, and module-level constants) in ingress/,
  workers/, engine/ and rulebook/ are never the same text in two files, and no file outside rulebook/ retypes a
  piece of a rulebook message.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from deploy.docs import messages

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("ingress", "workers", "engine", "rulebook")
ERROR_CALLS = {"InvalidRequest", "RequestError", "Violation", "error_chunk", "NotFound", "ServerError", "Unavailable"}
PLACEHOLDER = re.compile(r"\{[^{}]*\}")


def normalized(text: str) -> str:
    return PLACEHOLDER.sub("{}", text).strip()


def as_pattern(template: str) -> re.Pattern[str]:
    """A rulebook template as a pattern: each placeholder stands for any text (the doc writes `{v}` or a value)."""
    return re.compile("(.+?)".join(re.escape(piece) for piece in PLACEHOLDER.split(template)))


def contract_messages() -> list[str]:
    """The messages the contract's validation list quotes: ``rule → `message` `` (a message may wrap a line)."""
    text = (ROOT / "docs" / "api.md").read_text()
    section = text.split("### Validation", 1)[1].split("\n###", 1)[0]
    return [m.replace("\n", " ").strip() for m in re.findall(r"→\s*`([^`]+)`", section)]


def _text(node: ast.expr) -> str | None:
    """A literal's text; an f-string's with `{}` for each value."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "a " + "b"
        left, right = _text(node.left), _text(node.right)
        return None if left is None or right is None else left + right
    return None


def message_literals(path: Path) -> Iterator[tuple[int, str]]:
    """The literals a request's error message is made of, in one file."""
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
            if name in ERROR_CALLS:
                for arg in [*node.args, *(k.value for k in node.keywords)]:
                    text = _text(arg)
                    if text is not None:
                        yield node.lineno, text
    for node in tree.body:
        if isinstance(node, ast.Assign) and all(isinstance(t, ast.Name) and t.id.isupper() for t in node.targets):
            text = _text(node.value)
            if text is not None:
                yield node.lineno, text


def written_twice() -> dict[str, list[str]]:
    where: dict[str, set[str]] = defaultdict(set)
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            for _, text in message_literals(path):
                if len(normalized(text).split()) >= 3:
                    where[normalized(text)].add(str(path.relative_to(ROOT)))
    return {text: sorted(files) for text, files in where.items() if len(files) > 1}


def retyped_outside_rulebook() -> list[str]:
    """A run of 20+ characters of a rulebook message found in a message literal of another package."""
    pieces = {piece.strip() for _, template in messages() for piece in PLACEHOLDER.split(template)
              if len(piece.strip()) >= 20}
    found = []
    for package in PACKAGES[:3]:
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, text in message_literals(path):
                found += [f"{path.relative_to(ROOT)}:{line}: {p!r}" for p in pieces if p in text]
    return found


def test_the_contract_quotes_the_rulebook() -> None:
    quoted = contract_messages()
    assert len(quoted) >= 14, quoted  # the list was found and read
    assert [m for m in quoted if not any(as_pattern(t).fullmatch(m) for _, t in messages())] == []


def test_no_message_is_written_in_two_files() -> None:
    assert written_twice() == {}


def test_no_rulebook_message_is_retyped_elsewhere() -> None:
    assert retyped_outside_rulebook() == []


def test_the_scans_see_messages(tmp_path: Path) -> None:
    path = tmp_path / "probe.py"
    path.write_text('X = "The prompt must not be an empty string"\n'
                    'def f(n):\n'
                    '    raise InvalidRequest(f"The rid of a batch must be a list of {n} strings.", param="rid")\n')
    found = [text for _, text in message_literals(path)]
    assert "The rid of a batch must be a list of {} strings." in found
    assert "The prompt must not be an empty string" in found
    assert as_pattern("The {name} {value} must be non-negative.").fullmatch("The max_tokens {v} must be non-negative.")
    assert not as_pattern("The {name} {value} must be non-negative.").fullmatch("The max_tokens must be positive.")
