"""The README's "wrap your own graph" example runs as written, with real SmolLM2 weights."""

import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"


def test_readme_wrap_example_runs_and_captures(smollm2_dir, capsys):
    text = README.read_text()
    block = re.search(r"<!-- readme-example:wrap -->\n```python\n(.*?)```", text, re.S)
    assert block, "README lost its tested example"
    scope: dict = {}
    exec(compile(block.group(1), "README.md", "exec"), scope)
    cap = scope["cap"]
    assert len(cap.calls) >= 1
    for call in cap.calls:
        assert call.prompt_ids and call.completion_ids and len(call.logprobs) == len(call.completion_ids)
        assert all(lp <= 0.0 for lp in call.logprobs) and call.scope["run"] == "demo"
        assert call.tools and {t["function"]["name"] for t in call.tools} == {"add", "multiply"}
    assert "prompt ids ->" in capsys.readouterr().out
