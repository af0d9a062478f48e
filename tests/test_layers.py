"""The core stays as it is drawn: no import cycles, no import from a lower layer upward.

Every ``import`` and ``from … import`` of ``omni_core`` is read from the
source (``ast``, nothing is imported), lazy imports inside functions
included: a cycle hidden in a function still ties two modules together.
Imports under ``if TYPE_CHECKING:`` are left out (they never run).

Layers, lowest first: ``schema``, ``config``, ``plan``, ``engine`` and
``media`` describe and compute; ``runtime`` runs processes; ``kit`` (the
parts model plugins share) sits on the runtime, whose weight sharing its
loaders call in stage processes; ``serve`` is the HTTP API over a runtime;
``cli`` drives them all. A module may import its own layer and those below
it, never one above.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

CORE = Path(__file__).resolve().parents[1] / "omni_core"
ABOVE = {  # layer -> the layers it must never import
    "schema": ("runtime", "serve", "cli"),
    "config": ("runtime", "serve", "cli"),
    "plan": ("runtime", "serve", "cli"),
    "engine": ("runtime", "serve", "cli"),
    "media": ("runtime", "serve", "cli"),
    "runtime": ("kit", "serve", "cli"),
    "kit": ("serve", "cli"),  # model plugins' shared parts: plan-time and stage code
    "serve": ("cli",),
}
MAX_SERVE_LINES = 450


def _module(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return getattr(test, "id", None) == "TYPE_CHECKING" or getattr(test, "attr", None) == (
        "TYPE_CHECKING"
    )


def _imported(tree: ast.AST, package: list[str]) -> set[str]:
    """Dotted names ``tree`` imports (``from . import x`` as ``package.x``), TYPE_CHECKING out."""
    names: set[str] = set()
    todo = [tree]
    while todo:
        for child in ast.iter_child_nodes(todo.pop()):
            if isinstance(child, ast.If) and _type_checking(child):
                continue
            if isinstance(child, ast.ImportFrom):
                base = package[: len(package) - (child.level - 1)] if child.level else []
                target = ".".join([*base, *([child.module] if child.module else [])])
                names.add(target)
                names.update(f"{target}.{alias.name}" for alias in child.names)
            elif isinstance(child, ast.Import):
                names.update(alias.name for alias in child.names)
            todo.append(child)
    return names


def import_graph(root: Path) -> dict[str, set[str]]:
    """Each module of the package at ``root`` -> the package's modules it imports.

    ``from pkg import name`` counts ``pkg.name`` when that is a module, else ``pkg``.
    """
    paths = {_module(p, root): p for p in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
        names = _imported(ast.parse(path.read_text(encoding="utf-8")), package)
        modules = {n for n in names if n in paths}
        # a package counts only when nothing below it was named (from pkg import module)
        modules = {
            m
            for m in modules
            if not any(o.startswith(m + ".") for o in modules) or f"{m}.__init__" in names
        }
        graph[name] = modules - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(graph.items()):
        parts = module.split(".")
        layer = parts[1] if len(parts) > 1 else ""
        for target in sorted(targets):
            tparts = target.split(".")
            if len(tparts) > 1 and tparts[1] in ABOVE.get(layer, ()):
                bad.append(f"{module} imports {target} ({layer} is below {tparts[1]})")
    return bad


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(CORE)


def test_no_module_of_the_core_is_part_of_an_import_cycle(graph) -> None:
    assert cycles(graph) == []


def test_no_layer_imports_one_above_it(graph) -> None:
    assert upward_imports(graph) == []


def test_the_checks_see_a_cycle_through_a_lazy_import_and_an_upward_import(tmp_path) -> None:
    package = tmp_path / "omni_core"
    (package / "serve").mkdir(parents=True)
    (package / "plan").mkdir()
    for init in (package, package / "serve", package / "plan"):
        (init / "__init__.py").write_text("")
    (package / "serve" / "a.py").write_text("from .b import x\n")
    (package / "serve" / "b.py").write_text("def f():\n    from .a import y\n")
    (package / "plan" / "p.py").write_text("from ..serve import a\n")
    (package / "plan" / "q.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ..serve import b\n"
    )
    graph = import_graph(package)
    assert cycles(graph) == [["omni_core.serve.a", "omni_core.serve.b"]]
    assert upward_imports(graph) == [
        "omni_core.plan.p imports omni_core.serve.a (plan is below serve)"
    ]


def test_every_module_of_serve_stays_readable_in_one_sitting() -> None:
    long = {
        str(p.relative_to(CORE)): n
        for p in (CORE / "serve").rglob("*.py")
        if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_SERVE_LINES
    }
    assert long == {}
