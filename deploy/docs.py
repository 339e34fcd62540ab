"""The parts of docs/ that are the code's own words, rendered from the code so that they cannot drift.

    python -m deploy.docs          # rewrite the generated sections of docs/ (after changing a field or a rule)
    python -m deploy.docs --check  # exit 1 naming each stale file (tests/docs/test_generated_docs.py does this)

Each generated section sits between `<!-- NAME:start -->` and `<!-- NAME:end -->` in its page:
- docs/configuration.md `config`: every field of deploy/config.py's AppConfig with its `rayscore serve` flag, type,
  default and description, and `shipped`: what each configs/*.yaml sets in its applications' `args:`;
- docs/api.md `messages`: every 400 message of rulebook/ (rules.py, generate_fields.py, refused.py, limits.py,
  images.py, the sampling table);
- docs/performance.md `reports`: the dated runs of bench/reports/;
and docs/index.md, the site's home, is README.md with its links made relative to docs/.
This lives at the deploy edge because AppConfig is here; it reads rulebook/ as data.
"""

from __future__ import annotations

import argparse
import re
import sys
import types
from pathlib import Path
from typing import Any

import yaml

from deploy.config import AppConfig
from deploy.flags import POSITIONAL, flag_of
from rulebook import generate_fields, images, limits, refused, rules

ROOT = Path(__file__).resolve().parent.parent


def _type_name(annotation: Any) -> str:
    """`int | None`, `list[str]`, `Literal['a', 'b']` as a reader writes them."""
    if isinstance(annotation, type) and not isinstance(annotation, types.GenericAlias):
        return annotation.__name__
    text = str(annotation).replace("typing.", "").replace("pydantic.types.", "")
    return re.sub(r"<class '([\w.]+)'>", r"\1", text).replace("NoneType", "None")


def _default(value: Any) -> str:
    """A default as it would be written in YAML."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def config_table() -> str:
    """Every `args:` field, in AppConfig's order (the engine's, the ingress's, then the deploy edge's own)."""
    lines = ["| field | `rayscore serve` flag | type | default | description |", "|---|---|---|---|---|"]
    for name, field in AppConfig.model_fields.items():
        default = _default(field.get_default(call_default_factory=True))
        flag = "`MODEL` (positional)" if name == POSITIONAL else f"`{flag_of(name)}`"
        lines.append(f"| `{name}` | {flag} | `{_cell(_type_name(field.annotation))}` | `{_cell(default)}` | "
                     f"{_cell(field.description or '')} |")
    return "\n".join(lines)


def shipped_configs() -> str:
    """What each shipped Serve config sets in its applications' `args:` (the rest are the defaults above)."""
    lines = ["| file | application | `args:` it sets |", "|---|---|---|"]
    for path in sorted((ROOT / "configs").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text()) or {}
        for app in doc.get("applications", []):
            keys = ", ".join(f"`{k}: {_default(v) if not isinstance(v, dict | list) else '...'}`"
                             for k, v in (app.get("args") or {}).items())
            lines.append(f"| `configs/{path.name}` | `{app.get('name', '')}` | {keys} |")
    return "\n".join(lines)


def report_list() -> str:
    """bench/reports/: every dated run, newest first, with its title (its first line) or its file name."""
    lines = []
    for path in sorted((ROOT / "bench" / "reports").glob("*.md"), reverse=True):
        first = path.read_text().split("\n", 1)[0]
        title = first.lstrip("# ").strip() if first.startswith("# ") else path.stem
        lines.append(f"- `bench/reports/{path.name}`: {title}")
    return "\n".join(lines)


def messages() -> list[tuple[str, str]]:
    """(where, template) of every user-facing message of the rulebook, in the modules' order."""
    found: list[tuple[str, str]] = []
    for module in (rules, generate_fields, refused, limits, images):
        for name, value in vars(module).items():
            if name.isupper() and isinstance(value, str):
                found.append((f"{module.__name__}.{name}", value))
    found += [(f"rulebook.rules.SAMPLING_RULES[{rule.field}]", rule.text) for rule in rules.SAMPLING_RULES
              if rule.text not in {text for _, text in found}]
    return found


def message_list() -> str:
    return "\n".join(f"- `` {text} `` ({where})" for where, text in messages())


def readme_page() -> str:
    """The site's home page: README.md, whose links into docs/ are made relative to docs/."""
    text = (ROOT / "README.md").read_text()
    note = "<!-- Generated from README.md by `python -m deploy.docs`: edit README.md. -->\n"
    return note + text.replace("](docs/", "](")


# Whole pages made from another file.
PAGES: dict[str, Any] = {"docs/index.md": readme_page}

SECTIONS: dict[str, dict[str, Any]] = {
    "docs/configuration.md": {"config": config_table, "shipped": shipped_configs},
    "docs/api.md": {"messages": message_list},
    "docs/performance.md": {"reports": report_list},
}


def render(text: str, sections: dict[str, Any]) -> str:
    """`text` with each `<!-- NAME:start -->...<!-- NAME:end -->` section filled anew."""
    for name, make in sections.items():
        start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
        if start not in text or end not in text:
            raise ValueError(f"missing the markers {start} ... {end}")
        head, rest = text.split(start, 1)
        text = f"{head}{start}\n{make()}\n{end}{rest.split(end, 1)[1]}"
    return text


def stale(write: bool) -> list[str]:
    """The pages whose generated sections differ from the code; rewritten when `write`."""
    out = []
    wanted = {page: (lambda page=page, sections=sections: render((ROOT / page).read_text(), sections))
              for page, sections in SECTIONS.items()} | PAGES
    for page, make in wanted.items():
        path = ROOT / page
        old = path.read_text() if path.exists() else ""
        new = make()
        if new != old:
            out.append(page)
            if write:
                path.write_text(new)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m deploy.docs", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="write nothing; exit 1 when a page is stale")
    args = ap.parse_args(argv)
    pages = stale(write=not args.check)
    for page in pages:
        print(f"{page}: {'stale (run python -m deploy.docs)' if args.check else 'rewritten'}")
    return 1 if args.check and pages else 0


if __name__ == "__main__":
    sys.exit(main())

