"""The house's rules, read from the source: contracts point down and imports never run in a circle.

Layers, bottom to top: the core (``seed_agents.*``), then the graphs, tools and trainers
(``graphs/``, ``tools/``, ``trainers/`` in the repo, installed as ``seed_agents.graphs``, ...),
then the app (``seed_agents.app``: CLI, builders, train and continual loops). A module may
import only its own layer or those below it. Every import statement counts, at the top of a
file, inside a function or under ``TYPE_CHECKING``: a circle that closes only through a
function-local import is still a circle.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UPPER = ("seed_agents.graphs", "seed_agents.tools", "seed_agents.trainers")
APP = "seed_agents.app"


def _package_dirs() -> dict[str, Path]:
    """Import name -> folder, as pyproject installs them."""
    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    return {"seed_agents": REPO / "seed_agents", **{name: REPO / d for name, d in setuptools["package-dir"].items()}}


def _modules() -> dict[str, Path]:
    mods = {}
    dirs = _package_dirs()
    for prefix, folder in dirs.items():
        for file in folder.rglob("*.py"):
            parts = list(file.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = ".".join([prefix, *parts])
            if any(name == d or name.startswith(d + ".") for d in dirs if d != prefix and d.startswith(prefix)):
                continue  # a mapped package's own folder wins
            mods[name] = file
    return mods


MODULES = _modules()


def _owner(name: str) -> str | None:
    """The project module ``name`` is (or lives in), or None for a third-party name."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def _imports(module: str) -> set[str]:
    """The project modules ``module`` imports, by any import statement anywhere in it."""
    file = MODULES[module]
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(file.read_text())):
        if isinstance(node, ast.Import):
            found |= {owner for alias in node.names if (owner := _owner(alias.name))}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package
                for _ in range(node.level - 1):
                    parent = parent.rpartition(".")[0]
                base = f"{parent}.{base}" if base else parent
            if base not in MODULES:
                if owner := _owner(base):
                    found.add(owner)
                continue
            # `from pkg import sub` imports the submodule; `from pkg import name` the package
            found |= {f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names}
    return found - {module}


GRAPH = {module: _imports(module) for module in MODULES}


def _layer(module: str) -> int:
    if module == APP or module.startswith(APP + ".") or module.endswith(".__main__"):  # entry points run the CLI
        return 2
    return 1 if module.startswith(UPPER) else 0


def test_the_layout_is_what_pyproject_installs():
    """Every folder with an __init__.py is a listed package (a new one left out would be
    missing from the wheel), and the graphs/tools/trainers folders map into the namespace."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    packages = {name for name, file in MODULES.items() if file.name == "__init__.py"}
    assert listed == packages
    assert {"seed_agents.graphs", "seed_agents.tools", "seed_agents.trainers"} <= packages
    assert len(MODULES) > 100  # the walk found the project, not an empty folder


@pytest.mark.parametrize("module", sorted(MODULES))
def test_imports_point_down(module):
    above = sorted(m for m in GRAPH[module] if _layer(m) > _layer(module))
    assert not above, f"{module} (layer {_layer(module)}) imports {above}: move the contract down or the code up"


def test_core_configs_import_nothing_above_them():
    """The configs of the core (backend, runner, agent, sampling) are read by every layer:
    they may import only the contract, the errors and each other."""
    for module in (m for m in MODULES if m.startswith("seed_agents.config")):
        allowed = {"seed_agents.types", "seed_agents.errors"}
        assert all(m in allowed or m.startswith("seed_agents.config") for m in GRAPH[module]), (module, GRAPH[module])
    assert GRAPH["seed_agents.errors"] == set()


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
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


def test_no_import_circle():
    assert _cycles(GRAPH) == []


def test_the_circle_check_sees_a_circle():
    """The check itself: a circle through a function-local import is found."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
