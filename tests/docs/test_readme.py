"""The README stays a newcomer's page and its map stays the tree: at most 250 lines, the Quickstart first, every
module of ours named in the architecture map and every file the map names present."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MAPPED = ("protocol", "ingress", "workers", "engine", "rulebook", "offline", "deploy", "checks")


def architecture_map() -> str:
    text = README.read_text().split("\n## Architecture\n", 1)[1]
    return text.split("```", 2)[1]


def test_short_with_the_quickstart_first() -> None:
    text = README.read_text()
    assert len(text.splitlines()) <= 250
    assert re.findall(r"^## (.+)$", text, re.M)[0] == "Quickstart"


def test_the_map_names_every_module() -> None:
    names = set(re.findall(r"\b(\w+\.py)\b", architecture_map()))
    modules = {p.name for package in MAPPED for p in (ROOT / package).rglob("*.py") if p.name != "__init__.py"}
    assert len(modules) > 80  # the tree was read (names, so app.py counts once)
    assert sorted(modules - names) == [], "modules the README's map leaves out"
    assert sorted(names - modules) == [], "files the README's map names that are not there"


def test_the_map_names_every_folder() -> None:
    folders = {p.parent.relative_to(ROOT).as_posix() for package in (*MAPPED, "bench")
               for p in (ROOT / package).rglob("__init__.py")}
    text = architecture_map()
    missing = [f for f in sorted(folders) if f"{f.rsplit('/', 1)[-1]}/" not in text]
    assert missing == []
