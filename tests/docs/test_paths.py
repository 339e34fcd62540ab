"""Every repository path the README, docs/, bench/reports/ and the code's docstrings and comments name exists.

A file that moves leaves its old name behind in prose; these tests find it. Two kinds of names:
- rooted, `engine/runner/scorer.py`, `ingress/openai/`, `tests/helpers/tiny_models.py` (a top-level folder of
  ours first): checked in README, docs/ and every string and comment of our Python files;
- relative, `generate/validation.py` or a bare `weights.py`, in docstrings and comments only: a relative one must
  exist below the file's folder or one of its parents, a bare one somewhere in the repository, unless it is a
  file of another project that the text names on purpose (EXTERNAL).
"""

from __future__ import annotations

import ast
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = ("engine", "ingress", "workers", "deploy", "rulebook", "offline", "checks", "bench", "tests", "configs", "docs",
        ".ci")
CODE = TOPS[:9]
# Made at run time, never committed (git ignores them): `python -m bench` writes bench/results/, `make docs` site/.
MADE_AT_RUN_TIME = {"bench/results", "site"}
# Files of other projects the text names on purpose: Ray Serve's proxy, vLLM's invariance test.
EXTERNAL = {"proxy.py", "test_batch_invariance.py", "http_util.py", "sglang_rollout.py"}
# Folders of other projects' repositories the text names on purpose: SGLang's (python/sglang/..., its sampling/),
# slime's and AReaL's request code that the dialect tests replay.
EXTERNAL_ROOTS = {"python", "sampling", "slime", "areal"}

_ROOTED = re.compile(r"(?<![\w./-])(?:" + "|".join(re.escape(t) for t in TOPS) + r")/[\w./-]*")
RELATIVE = re.compile(r"(?<![\w./-])([A-Za-z_][\w/]*\.(?:py|md|yaml|yml))(?![\w<*{])")


def rooted(text: str) -> list[str]:
    """Rooted paths in `text`, less a sentence's final dot; a pattern (`test_models_<family>.py`, `*.md`) is no
    path."""
    return [m.group(0).rstrip(".") for m in _ROOTED.finditer(text) if text[m.end():m.end() + 1] not in ("<", "*", "{")]


def markdown_files() -> list[Path]:
    reports = sorted((ROOT / "bench" / "reports").glob("*.md"))
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *reports]


def python_files() -> list[Path]:
    """Ours, less this file (its examples name missing paths on purpose)."""
    return sorted(p for top in CODE for p in (ROOT / top).rglob("*.py") if p != Path(__file__).resolve())


def strings_and_comments(path: Path) -> Iterator[tuple[int, str]]:
    with path.open() as f:
        for tok in tokenize.generate_tokens(f.readline):
            if tok.type in (tokenize.STRING, tokenize.COMMENT):
                yield tok.start[0], tok.string


def docstrings_and_comments(path: Path) -> Iterator[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield getattr(node, "lineno", 1), doc
    yield from ((line, text) for line, text in strings_and_comments(path) if text.startswith("#"))


def exists(name: str) -> bool:
    path = name.rstrip(".").split(":")[0].rstrip("/")
    return (ROOT / path).exists() or any(path == m or path.startswith(m + "/") for m in MADE_AT_RUN_TIME)


def rooted_misses() -> list[str]:
    found = [(p, n, line) for p in markdown_files() for n, line in enumerate(p.read_text().splitlines(), 1)]
    found += [(p, n, text) for p in python_files() for n, text in strings_and_comments(p)]
    return [f"{p.relative_to(ROOT)}:{n}: {m}" for p, n, text in found for m in rooted(text) if not exists(m)]


def relative_misses() -> list[str]:
    all_names = {p.name for p in ROOT.rglob("*") if not {".git", ".venv", "site"} & set(p.parts)}
    misses = []
    for path in python_files():
        bases = [d for d in [path.parent, *path.parent.parents] if d == ROOT or ROOT in d.parents]
        for n, text in docstrings_and_comments(path):
            for name in RELATIVE.findall(text):
                if name.split("/")[0] in TOPS or name in EXTERNAL or name.split("/")[0] in EXTERNAL_ROOTS:
                    continue
                ok = any((b / name).exists() for b in bases) if "/" in name else name in all_names
                if not ok:
                    misses.append(f"{path.relative_to(ROOT)}:{n}: {name}")
    return misses


def test_every_rooted_path_named_exists() -> None:
    assert rooted_misses() == []


def test_every_relative_path_in_docstrings_and_comments_exists() -> None:
    assert relative_misses() == []


def test_the_scan_finds_paths_and_misses() -> None:
    # The patterns read what prose writes, and a moved file is caught.
    text = "see `engine/runner/scorer.py`, engine/models/rope.py and tests/engine/test_models_<family>.py"
    assert rooted(text) == ["engine/runner/scorer.py", "engine/models/rope.py"]
    assert exists("engine/runner/scorer.py") and exists("deploy/config.py:AppConfig") and exists("ingress/openai/")
    assert not exists("engine/models/rope.py") and not exists("ingress/weights.py")
    assert RELATIVE.findall("the rules of generate/validation.py and weights.py.") == ["generate/validation.py",
                                                                                        "weights.py"]
