"""A folder or module named like a dependency is one line naming it and the fix, before
anything imports the dependency; ``serve --work-dir`` never makes one.

The reported case: ``serve --work-dir ./vllm`` left a ``vllm/`` folder (log, caches), and
``PYTHONPATH=. seed-agents continual`` from there died in ``import trl.trainer.grpo_trainer``
with ``Invalid version: 'N/A'``: vLLM lives in its own venv, so the folder was the only
``vllm`` on the path, and TRL took it for an install without a version.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from seed_agents.app.commands.serve import ServeConfig
from seed_agents.serve import VLLMServer
from seed_agents.shadowing import DEPENDENCIES, Shadow, find_shadows, shadowing_name

REPO = Path(__file__).resolve().parents[2]
VLLM_INSTALLED = importlib.util.find_spec("vllm") is not None


def _serve_work_dir(folder: Path) -> Path:
    """What ``serve --work-dir FOLDER`` leaves there: its log and vLLM's caches, no Python."""
    for sub in ("vllm-cache", "inductor-cache", "tmp"):
        (folder / sub).mkdir(parents=True)
    (folder / "vllm-server.log").write_text("$ python -m vllm.entrypoints.openai.api_server\n")
    return folder


def _in(folder: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` from ``folder`` with the docs' ``PYTHONPATH=.`` (and this checkout after it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([".", str(REPO)])}
    return subprocess.run(argv, check=False, cwd=folder, env=env, capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(VLLM_INSTALLED, reason="vllm is installed here: a plain vllm/ folder cannot stand in for it")
def test_a_vllm_work_dir_is_what_breaks_trl(tmp_path):
    """The mechanism: TRL finds the folder as vllm and reads no version for it."""
    pytest.importorskip("trl")
    _serve_work_dir(tmp_path / "vllm")
    probe = _in(tmp_path, sys.executable, "-c", "from trl.import_utils import is_vllm_available; is_vllm_available()")
    assert probe.returncode != 0 and "Invalid version: 'N/A'" in probe.stderr, probe.stderr[-2000:]


@pytest.mark.skipif(VLLM_INSTALLED, reason="vllm is installed here: a plain vllm/ folder cannot stand in for it")
@pytest.mark.parametrize("command", [["continual", "--help"], ["--debug", "train", "--config", "missing.yaml"]])
def test_the_cli_names_a_vllm_folder_in_one_line_before_it_imports_anything(tmp_path, command):
    _serve_work_dir(tmp_path / "vllm")
    done = _in(tmp_path, sys.executable, "-m", "seed_agents", *command)
    assert done.returncode == 2, done.stdout[-500:] + done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and not done.stdout, done.stderr
    name = next(arg for arg in command if not arg.startswith("-"))
    assert lines[0].startswith(f"seed-agents {name}: error: ./vllm (a folder in the working directory)"), lines[0]
    assert "rename or move it, or run from another folder" in lines[0]


def test_the_cli_names_a_module_that_shadows_an_installed_package(tmp_path):
    (tmp_path / "trl.py").write_text("raise SystemExit('the user module was imported')\n")
    done = _in(tmp_path, sys.executable, "-m", "seed_agents", "eval", "--help")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "./trl.py (a file in the working directory) shadows the installed trl package" in done.stderr


def test_a_plain_folder_beside_an_installed_package_is_harmless(tmp_path):
    """A folder without __init__.py loses to a regular package anywhere on the path: a data
    folder named datasets, next to the installed datasets, is no error."""
    for name in ("torch", "transformers", "datasets"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "notes.txt").write_text("data, not code\n")
    done = _in(tmp_path, sys.executable, "-m", "seed_agents", "eval", "--help")
    assert done.returncode == 0, done.stderr[-2000:]


def test_this_interpreter_has_no_shadow():
    """The checkout on the path, the editable install and site-packages shadow nothing."""
    assert find_shadows() == []


# -- the check itself, on made-up packages and a made-up path --------------------------------


def _install(site: Path, name: str, *, files: dict[str, str], editable: Path | None = None) -> None:
    """A distribution ``name`` whose metadata sits in ``site`` (and its ``files`` too)."""
    info = site / f"{name}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    if editable is not None:
        (info / "direct_url.json").write_text(json.dumps({"url": editable.as_uri(), "dir_info": {"editable": True}}))
    for rel, text in files.items():
        (site / rel).parent.mkdir(parents=True, exist_ok=True)
        (site / rel).write_text(text)


def _shadows(path: list[Path], name: str) -> list[Shadow]:
    importlib.invalidate_caches()
    return find_shadows([str(p) for p in path], names={name: name})


def test_a_module_or_package_before_the_installed_one_shadows_it(tmp_path):
    site, mine = tmp_path / "site", tmp_path / "mine"
    _install(site, "fakepkg", files={"fakepkg/__init__.py": ""})
    mine.mkdir()
    assert _shadows([mine, site], "fakepkg") == []
    (mine / "fakepkg.py").write_text("")
    assert _shadows([mine, site], "fakepkg") == [Shadow("fakepkg", mine / "fakepkg.py", site)]
    assert _shadows([site, mine], "fakepkg") == []  # after the installed one it is never imported


def test_a_plain_folder_shadows_only_what_is_not_installed(tmp_path):
    site, mine = tmp_path / "site", tmp_path / "mine"
    _install(site, "fakepkg", files={"fakepkg/__init__.py": ""})
    (mine / "fakepkg").mkdir(parents=True)
    (mine / "absent").mkdir()
    assert _shadows([mine, site], "fakepkg") == []
    assert _shadows([mine, site], "absent") == [Shadow("absent", mine / "absent", None)]


def test_an_editable_install_is_its_own_package(tmp_path):
    site, checkout, mine = tmp_path / "site", tmp_path / "checkout", tmp_path / "mine"
    _install(site, "fakepkg", files={}, editable=checkout)
    (checkout / "src" / "fakepkg").mkdir(parents=True)
    (checkout / "src" / "fakepkg" / "__init__.py").write_text("")
    assert _shadows([checkout / "src", site], "fakepkg") == []
    (mine / "fakepkg").mkdir(parents=True)
    (mine / "fakepkg" / "__init__.py").write_text("")
    assert _shadows([mine, checkout / "src", site], "fakepkg") == [Shadow("fakepkg", mine / "fakepkg", site)]


def test_a_namespace_dependency_is_shadowed_only_by_a_submodule_it_has(tmp_path):
    """langgraph is a namespace package: every langgraph/ folder on the path joins it."""
    site, mine = tmp_path / "site", tmp_path / "mine"
    _install(site, "nspkg", files={"nspkg/graph.py": "", "nspkg/channels/__init__.py": ""})
    (mine / "nspkg").mkdir(parents=True)
    (mine / "nspkg" / "run.log").write_text("")
    (mine / "nspkg" / "extra.py").write_text("")
    assert _shadows([mine, site], "nspkg") == []
    (mine / "nspkg" / "graph.py").write_text("")
    assert _shadows([mine, site], "nspkg") == [Shadow("nspkg.graph", mine / "nspkg", site)]


def test_the_line_names_the_file_and_the_fix(tmp_path):
    (tmp_path / "vllm").mkdir()
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "torch.py").write_text("")
    line = Shadow("vllm", tmp_path / "vllm", None).message(cwd=tmp_path, pythonpath=[])
    assert line == ("./vllm (a folder in the working directory) would be imported as vllm, which is not installed here: "
                    "libraries that probe for vllm take it for the package; rename or move it, or run from another folder")
    line = Shadow("torch", tmp_path / "lib" / "torch.py", Path("/site")).message(cwd=tmp_path / "lib" / "x",
                                                                                    pythonpath=[str(tmp_path / "lib")])
    assert line == f"{tmp_path / 'lib' / 'torch.py'} (a file on PYTHONPATH) shadows the installed torch package (/site); " \
                   "rename or move it"


# -- serve --work-dir -------------------------------------------------------------------------


def test_serve_refuses_a_work_dir_that_would_shadow_and_creates_nothing(tmp_path):
    done = _in(tmp_path, sys.executable, "-m", "seed_agents", "serve", "--work-dir", "./vllm",
               "--model", "does-not-exist-model", "--vllm-python", str(tmp_path / "no-python"))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "--work-dir vllm would be imported as the vllm package" in done.stderr
    assert str(tmp_path / "vllm-work") in done.stderr  # the fix: a name that imports as nothing
    assert not (tmp_path / "vllm").exists()


def test_which_work_dirs_would_shadow(tmp_path):
    entries = [str(tmp_path / "project")]
    assert shadowing_name(tmp_path / "project" / "vllm", path=entries) == "vllm"
    assert shadowing_name(tmp_path / "project" / "torch", path=entries) == "torch"
    assert shadowing_name(tmp_path / "project" / "vllm-work", path=entries) is None
    assert shadowing_name(tmp_path / "elsewhere" / "vllm", path=entries) is None  # not on the path: nothing imports it


def test_serve_never_defaults_to_a_work_dir_that_shadows(tmp_path, monkeypatch):
    """Unset, the work dir is a new temporary folder whose name is no module name at all."""
    assert ServeConfig().work_dir is None
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    server = VLLMServer(str(tmp_path), port=9, worker_extension=False)
    assert server.work_dir.parent == tmp_path and not server.work_dir.name.isidentifier(), server.work_dir
    assert shadowing_name(server.work_dir, path=[str(tmp_path)]) is None
    assert server.work_dir.name not in DEPENDENCIES
