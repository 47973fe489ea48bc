"""The package's shape: the research core never imports the CPU engine, and no module imports itself back.

Imports are read from the source (every `import` statement, at the top or inside a function, outside
`if TYPE_CHECKING:` blocks), so a lazy import that would close a cycle, or reach the engine only on some
path, counts as much as one at the top.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("graft", "baselines")
# The layers, lowest first: a module may import its own layer and those below it, never one above. The core is
# graft/'s top-level modules (the paper's loop) with the target backends and the retrievers; the CPU engine sits
# beside it (the core never imports it, the test below); then what composes methods, the configuration, the
# prompts, the plan, loading, the run folder's format, the analysis of runs, running, and the tools on top.
LAYERS = (
    ("core", ("graft.<top>", "graft.backends", "graft.retrieval")),
    ("engine", ("graft.cpu",)),
    ("methods and draft models", ("graft.methods", "graft.draft_models", "graft.budget", "baselines")),
    ("config", ("graft.config",)),
    ("data", ("graft.data",)),
    ("plan", ("graft.plan",)),
    ("load", ("graft.load",)),
    ("records", ("graft.records",)),
    ("analysis", ("graft.analysis",)),
    ("run", ("graft.run",)),
    ("tools", ("graft.report", "graft.costmodel", "graft.gpu_check", "graft.train", "graft.bench", "graft.peers")),
)
ENGINE = "graft.cpu"
CORE = (
    "graft.<top>",
    "graft.backends",
    "graft.retrieval",
    "graft.methods",
    "graft.draft_models",
    "graft.budget",
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
    if prefix == "graft.<top>":  # a module directly in graft/ (not a package)
        return name.count(".") == 1 and name.startswith("graft.") and not (ROOT / name.replace(".", "/")).is_dir()
    return name == prefix or name.startswith(prefix + ".")


def layer_of(name: str, layers=LAYERS) -> int | None:
    """The index of the layer a module belongs to; None for the package roots (graft/__init__.py)."""
    found = [i for i, (_, prefixes) in enumerate(layers) for prefix in prefixes if in_group(name, prefix)]
    return found[0] if found else None


def upward_imports(graph: dict[str, set[str]], layers=LAYERS) -> list[str]:
    """Every import of a module in a higher layer than the importer's, as 'a (layer) -> b (layer)'."""
    found = []
    for name in sorted(graph):
        here = layer_of(name, layers)
        for target in sorted(graph[name]):
            there = layer_of(target, layers)
            if here is not None and there is not None and there > here:
                found.append(f"{name} ({layers[here][0]}) -> {target} ({layers[there][0]})")
    return found


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


def test_every_module_has_a_layer():
    graph = import_graph()
    assert [name for name in graph if layer_of(name) is None] == ["graft"]


def test_no_module_imports_a_higher_layer():
    assert upward_imports(import_graph()) == []


def test_the_layering_check_rejects_an_upward_import():
    """The negative control: the core importing the runner, and a method importing the config, are named."""
    graph = {
        "graft.decode": {"graft.run.runner", "graft.tree"},
        "graft.tree": set(),
        "graft.run.runner": {"graft.decode"},
        "graft.methods.pruned": {"graft.config.experiment"},
        "graft.config.experiment": set(),
    }
    assert upward_imports(graph) == [
        "graft.decode (core) -> graft.run.runner (run)",
        "graft.methods.pruned (methods and draft models) -> graft.config.experiment (config)",
    ]


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
