"""bench/preregistration.py: a preregistered run starts only from a committed, unmodified file,
takes its settings from it, and its result file records the commit; no training."""

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from bench import preregistration as prereg

ROOT = Path(__file__).resolve().parents[2]


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root, check=True,
                   capture_output=True)


@pytest.fixture
def repo(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "bench" / "preregistered").mkdir(parents=True)
    return tmp_path


def _write(repo: Path, settings: dict, bench: str = "learning_curve") -> Path:
    path = repo / "bench" / "preregistered" / "cmp.yaml"
    path.write_text(yaml.safe_dump({"bench": bench, "why": "a test", "settings": settings}))
    return path


def test_only_a_committed_unmodified_file_under_the_folder_loads(repo):
    path = _write(repo, {"split": "test", "seeds": [0, 1]})
    with pytest.raises(prereg.PreregistrationError, match="not committed"):
        prereg.load(path, "learning_curve", root=repo)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "prereg")
    loaded = prereg.load(path, "learning_curve", root=repo)
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True,
                          check=True).stdout.strip()
    assert loaded.record()["path"] == "bench/preregistered/cmp.yaml" and loaded.record()["commit"] == head
    assert loaded.argv() == ["--seeds", "0,1", "--split", "test"]  # safe_dump sorted the keys
    with pytest.raises(prereg.PreregistrationError, match="not 'main_job'"):
        prereg.load(path, "main_job", root=repo)
    path.write_text(path.read_text() + "# edited\n")
    with pytest.raises(prereg.PreregistrationError, match="differs from its last commit"):
        prereg.load(path, "learning_curve", root=repo)
    elsewhere = repo / "cmp.yaml"
    elsewhere.write_text("bench: learning_curve\n")
    with pytest.raises(prereg.PreregistrationError, match="under bench/preregistered/"):
        prereg.load(elsewhere, "learning_curve", root=repo)


def test_the_command_line_may_add_only_where_it_runs():
    assert prereg.split_argv(["--seeds", "0"]) == (None, ["--seeds", "0"])
    assert prereg.split_argv(["--preregistered", "f.yaml", "--work", "w", "--note=x"]) == ("f.yaml", ["--work", "w",
                                                                                                     "--note=x"])
    with pytest.raises(prereg.PreregistrationError, match="not --seeds"):
        prereg.split_argv(["--preregistered=f.yaml", "--seeds", "0"])


def test_a_preregistration_counts_only_when_committed_before_the_run():
    record = {"committed_at": "2026-12-08T03:00:00+00:00"}
    assert prereg.older_than(record, "2026-12-08T03:00:01+00:00")
    assert not prereg.older_than(record, "2026-12-08T03:00:00+00:00")
    assert not prereg.older_than(record, "2026-12-08T03:30:00+01:00")  # 02:30 UTC: compared as instants
    assert prereg.older_than(record, "2026-12-08T03:30:00+00:00") and not prereg.older_than(record, None)


def test_the_committed_headline_preregistration_parses_as_the_curves_flags_on_the_test_split():
    from bench.learning_curve import build_parser

    for path in sorted((ROOT / "bench" / "preregistered").glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        file = prereg.Preregistration(path.name, "", "", doc["settings"])
        args = build_parser().parse_args(file.argv())
        assert doc["bench"] == "learning_curve" and args.split == "test" and doc["why"]


def test_a_preregistered_curve_takes_the_files_settings_and_records_its_commit(repo, tmp_path, monkeypatch, capsys):
    import bench.learning_curve as lc

    path = _write(repo, {"methods": "grpo", "seeds": [0], "updates": 2, "train_tasks": 4, "heldout": 3,
                         "split": "test", "result_name": "learning_curve_prereg"})
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "prereg")
    monkeypatch.setattr(lc, "load_preregistration", lambda p, bench: prereg.load(p, bench, root=repo))

    def fake_run_one(config, out, log, revision=1):
        assert "/test-L0.jsonl" in config["eval"]["tasks"]
        out.mkdir(parents=True, exist_ok=True)
        (out / "metrics.jsonl").write_text(json.dumps({"iteration": 0, "success_rate": 0.25}) + "\n")
        return 1.0

    scores = {u: {f"atlas-test-L0-00{i}": {"parsed": True, "right_calls": ok, "right_answer": ok, "fault": False}
                  for i in range(3)} for u, ok in ((0, False), (2, True))}
    monkeypatch.setattr(lc, "run_one", fake_run_one)
    monkeypatch.setattr(lc, "heldout_scores", lambda out, heldout: scores)
    where = ["--work", str(tmp_path / "w"), "--results-dir", str(tmp_path / "r")]
    with pytest.raises(SystemExit) as refused:
        lc.main(["--preregistered", str(path), "--lr", "1e-3", *where])
    assert refused.value.code == 2 and "not --lr" in capsys.readouterr().err
    lc.main(["--preregistered", str(path), *where])
    config = json.loads((tmp_path / "r" / "learning_curve_prereg.json").read_text())["config"]
    assert config["split"] == "test" and config["heldout"] == 3 and config["seeds"] == [0]
    assert config["preregistration"] == prereg.load(path, "learning_curve", root=repo).record()
    assert "preregistered" not in config


def test_a_preregistration_on_another_split_is_refused(repo, tmp_path, monkeypatch, capsys):
    import bench.learning_curve as lc

    path = _write(repo, {"split": "validation"})
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "prereg")
    monkeypatch.setattr(lc, "load_preregistration", lambda p, bench: prereg.load(p, bench, root=repo))
    with pytest.raises(SystemExit) as refused:
        lc.main(["--preregistered", str(path), "--work", str(tmp_path / "w")])
    assert refused.value.code == 2 and "reads test" in capsys.readouterr().err


def test_the_headline_preregistration_keeps_the_exploratory_runs_settings_but_seeds_split_and_name():
    """The file says its settings are the held-out figure's: hold it to that."""
    from bench.learning_curve import build_parser

    doc = yaml.safe_load((ROOT / "bench" / "preregistered" / "seed_success_vs_grpo_test.yaml").read_text())
    args = vars(build_parser().parse_args(prereg.Preregistration("", "", "", doc["settings"]).argv()))
    args["methods"] = args["methods"].split(",")
    stored = json.loads((ROOT / "docs" / "results" / "learning_curve_t05_const_seed_success_opd01.json").read_text())
    differ = {key for key, value in stored["config"].items() if key in args and args[key] != value}
    assert differ == {"seeds", "result_name", "note", "work", "heldout", "train_tasks"}
    assert args["split"] == "test" and len(doc["settings"]["seeds"]) == 8
