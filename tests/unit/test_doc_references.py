"""Every test and every file the README and the docs name exists: a promise cites its
evidence, and the evidence must not be renamed or deleted from under it (docs/promises.md,
the security and reliability table, is such a list of promises). Paths the code's comments
and docstrings name are checked too."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
REF = re.compile(r"\btests/[\w/]+\.py(?:::\w+)?")


def references() -> list[tuple[str, str]]:
    return sorted({(page.name, m.group(0)) for page in PAGES for m in REF.finditer(page.read_text())})


def defined_names(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}


@pytest.mark.parametrize(("page", "ref"), references())
def test_a_named_test_exists(page: str, ref: str) -> None:
    file, _, name = ref.partition("::")
    path = ROOT / file
    assert path.is_file(), f"{page} names {file}, which does not exist"
    if name:
        assert name in defined_names(path), f"{page} names {ref}, which {file} does not define"


def test_the_check_finds_references() -> None:
    assert any(page == "README.md" for page, _ in references())


# -- every file a page or a docstring names exists ------------------------------------------

#: Folders whose files the README, the docs and the code's comments name by path.
FOLDERS = ("docs", "bench", "scripts", "configs", "examples", "seed_agents", "trainers", "graphs", "tools", "tests")
PATH = re.compile(rf"(?<![\w./~$-])((?:{'|'.join(FOLDERS)})/[\w./-]*[\w/])([{{<*]?)")
SOURCES = ("seed_agents", "trainers", "graphs", "tools", "bench", "scripts")
#: Named as what a script writes when it runs, before any run has: path -> the writer.
NOT_YET_WRITTEN = {"docs/results/run_memory_phases.json": "bench/run_memory.py --phases"}


def _exists(path: str) -> bool:
    """A file or folder, or a module named with an attribute (``trainers/shared_prefix.fn``)."""
    if (ROOT / path).exists():
        return True
    module = path.split(".", 1)[0]
    return (ROOT / f"{module}.py").is_file() or (ROOT / module).is_dir()


def file_references() -> list[tuple[str, int, str]]:
    """(file, line, path) for every path under one of FOLDERS that a page, a source file, a
    config or pyproject.toml names; a pattern (``docs/results/{name}.json``, ``learning_curve_*.json``) is not a path."""
    files = [*PAGES, ROOT / "docs" / "results" / "README.md", ROOT / "pyproject.toml",
             *sorted((ROOT / "configs").rglob("*.yaml")),
             *(p for d in SOURCES for p in sorted((ROOT / d).rglob("*.py")))]
    out = []
    for file in files:
        for number, line in enumerate(file.read_text(encoding="utf-8").splitlines(), 1):
            out += [(str(file.relative_to(ROOT)), number, m.group(1)) for m in PATH.finditer(line) if not m.group(2)]
    return out


def test_every_file_a_page_or_a_docstring_names_exists() -> None:
    missing = [f"{file}:{line}: {path}" for file, line, path in file_references()
               if not _exists(path) and path not in NOT_YET_WRITTEN]
    assert not missing, "these name files that do not exist:\n" + "\n".join(missing)


def test_no_page_or_docstring_cites_a_design_card_outside_the_repo() -> None:
    """The design card the project was built from is not shipped; the docs say what it said."""
    cites = [f"{file}:{line}" for file, line, path in file_references() if path.endswith("DESIGN.md")]
    bare = [f"{p.relative_to(ROOT)}" for p in [*PAGES, *(q for d in SOURCES for q in (ROOT / d).rglob("*.py"))]
            if re.search(r"(?<![\w/])DESIGN\.md", p.read_text(encoding="utf-8"))]
    assert not cites and not bare, cites + bare


def test_the_path_check_finds_references_and_refuses_a_missing_file() -> None:
    found = {path for _, _, path in file_references()}
    assert {"docs/results/main_job.json", "bench/stats.py", "configs/atlas_agent.yaml"} <= found
    assert _exists("trainers/shared_prefix.logps_on_prompt_kv") and not _exists("docs/DESIGN.md")
    assert PATH.search("docs/results/{name}.json").group(2) == "{"
