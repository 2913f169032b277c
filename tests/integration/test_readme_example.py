"""The README's "Wrap your agent" example runs as written, with real SmolLM2 weights, and
then trains for a few updates as "Train your graph" says."""

import re
from pathlib import Path

import pytest

from tests.unit.test_train_your_graph import check_run, train_readme_graph

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_wrap_example_runs_and_captures(smollm2_dir, capsys):
    text = README.read_text()
    block = re.search(r"<!-- readme-example:wrap -->\n```python\n(.*?)```", text, re.S)
    assert block, "README lost its tested example"
    scope: dict = {"__name__": "__main__"}
    exec(compile(block.group(1), "README.md", "exec"), scope)
    cap = scope["cap"]
    assert len(cap.calls) >= 1
    for call in cap.calls:
        assert call.prompt_ids and call.completion_ids and len(call.logprobs) == len(call.completion_ids)
        assert all(lp <= 0.0 for lp in call.logprobs) and call.scope["run"] == "demo"
        assert call.tools and {t["function"]["name"] for t in call.tools} == {"add", "multiply"}
    assert "prompt ids ->" in capsys.readouterr().out


def test_readme_wrap_example_trains_a_few_updates(smollm2_dir, tmp_path, monkeypatch, capsys):
    """The same agent saved as my_agent.py, trained two updates with the README's config
    (SmolLM2, the default settings but for the batch's size): the summary, the PNG and the
    metrics rows, as the tiny-model test checks them."""
    flags = ["--backend.model", smollm2_dir, "--iterations", "2", "--num-tasks", "2", "--tasks-per-iteration", "1",
             "--runner.group-size", "2", "--no-runner.progress", "--sampling.max-tokens", "64",
             "--skills.max-tokens", "64", "--eval.num-tasks", "2"]
    out = train_readme_graph(tmp_path, monkeypatch, flags)
    check_run(out, updates=2, printed=capsys.readouterr().out)
