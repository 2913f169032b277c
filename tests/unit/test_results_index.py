"""docs/results/README.md, the index of the result files, is the one scripts/results_index.py
prints from them: a result file added, renamed or cited elsewhere without regenerating it fails."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("results_index", ROOT / "scripts" / "results_index.py")
index = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(index)


def test_the_committed_index_matches_the_result_files(capsys):
    assert index.main(["--check"]) == 0, capsys.readouterr().err


def checkout(tmp_path: Path) -> Path:
    (tmp_path / "bench").mkdir()
    (tmp_path / "bench" / "demo_speed.py").write_text("")
    (tmp_path / "bench" / "demo.py").write_text("")
    results = tmp_path / "docs" / "results"
    results.mkdir(parents=True)
    doc = {"code": {"git_rev": "0123456789abcdef", "dirty": True}, "config": {}, "results": {}}
    (results / "demo_speed_avx2.json").write_text(json.dumps(doc))
    (tmp_path / "docs" / "benchmarks.md").write_text(
        "# Benchmarks\n\n```bash\n# not a heading\n```\n\n## Speed\n\n"
        "<!-- results:demo_speed_avx2 -->\n<!-- /results:demo_speed_avx2 -->\n")
    (tmp_path / "README.md").write_text("# x\n")
    return tmp_path


def test_a_row_names_the_script_the_commit_and_the_section_that_cites_the_file(tmp_path):
    root = checkout(tmp_path)
    text = index.render(root)
    assert ("| `demo_speed_avx2.json` | `bench/demo_speed.py` | not recorded | `0123456` + changes | "
            "[benchmarks.md: Speed](../benchmarks.md#speed) |") in text


def test_a_new_file_fails_the_check_until_the_index_is_regenerated(tmp_path, capsys):
    root = checkout(tmp_path)
    assert index.main(["--root", str(root)]) == 0 and index.main(["--root", str(root), "--check"]) == 0
    doc = {"code": {"git_rev": "fedcba9876543210"}, "config": {"command": "bench/demo.py --fast"}, "results": {}}
    (root / "docs" / "results" / "demo.json").write_text(json.dumps(doc))
    assert index.main(["--root", str(root), "--check"]) == 1
    assert index.main(["--root", str(root)]) == 0
    text = (root / "docs" / "results" / "README.md").read_text()
    assert "| `demo.json` | `bench/demo.py` | `bench/demo.py --fast` | `fedcba9` | cited by no page |" in text
