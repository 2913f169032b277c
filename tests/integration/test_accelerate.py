"""SEEDTrainer under ``accelerate launch`` with 2 CPU processes (gloo): DDP keeps ranks in step.

Each rank plays its own slice of the tasks (whole groups, different samples); after the
optimizer steps every rank must hold bit-identical weights. A rank whose episodes all fail
must bring the run down quickly rather than leave its peer waiting in a collective.
The work is in ``accelerate_smoke.py``; ~1 min for the training run, ~40 s for the failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("accelerate")
pytest.importorskip("trl")
pytest.importorskip("datasets")

from seed_agents.serve import free_port  # noqa: E402

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
SMOKE = Path(__file__).with_name("accelerate_smoke.py")
TIMEOUT_S = 240


def launch(tmp_path: Path, *script_args: str, timeout: float = TIMEOUT_S) -> tuple[int, str]:
    """``accelerate launch`` 2 processes; return (exit code, combined output).

    ``--multi_gpu`` selects accelerate's torchrun launcher (``--cpu`` alone starts a single
    process without mpirun); the script's ``use_cpu=True`` makes the group gloo on CPU.
    """
    hf_home = tmp_path / "hf-home"  # no user accelerate config, no hub cache, no network
    # torchrun's elastic agent keeps a torchelastic_* folder in the temp directory and never
    # deletes it; under the test's own folder it goes with the test's other leftovers
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    env = {**os.environ, "TMPDIR": str(tmp), "HF_HOME": str(hf_home), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_DATASETS_CACHE": str(hf_home / "datasets"), "CUDA_VISIBLE_DEVICES": "",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1"}
    cmd = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
           "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
           "--main_process_port", str(free_port()), str(SMOKE), *script_args]
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)  # its own group: a timeout kills the ranks too
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"accelerate launch still running after {timeout:.0f}s (a rank hung?):\n{out[-6000:]}")
    return proc.returncode, out


def test_two_cpu_ranks_train_seed_in_lockstep(tiny_model_dir, tmp_path):
    report_path = tmp_path / "report.json"
    code, out = launch(tmp_path, str(report_path), "--model-dir", tiny_model_dir, "--steps", "2")
    assert code == 0, out[-6000:]
    r = json.loads(report_path.read_text())
    assert r["world_size"] == 2 and r["backend"] == "gloo" and "MULTI_CPU" in r["distributed_type"]
    assert r["steps"] == 2 and [x["steps"] for x in r["ranks"]] == [2, 2]
    assert r["params_changed"], "no parameter changed after two SEED steps"
    assert len(r["param_sha256"]) == 2 and len(set(r["param_sha256"])) == 1, r["param_sha256"]
    assert len([e for e in r["log_history"] if "loss" in e]) == 2

    rank0, rank1 = (x["iterations"] for x in r["ranks"])
    assert len(rank0) == len(rank1) == 2
    for a, b in zip(rank0, rank1):
        for it in (a, b):  # whole groups on each rank: 2 tasks x G=4 episodes, one row each
            assert (it["episodes"], it["groups"], it["rows"]) == (8, 2, 8), it
        assert not set(a["tasks"]) & set(b["tasks"]), "a task was split across ranks"
        # different samples per rank: identical weights come from the all-reduce
        assert a["completions_sha256"] != b["completions_sha256"]


def test_a_rank_without_rows_fails_the_run_instead_of_hanging(tiny_model_dir, tmp_path):
    code, out = launch(tmp_path, str(tmp_path / "report.json"), "--model-dir", tiny_model_dir,
                       "--steps", "1", "--broken-rank", "1", timeout=180)
    assert code != 0
    # every episode of that rank is an env fault: the fault budget stops it before any update
    assert "ended in infrastructure faults" in out
    assert not (tmp_path / "report.json").exists()
