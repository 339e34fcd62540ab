"""The dependency rule, read from the code's imports (every import, at module level or inside a function):

    deploy -> {ingress, workers} (and offline/cli.py: `rayscore batch`);  ingress -> workers' replica label;
    workers -> engine;
    offline -> engine (and deploy/config.py);  everything -> {protocol, rulebook};  rulebook -> protocol

and nothing upward: engine imports no Ray, web framework, ingress, workers, deploy or offline; workers never
import ingress or deploy; protocol imports nothing of ours (the floor: the canonical request, answers, carriers,
control operations, compact codec); the ingress reaches no engine module by any path, a re-export included. And no
import circle between modules (at module level, where a circle breaks an import).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OURS = ("protocol", "engine", "ingress", "workers", "deploy", "rulebook", "offline", "checks", "bench")
WEB = ("fastapi", "starlette", "uvicorn")

# Per package: the roots (or exact modules, for ingress -> workers) it may import besides itself and the
# standard library / third-party packages, and the third-party roots it must not import.
ALLOWED: dict[str, set[str]] = {
    "protocol": set(),
    "rulebook": {"protocol"},
    "engine": {"protocol", "rulebook"},
    "workers": {"protocol", "engine", "rulebook"},
    "ingress": {"protocol", "rulebook", "workers.replica"},
    "offline": {"protocol", "engine", "rulebook", "deploy.config"},
    # offline.cli: the `rayscore batch` subcommand of the one command (deploy/cli.py), imported when it runs.
    "deploy": {"protocol", "engine", "ingress", "workers", "rulebook", "offline.cli"},
}
FORBIDDEN_THIRD_PARTY: dict[str, tuple[str, ...]] = {
    "protocol": ("torch", "numpy", "ray", *WEB, "pydantic"),
    "rulebook": ("torch", "ray", *WEB, "pydantic"),
    "engine": ("ray", *WEB),
    "workers": WEB,
}


def modules(package: str) -> Iterator[tuple[str, Path]]:
    for path in sorted((ROOT / package).rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        yield ".".join(parts[:-1] if parts[-1] == "__init__" else parts), path


def imports(path: Path, module_level_only: bool = False) -> Iterator[str]:
    """Absolute module names imported by `path` (`from a.b import c` gives a.b.c when that is a module)."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else ast.walk(tree)
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            base = node.module
            if node.level:  # relative: resolve against the importing module's package
                pkg = path.relative_to(ROOT).parent.parts
                base = ".".join([*pkg[:len(pkg) - node.level + 1], node.module])
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                yield sub if _is_module(sub) else base


def _is_module(name: str) -> bool:
    p = ROOT.joinpath(*name.split("."))
    return p.with_suffix(".py").exists() or (p / "__init__.py").exists()


def allowed(package: str, target: str) -> bool:
    root = target.split(".")[0]
    if root == package or root not in OURS:
        return not any(root == t for t in FORBIDDEN_THIRD_PARTY.get(package, ()))
    return any(target == a or target.startswith(a + ".") or root == a for a in ALLOWED[package])


def upward_imports() -> list[str]:
    return [f"{name} imports {target}" for package in ALLOWED for name, path in modules(package)
            for target in imports(path) if not allowed(package, target)]


def import_graph() -> dict[str, set[str]]:
    """Our modules -> our modules they import at module level."""
    return {name: {t for t in imports(path, module_level_only=True) if t.split(".")[0] in OURS and _is_module(t)}
            for package in OURS for name, path in modules(package)}


def find_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_points_upward() -> None:
    assert upward_imports() == []


def reachable(package: str) -> set[str]:
    """Our modules that importing `package`'s modules loads, by any path (every import, a re-export's included)."""
    graph = {name: {t for t in imports(path) if t.split(".")[0] in OURS and _is_module(t)}
             for p in OURS for name, path in modules(p)}
    seen: set[str] = set()
    todo = [name for name, _ in modules(package)]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(graph.get(name, ()))
        # Importing a module runs the __init__ of every package above it first.
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if _is_module(".".join(parts[:i])))
    return seen


def test_ingress_reaches_no_engine_module_and_protocol_nothing_of_ours() -> None:
    from_ingress = reachable("ingress")
    assert {"protocol.carriers", "protocol.sampling", "rulebook.rules", "ingress.app"} <= from_ingress
    assert sorted(m for m in from_ingress if m.split(".")[0] == "engine") == []
    assert {m.split(".")[0] for m in reachable("protocol")} == {"protocol"}
    assert any(m.startswith("engine.") for m in reachable("workers"))  # the walk does follow imports


def test_no_import_circles() -> None:
    graph = import_graph()
    assert sum(map(len, graph.values())) > 300  # the graph was read
    assert find_circles(graph) == []
    assert find_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_rule_catches_what_it_forbids() -> None:
    assert not allowed("engine", "ray.serve") and not allowed("engine", "fastapi")
    assert not allowed("engine", "workers.worker") and not allowed("engine", "ingress.app")
    assert not allowed("protocol", "rulebook.rules") and not allowed("protocol", "engine.config")
    assert not allowed("workers", "ingress.errors") and not allowed("workers", "deploy.config")
    assert not allowed("ingress", "engine.llm_engine") and not allowed("ingress", "workers.worker")
    assert not allowed("rulebook", "engine.config") and not allowed("rulebook", "torch")
    assert allowed("ingress", "protocol.carriers") and allowed("engine", "torch")
    assert allowed("engine", "rulebook.rules")
    assert not allowed("ingress", "workers.weights") and not allowed("protocol", "torch")
    assert set(imports(ROOT / "ingress" / "limits.py")) >= {"ingress.errors", "rulebook.limits", "protocol"}
