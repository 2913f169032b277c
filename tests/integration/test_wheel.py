"""The wheel a user installs: built with ``python -m build``, installed into a fresh venv
outside the checkout, and ``seed-agents eval --env textworld`` plays a real game from it.

It checks what an editable install hides: that ``graphs/``, ``tools/`` and ``trainers/``
land inside the wheel as ``seed_agents.graphs``/``.tools``/``.trainers`` (and nowhere as bare
top-level packages), that the report page's template ships, and that the env entry points
resolve from the installed files. The fresh venv gets its third-party packages from this
venv's site-packages through a plain path line (no re-download of torch); the project
itself comes only from the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]


def _source_copy(target: Path) -> Path:
    """The checkout's files (tracked and new, not ignored), copied: setuptools writes build/
    and *.egg-info into the folder it builds, which must not be the checkout."""
    files = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        source = REPO / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def test_the_wheel_installs_and_plays_textworld_outside_the_checkout(tmp_path, tiny_model_dir):
    dist = tmp_path / "dist"
    source = _source_copy(tmp_path / "source")
    build = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(source)],
                           capture_output=True, text=True, timeout=900)
    assert build.returncode == 0, build.stdout[-2000:] + build.stderr[-2000:]
    (wheel,) = dist.glob("seed_agents-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"seed_agents"}, tops  # nothing a user's tools.py could shadow
    for path in ("seed_agents/graphs/env_agent.py", "seed_agents/tools/textworld.py", "seed_agents/tools/webshop/env.py",
                 "seed_agents/trainers/seed_trainer.py", "seed_agents/app/cli.py", "seed_agents/observe/report.html.j2"):
        assert path in names, path

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # Third-party packages from this venv (a plain path: its .pth files, the editable install's
    # finder among them, are not run), the project from the wheel alone.
    (site / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    install = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--target", str(site),
                              str(wheel)], capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stderr[-2000:]
    # TextWorld's own script, as pip would have installed it with the dependency
    tw_make = Path(sysconfig.get_path("scripts")) / "tw-make"
    (venv / "bin" / "tw-make").write_text(f"#!{python}\n" + tw_make.read_text().split("\n", 1)[1])
    (venv / "bin" / "tw-make").chmod(0o755)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"HOME": str(tmp_path / "home")}
    where = subprocess.run([str(python), "-c", "import seed_agents, seed_agents.tools; print(seed_agents.__file__)"],
                           cwd=elsewhere, env=env, capture_output=True, text=True, timeout=300)
    assert where.returncode == 0 and where.stdout.strip().startswith(str(site)), where.stdout + where.stderr

    out = elsewhere / "run"
    run = subprocess.run([str(python), "-m", "seed_agents", "eval", "--env", "textworld", "--model", tiny_model_dir,
                          "--episodes", "1", "--max-turns", "1", "--max-tokens", "4", "--out", str(out),
                          "--env-options", json.dumps({"cache_dir": str(elsewhere / "tw-cache")})],
                         cwd=elsewhere, env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads((out / "summary.json").read_text())["episodes"] == 1
