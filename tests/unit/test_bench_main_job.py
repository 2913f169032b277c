"""bench/main_job.py's --split: the flags it adds name task sources that exist and hold enough tasks."""

import importlib
import json

import pytest

from bench import main_job


@pytest.mark.parametrize("split", ["validation", "test"])
def test_a_split_points_both_sides_evaluations_at_its_tasks(split, tmp_path, monkeypatch):
    seen = {}

    def fake_side(name, flags, work):
        seen[name] = flags
        return {"exit": 0, "wall_s": 1.0, "peak_rss_gb": 1.0, "summary": {}, "code": {}, "log_tail": []}

    monkeypatch.setattr(main_job, "run_side", fake_side)
    monkeypatch.setattr(main_job, "stop_children_on_sigterm", lambda: None)
    main_job.main(["--split", split, "--work", str(tmp_path / "w"), "--results-dir", str(tmp_path / "r")])
    flags = main_job.SPLIT_FLAGS[split]
    assert all(side[-4:] == flags for side in seen.values()) and seen["grpo"][:2] == ["--skills.source", "none"]
    config = json.loads((tmp_path / "r" / "main_job.json").read_text())["config"]
    assert config["split"] == split and config["sides"] == seen
    module, _, fn = flags[1].partition(":")
    tasks = getattr(importlib.import_module(module), fn)()
    assert len(tasks) == int(flags[3]) and {t.split for t in tasks} == {split}


def test_the_default_adds_no_flag():
    assert main_job.SPLIT_FLAGS["heldout"] == []
