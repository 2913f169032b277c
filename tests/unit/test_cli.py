"""CLI config handling: bad input gets one clear error and exit code 2, never a traceback."""

import socket

import pytest

from seed_agents.app.cli import main
from seed_agents.metrics import summarize
from seed_agents.types import FaultKind, LLMCall, StopReason, Trajectory


def run_cli(capsys, *argv):
    code = main(list(argv))
    return code, capsys.readouterr()


@pytest.mark.parametrize("argv,message", [
    (["--temperature", "-1"], "sampling.temperature"),
    (["--episodes", "5", "--group", "2"], "multiple of group"),
    (["--episodes", "0"], "episodes"),
    (["--max-turns", "0"], "agent.max_turns"),
    (["--concurrency", "0"], "runner.concurrency"),
])
def test_out_of_range_values_get_one_clear_error(capsys, tmp_path, argv, message):
    code, out = run_cli(capsys, "eval", "--out", str(tmp_path / "run"), *argv)
    assert code == 2 and message in out.err and "Traceback" not in out.err
    assert not (tmp_path / "run").exists()  # nothing written for a rejected config


def test_yaml_with_unknown_key_is_rejected(capsys, tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("episodes: 2\nsampling:\n  temprature: 0.5\n")
    code, out = run_cli(capsys, "eval", "--config", str(cfg), "--out", str(tmp_path / "r"))
    assert code == 2 and "sampling.temprature" in out.err and "Extra inputs" in out.err


def test_unknown_env_lists_installed_ones(capsys, tmp_path):
    code, out = run_cli(capsys, "eval", "--env", "nope", "--out", str(tmp_path / "r"))
    assert code == 2 and "no environment named 'nope'" in out.err and "textworld" in out.err


def test_existing_run_is_not_overwritten(capsys, tmp_path):
    (tmp_path / "trajectories.jsonl").write_text("{}\n")
    code, out = run_cli(capsys, "eval", "--out", str(tmp_path))
    assert code == 2 and "--overwrite" in out.err
    assert (tmp_path / "trajectories.jsonl").read_text() == "{}\n"


def test_unreachable_vllm_server_is_a_clear_error(capsys, tmp_path, tiny_model_dir, monkeypatch):
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setattr("tools.textworld.TextWorldSuite.prepare", lambda self, tasks: None)
    code, out = run_cli(capsys, "eval", "--backend", "vllm", "--base-url", f"http://127.0.0.1:{port}",
                        "--model", "served", "--tokenizer", tiny_model_dir, "--episodes", "1",
                        "--out", str(tmp_path / "r"))
    assert code == 2 and f"127.0.0.1:{port}" in out.err and "seed-agents serve" in out.err


def test_summary_counts_policy_failures_as_failures_and_faults_apart():
    call = LLMCall(messages=[], prompt_ids=[1], completion_ids=[2, 3], logprobs=[-1.0, -1.0])
    trajs = [
        Trajectory(task_id="a", group_id="g", success=True, reward=1.0, steps=2, calls=[call, call]),
        Trajectory(task_id="a", group_id="g", steps=4, invalid_actions=2, stop_reason=StopReason.MAX_TURNS),
        Trajectory(task_id="b", group_id="h", stop_reason=StopReason.ERROR, error="boom"),
    ]
    assert trajs[2].fault == FaultKind.ENV  # an error record is typed as a fault, also when read back
    s = summarize(trajs, wall_s=2.0)
    # the policy's failure (max turns) counts; the crashed episode says nothing about the policy
    assert s["episodes"] == 3 and s["episodes_measured"] == 2 and s["success_rate"] == pytest.approx(1 / 2)
    assert s["faults"] == 1 and s["faults_by_kind"] == {"env": 1}
    assert s["mean_steps"] == 3.0 and s["invalid_action_rate"] == pytest.approx(2 / 6)
    assert s["errors"] == 1 and s["stop_reasons"] == {"done": 1, "max_turns": 1, "error": 1}
    assert s["completion_tokens"] == 4 and s["tokens_per_s"] == 2.0 and s["llm_calls"] == 2


def test_a_native_abort_of_the_cli_prints_every_threads_python_stack(tmp_path):
    """The exit abort left nothing to read; the CLI turns on faulthandler, so a native abort
    prints each thread's Python stack (here a thread parked in a named function)."""
    import subprocess
    import sys

    script = (
        "import os, threading, time\n"
        "from seed_agents.app.cli import main\n"
        "def parked_in_native_code(): time.sleep(60)\n"
        "threading.Thread(target=parked_in_native_code, daemon=True).start()\n"
        "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
        "time.sleep(0.2)\nos.abort()\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert out.returncode != 0
    assert "Fatal Python error: Aborted" in out.stderr and "parked_in_native_code" in out.stderr, out.stderr[-2000:]


def test_the_cli_runs_where_stderr_has_no_file_descriptor(monkeypatch, capsys):
    """A notebook's stderr has no fileno(): faulthandler cannot write there, and the CLI
    still runs."""
    import faulthandler
    import io

    monkeypatch.setattr(faulthandler, "is_enabled", lambda: False)
    monkeypatch.setattr("sys.stderr", io.StringIO())
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "usage" in capsys.readouterr().out
