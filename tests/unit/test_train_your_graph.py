"""A user's own graph trained as the README says, on a tiny model: the README's agent (its own
tools and reward, saved as ``my_agent.py``), its own tasks, the README's config with an
``eval`` section, ``seed-agents train`` for two updates; then what the run says it did."""

import json
import re
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")

from langchain_core.messages import AIMessage  # noqa: E402

from seed_agents.app.cli import main  # noqa: E402
from seed_agents.types import Task  # noqa: E402

README = Path(__file__).resolve().parents[2] / "README.md"

QUESTIONS = [("What is {a} + {b}? Use the tools.", "add", lambda a, b: a + b),
             ("What is {a} times {b}? Use the tools.", "multiply", lambda a, b: a * b)]


def readme_block(name: str, lang: str) -> str:
    block = re.search(rf"<!-- readme-example:{name} -->\n```{lang}\n(.*?)```", README.read_text(), re.S)
    assert block, f"README lost its tested {name} example"
    return block.group(1)


def user_tasks(split: str, n: int) -> list[dict]:
    """The user's own tasks, each naming the call that solves it (``data["calls"]``)."""
    tasks = []
    for i in range(n):
        question, tool, op = QUESTIONS[i % 2]
        a, b = 3 + i, 4 + 2 * i
        tasks.append({"task_id": f"{split}-{i}", "split": split,
                      "data": {"question": question.format(a=a, b=b), "answer": op(a, b),
                               "calls": [{"name": tool, "args": {"a": a, "b": b}}]}})
    return tasks


def user_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heldout: list[dict] | None = None) -> None:
    """The user's folder, the working directory from here on: my_agent.py (the README's
    agent), mine.yaml (the README's config), train.jsonl and heldout.jsonl (their tasks)."""
    (tmp_path / "my_agent.py").write_text(readme_block("wrap", "python"))
    (tmp_path / "mine.yaml").write_text(readme_block("train", "yaml"))
    for name, tasks in (("train.jsonl", user_tasks("train", 4)), ("heldout.jsonl", heldout or user_tasks("heldout", 4))):
        (tmp_path / name).write_text("".join(json.dumps(t) + "\n" for t in tasks))
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "my_agent", raising=False)


def train_readme_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flags: list[str]) -> Path:
    """``seed-agents train --config mine.yaml --out runs/mine`` in the user's folder; the run dir."""
    user_folder(tmp_path, monkeypatch)
    assert main(["train", "--config", "mine.yaml", "--out", "runs/mine", *flags]) == 0
    return tmp_path / "runs" / "mine"


def lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def check_run(out: Path, updates: int, printed: str) -> dict:
    """The summary (printed and in summary.json) agrees with the run's own records; the
    learning curve is a PNG; metrics.jsonl has one row per update."""
    summary = json.loads((out / "summary.json").read_text())
    metrics = lines(out / "metrics.jsonl")
    assert [m["iteration"] for m in metrics] == list(range(updates))
    assert summary["updates"] == summary["iterations"] == updates
    assert summary["training_success"] == [m["success_rate"] for m in metrics]
    rows = lines(out / "eval.jsonl")
    assert [r["updates"] for r in rows] == list(range(updates + 1))  # before the first update and after each
    held = summary["heldout"]
    assert held["temperature"] == 0.0 and held["tool_measure"] == "right_tool"  # every held-out task names its call
    for end, row in (("before", rows[0]), ("after", rows[-1])):
        assert held[end]["updates"] == row["updates"] and held[end]["success_rate"] == row["success_rate"]
        assert held[end]["episodes"] == row["episodes_measured"]
        assert 0.0 <= held[end]["tool_share"] <= 1.0 and held[end]["answers"] <= row["episodes_measured"]
        assert held[end]["markup_share"] is None or 0.0 <= held[end]["markup_share"] <= 1.0
    assert held["gain"] == pytest.approx(rows[-1]["success_rate"] - rows[0]["success_rate"])
    per_tool = held["after"]["per_tool"]  # each held-out task names one call
    assert set(per_tool) <= {"add", "multiply"} and sum(c["needed"] for c in per_tool.values()) == rows[-1]["episodes_measured"]
    assert summary["wall_s"] >= summary["train_s"] > 0
    png = Path(summary["learning_curve"])
    assert png.resolve() == (out / "learning_curve.png").resolve() and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Path(summary["run_dir"]).resolve() == out.resolve() and f"summary of {summary['run_dir']}" in printed
    for line in ("held-out success (greedy, ", "called every tool its task names: ", "answers with chat-template markup: ",
                 "training success per update: ", "wall time: ", f"learning curve: {summary['learning_curve']}"):
        assert line in printed, line
    return summary


TINY = ["--num-tasks", "2", "--tasks-per-iteration", "1", "--runner.group-size", "2", "--no-runner.progress",
        "--sampling.max-tokens", "8", "--skills.max-tokens", "16", "--skills.answer-format", "described",
        "--eval.num-tasks", "2"]
"""A batch the tiny model plays in seconds (with ``--backend.model`` set to it)."""


def test_a_users_graph_trains_from_the_readme_and_ends_with_its_summary(tmp_path, tiny_model_dir, monkeypatch, capsys):
    out = train_readme_graph(tmp_path, monkeypatch, ["--backend.model", tiny_model_dir, *TINY, "--iterations", "2"])
    check_run(out, updates=2, printed=capsys.readouterr().out)


def test_the_readme_reward_pays_for_the_number_in_words_a_user_can_read(tmp_path, monkeypatch):
    user_folder(tmp_path, monkeypatch)
    import my_agent

    task = Task(task_id="t", data={"question": "What is 3 + 4?", "answer": 7})
    for answer, reward in (("It is 7.", 1.0), ("3 + 4 = 7.0", 1.0), ("It is 17.", 0.0), ("7, or 8", 0.0),
                           ("<tool_response>\n7\n</tool_response>", 0.0), ("<tool_response>\n7", 0.0)):
        assert my_agent.reward(task, {"messages": [AIMessage(answer)]}) == reward, answer


def test_a_held_out_task_whose_calls_are_malformed_stops_the_run_before_it_starts(tmp_path, tiny_model_dir, monkeypatch,
                                                                                  capsys):
    """A typo in ``data["calls"]`` would read as a task that needs no tool: one line naming the task."""
    bad = {**user_tasks("heldout", 1)[0], "task_id": "h-typo"}
    bad["data"]["calls"] = {"name": "add"}
    user_folder(tmp_path, monkeypatch, heldout=[bad])
    assert main(["train", "--config", "mine.yaml", "--out", "runs/mine", "--backend.model", tiny_model_dir, *TINY,
                 "--iterations", "1"]) == 2
    assert "held-out task 'h-typo': data[\"calls\"] must be a list" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "mine").exists()
