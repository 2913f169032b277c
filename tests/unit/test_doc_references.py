"""Every test the README and the docs name exists: a promise cites its evidence, and the
evidence must not be renamed or deleted from under it (the README's security and
reliability table is such a list of promises)."""

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
