"""A user's own ``tools.py``, ``graphs.py`` and ``trainers.py`` never shadow ours.

Agent projects very often have a ``tools.py``; the README asks for graphs given by import
path, so that folder is on ``PYTHONPATH``. When our packages installed as bare ``tools``,
``graphs`` and ``trainers``, ``seed-agents eval --env textworld`` died there with
``ModuleNotFoundError: No module named 'tools.textworld'; 'tools' is not a package``. They
install inside the ``seed_agents`` namespace now: the CLI plays a real TextWorld game from
such a folder, and both the user's modules and ours import side by side.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

USER_FILES = {
    "tools.py": "MINE = 'tools'\ndef lookup(x):\n    return x\n",
    "graphs.py": "MINE = 'graphs'\n",
    "trainers.py": "MINE = 'trainers'\n",
}


@pytest.fixture
def project(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A user's agent project: its own top-level tools/graphs/trainers modules, on the path,
    and the working directory of every command below."""
    folder = tmp_path / "my_agent"
    folder.mkdir()
    for name, text in USER_FILES.items():
        (folder / name).write_text(text)
    env = {**os.environ, "PYTHONPATH": str(folder), "HOME": str(tmp_path / "home")}
    return folder, env


def python_in(project: tuple[Path, dict[str, str]], code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in the user's project folder, with it on the path; it must succeed."""
    folder, env = project
    run = subprocess.run([sys.executable, "-c", code], cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run


def test_user_modules_and_ours_import_side_by_side(project):
    code = ("import tools, graphs, trainers\n"
            "import seed_agents.tools.openapi, seed_agents.tools.textworld, seed_agents.graphs.calculator\n"
            "import seed_agents.trainers.weight_sync\n"
            "from seed_agents.envs import load_env_suite\n"
            "print(tools.MINE, graphs.MINE, trainers.MINE, type(load_env_suite('textworld')).__name__)\n")
    run = python_in(project, code)
    assert run.stdout.split() == ["tools", "graphs", "trainers", "TextWorldSuite"]


def test_the_cli_plays_textworld_from_a_project_with_its_own_tools_py(project, tiny_model_dir):
    folder, env = project
    out = folder / "run"
    argv = [sys.executable, "-m", "seed_agents", "eval", "--env", "textworld", "--model", tiny_model_dir,
            "--episodes", "1", "--max-turns", "1", "--max-tokens", "4", "--out", str(out),
            "--env-options", json.dumps({"cache_dir": str(folder / "tw-cache")})]
    run = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["episodes"] == 1 and summary["errors"] == 0


def test_an_old_layout_import_path_still_loads_with_one_deprecation_line(project):
    """A config written before the move (``graphs.calculator:...``) still loads ours, with a
    warning; a user's own module under one of those names is imported as written."""
    code = ("import warnings\n"
            "from seed_agents.imports import load_object\n"
            "with warnings.catch_warnings(record=True) as seen:\n"
            "    warnings.simplefilter('always')\n"
            "    build = load_object('graphs.calculator:build_react_calculator')\n"
            "    mine = load_object('tools:lookup')\n"
            "print(build.__module__, mine.__module__, len(seen), str(seen[0].message).count(chr(10)))\n")
    run = python_in(project, code)
    assert run.stdout.split() == ["seed_agents.graphs.calculator", "tools", "1", "0"]
