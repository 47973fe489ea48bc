"""The package's shape: the research core never imports the CPU engine, and no module imports itself back.

Imports are read from the source (every `import` statement, at the top or inside a function, outside
`if TYPE_CHECKING:` blocks), so a lazy import that would close a cycle, or reach the engine only on some
path, counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("graft", "baselines")
ENGINE = "graft.cpu"
# the research core: the decode loop, the tree and verification, the drafter protocol and what composes methods
CORE = (
    "graft.acceptance",
    "graft.backends",
    "graft.compose",
    "graft.decode",
    "graft.dflash",
    "graft.drafter",
    "graft.eagle",
    "graft.grafting",
    "graft.kv",
    "graft.methods",
    "graft.nn",
    "graft.ops",
    "graft.registry",
    "graft.retrieval",
    "graft.tree",
    "baselines",
)


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for package in PACKAGES for p in (ROOT / package).rglob("*.py")}


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The package modules `name` imports, each with the packages above it (importing a.b.c runs a and a.b),
    except the packages `name` is inside: those have run before it."""
    tree = ast.parse(path.read_text())
    skip = {
        id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking(node) for n in ast.walk(node)
    }
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
        for target in targets:
            parts = target.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) in known}
    inside = {".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 2)}
    return found - inside


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def in_group(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def reaches(graph: dict[str, set[str]], start: str) -> dict[str, str | None]:
    """Every module `start` imports, directly or not, with the module that imported it (for the path)."""
    seen: dict[str, str | None] = {start: None}
    stack = [start]
    while stack:
        here = stack.pop()
        for nxt in graph[here]:
            if nxt not in seen:
                seen[nxt] = here
                stack.append(nxt)
    return seen


def chain(seen: dict[str, str | None], end: str) -> str:
    path = [end]
    while seen[path[-1]] is not None:
        path.append(seen[path[-1]])
    return " -> ".join(reversed(path))


def test_the_core_never_imports_the_engine():
    graph = import_graph()
    core = sorted(name for name in graph if any(in_group(name, prefix) for prefix in CORE))
    assert len(core) > 20, core  # the walk found the core
    leaks = []
    for name in core:
        seen = reaches(graph, name)
        engine = sorted(m for m in seen if in_group(m, ENGINE))
        if engine:
            leaks.append(chain(seen, engine[0]))
    assert not leaks, "core modules reach the CPU engine:\n" + "\n".join(leaks)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles():
    assert cycles(import_graph()) == []


def test_the_walk_sees_cycles_and_leaks():
    """The checks can fail: a cycle and an engine import on literal graphs."""
    graph = {"graft.a": {"graft.b"}, "graft.b": {"graft.c"}, "graft.c": {"graft.a"}, "graft.d": set()}
    assert cycles(graph) == [["graft.a", "graft.b", "graft.c"]]
    seen = reaches({"graft.tree": {"graft.x"}, "graft.x": {"graft.cpu.ops"}, "graft.cpu.ops": set()}, "graft.tree")
    assert chain(seen, "graft.cpu.ops") == "graft.tree -> graft.x -> graft.cpu.ops"


def test_no_file_patches_sys_path():
    offenders = [
        str(p.relative_to(ROOT))
        for folder in ("graft", "baselines", "scripts", "tests", "notebooks")
        for p in (ROOT / folder).rglob("*.py")
        if p.name != "test_structure.py" and "sys.path" in p.read_text()
    ]
    offenders += [str(p.relative_to(ROOT)) for p in [ROOT / "run.py"] if "sys.path" in p.read_text()]
    assert offenders == []
