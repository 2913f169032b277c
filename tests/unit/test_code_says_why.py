"""Code says why, not when: no dates, no "the path before" and no measured figures in the
packages' code comments and docstrings. Facts with a shelf life (seconds, gigabytes, speed-ups
from a benchmark) live in docs/benchmarks.md beside their result file; the code says the why
and points there."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("seed_agents", "trainers", "graphs", "tools")
FILES = sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))

DATE = re.compile(r"\b(?:19|20)\d\d-(?:0[1-9]|1[0-2])-(?:0[1-9]|[12]\d|3[01])\b")
# a number with a unit of time, memory or throughput, a speed-up, or a percentage
FIGURE = re.compile(r"\d(?:[\d,.]*\d)?\s(?:s|ms|seconds?|minutes?)\b|\d(?:[\d,.]*\d)?\s?(?:ms|GB|MB|KB|GiB|MiB|TB)\b"
                    r"|\d\s?(?:[GT]FLOP|tok|tokens)/s"
                    r"|\d+(?:\.\d+)?x (?:faster|slower)|\b\d+\.\d+x\b|\b\d+(?:\.\d+)?%")
# Figures that are not measurements: sizes worked out from a model's shape, a setting's value,
# a dependency's default, the examples of a format. (file, the figure as matched)
NOT_MEASURED = {
    ("seed_agents/backends/decode.py", "0.4 GB"),  # tokens x vocab x 4 bytes
    ("seed_agents/backends/turn_cache.py", "46 KB"),  # layers x heads x head_dim x 2 x 4 bytes
    ("trainers/head.py", "0.6 MB"),  # three vocab-wide fp32 rows
    ("trainers/shared_prefix.py", "3 GB"),  # rows x tokens x vocab x 4 bytes, twice
    ("seed_agents/memory.py", "1 MB"),  # a threshold tried, not a time
    ("seed_agents/gateway/upstream.py", "5 s"),  # uvicorn's keep-alive default
    ("seed_agents/observe/curve.py", "100%"),  # a success rate, not a measurement
    ("tools/openapi_source.py", "11 MB"),  # why the size limit is what it is
}


def _comments_and_docstrings(path: Path):
    """(line, text) of every comment and every bare string statement (docstrings) in ``path``."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            for offset, line in enumerate(node.value.value.splitlines()):
                yield node.lineno + offset, line


def _rel(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def test_the_scan_sees_the_packages():
    assert len(FILES) > 100 and any(_rel(p) == "trainers/seed_trainer.py" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=_rel)
def test_no_date_and_no_path_before(path):
    text = path.read_text()
    assert not DATE.findall(text), f"{_rel(path)}: a date; say why, and keep when in docs/benchmarks.md"
    assert "the path before" not in " ".join(text.lower().split()), f"{_rel(path)}: history in the code"


def _figures():
    found = []
    for path in FILES:
        for line, text in _comments_and_docstrings(path):
            found += [(_rel(path), line, m.group(0)) for m in FIGURE.finditer(text)]
    return found


def test_no_measured_figures_in_comments_or_docstrings():
    measured = [f"{path}:{line}: {figure}" for path, line, figure in _figures() if (path, figure) not in NOT_MEASURED]
    assert not measured, ("measured figures belong in docs/benchmarks.md beside their result file; say the why "
                          "and point there:\n" + "\n".join(measured))


def test_the_allowlist_has_no_stale_entry():
    seen = {(path, figure) for path, _, figure in _figures()}
    assert NOT_MEASURED <= seen, NOT_MEASURED - seen


def test_the_figure_pattern():
    assert FIGURE.search("took 20 of 53 s") and FIGURE.search("12 of a 75 ms step") and FIGURE.search("13.6 GB")
    assert FIGURE.search("0.3 vs 58 GFLOP/s") and FIGURE.search("measured only 1.1x") and FIGURE.search("5x slower") and FIGURE.search("~60% padding")
    assert FIGURE.search("within 0.5 s") and DATE.search("(2026-12-03)")
    assert not FIGURE.search("a 49k vocab, 5x Llama's default, timeout_s, 3 rows, v1.2, 90s")
