"""Faults never become training signal.

A graph whose tool raises or hangs, a reward that raises, and a model server that is not
there (or dies mid-run): every such episode is recorded and counted by kind, but makes no
training row and takes no part in a group's advantage statistics; past the fault budget
the run stops with a non-zero exit instead of training on what is left.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from seed_agents.backends.vllm import VLLMBackend
from seed_agents.chat_model import SeedChatModel
from seed_agents.distill import group_advantages
from seed_agents.runner import EpisodeRunner, FaultBudgetExceeded, RunnerConfig, check_fault_budget
from seed_agents.serve import free_port
from seed_agents.testing import FakeBackend, ScriptedServer, build_faulty_agent, faulty_reward, faulty_train_config
from seed_agents.types import FaultKind, SamplingParams, StopReason, Task, Trajectory


def tasks_with(*faults: str | None) -> list[Task]:
    return [Task(task_id=f"t{i}-{f or 'ok'}", data={"fault": f} if f else {}) for i, f in enumerate(faults)]


def faulty_runner(llm, *, group_size=2, concurrency=8, timeout_s=2.0) -> EpisodeRunner:
    cfg = RunnerConfig(group_size=group_size, concurrency=concurrency, episode_timeout_s=timeout_s, progress=False)
    return EpisodeRunner(build_faulty_agent(llm), cfg, reward_fn=faulty_reward,
                         make_input=lambda task: {"task": task})


def fake_llm(tokenizer, replies=("ab", "abc")) -> SeedChatModel:
    return SeedChatModel(backend=FakeBackend(tokenizer, list(replies)), tokenizer=tokenizer,
                         sampling=SamplingParams(max_tokens=8))


def test_each_fault_is_typed_and_keeps_its_calls(tokenizer):
    runner = faulty_runner(fake_llm(tokenizer), group_size=1, timeout_s=0.5)
    trajs = asyncio.run(runner.run(tasks_with(None, "env", "hang", "reward")))
    ok, env, hang, reward = trajs
    assert ok.fault is None and ok.trainable and ok.stop_reason == StopReason.DONE
    assert env.fault == FaultKind.ENV and "tool crashed" in env.error
    assert hang.fault == FaultKind.TIMEOUT and hang.stop_reason == StopReason.TIMEOUT
    assert reward.fault == FaultKind.REWARD and "reward service unreachable" in reward.error
    assert reward.reward == 0.0 and not reward.success
    # every faulted episode still holds the LLM call it made before the fault: nothing lost
    assert all(len(t.calls) == 1 for t in trajs)
    # a record read back keeps its fault
    assert Trajectory.model_validate_json(env.model_dump_json()).fault == FaultKind.ENV


def test_a_looping_agent_is_an_outcome_not_a_fault(tokenizer):
    from langgraph.graph import END, START, StateGraph
    from typing_extensions import TypedDict

    class State(TypedDict, total=False):
        task: object
        n: int

    graph = StateGraph(State)
    graph.add_node("loop", lambda s: {"n": s.get("n", 0) + 1})
    graph.add_edge(START, "loop")
    graph.add_conditional_edges("loop", lambda s: "loop", ["loop", END])
    cfg = RunnerConfig(group_size=1, progress=False, recursion_limit=10)
    (traj,) = asyncio.run(EpisodeRunner(graph.compile(), cfg).run(tasks_with(None)))
    assert traj.stop_reason == StopReason.MAX_TURNS and traj.fault is None and traj.trainable


def test_rows_and_advantages_come_from_clean_episodes_only(tokenizer):
    from seed_agents.trainers.rollout import GraphRollout

    llm = fake_llm(tokenizer)
    runner = faulty_runner(llm, group_size=2, timeout_s=0.5)
    rollout = GraphRollout(runner, llm, skills="none", merge_rows=False)
    trajs = asyncio.run(runner.run(tasks_with(None, "env", "hang", "reward")))
    # a group with one clean and one faulted episode: the clean one alone has no group signal
    lone = trajs[2].model_copy(update={"fault": None, "stop_reason": StopReason.DONE, "error": None,
                                       "trajectory_id": "lone"})
    batch = rollout.build([*trajs, lone])
    clean = {t.trajectory_id for t in trajs[:2]}
    assert {r.trajectory_id for r in batch.rows} == clean
    # the advantages are the clean group's own: the faulted episodes' zero rewards are not in them
    rewards = {t.trajectory_id: t.reward for t in trajs}
    adv = group_advantages([rewards[r.trajectory_id] for r in batch.rows], [r.group_id for r in batch.rows])
    assert len(adv) == 2
    m = batch.metrics
    assert m["faults/env"] == 2 and m["faults/timeout"] == 2 and m["faults/reward"] == 2 and m["faults"] == 6
    assert m["episodes"] == 9 and m["episodes_trained"] == 2
    assert m["groups_trained"] == 1 and m["groups_dropped"] == 3
    assert m["zero_variance_groups"] == (1.0 if trajs[0].reward == trajs[1].reward else 0.0)
    assert m["success_rate"] == pytest.approx(sum(t.success for t in trajs[:2] + [lone]) / 3)


def test_fault_budget():
    ok = [Trajectory(task_id="a", group_id="g") for _ in range(2)]
    bad = [Trajectory(task_id="a", group_id="g", stop_reason=StopReason.ERROR, fault=FaultKind.ENV, error="E: boom")
           for _ in range(3)]
    check_fault_budget(ok + bad[:2], 0.5)  # half is within the budget
    with pytest.raises(FaultBudgetExceeded, match=r"3 of 5 .*env 3.*E: boom"):
        check_fault_budget(ok + bad, 0.5)
    check_fault_budget(ok + bad, 1.0)


def test_a_dead_server_trips_the_breaker_and_the_rest_is_skipped(tokenizer):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    backend = VLLMBackend(url, "m", max_retries=1, backoff_s=0.01, timeout_s=10)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=SamplingParams(max_tokens=4))
    trajs = asyncio.run(faulty_runner(llm, group_size=1, concurrency=1).run(tasks_with(*[None] * 5)))
    assert trajs[0].fault == FaultKind.BACKEND and url in trajs[0].error
    assert [t.fault for t in trajs[1:]] == [FaultKind.SKIPPED] * 4
    assert all(not t.calls for t in trajs)
    with pytest.raises(FaultBudgetExceeded, match=url):
        check_fault_budget(trajs, 0.5)
    # the breaker: a second request fails at once, without retrying the dead server
    with pytest.raises(Exception, match="circuit open"):
        backend.generate([1, 2], SamplingParams(max_tokens=2))


def dying_server(tokenizer, n_ok: int) -> ScriptedServer:
    """A stand-in vLLM server that answers ``n_ok`` completions, then goes away."""
    ids = tokenizer("ab", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    body = json.dumps({"choices": [{"token_ids": ids, "finish_reason": "stop",
                                    "logprobs": {"token_logprobs": [-0.5] * len(ids)}}]}).encode()
    return ScriptedServer(lambda n, request: (200, "application/json", body) if n <= n_ok else None)


def test_a_server_that_dies_mid_eval_stops_it_with_the_url_and_nonzero_exit(tokenizer, tiny_model_dir, tmp_path,
                                                                                 capsys):
    """`seed-agents eval` against a server that dies after 2 answers: the episodes after it
    are skipped (not retried one by one), the exit code is non-zero and the URL is named."""
    from seed_agents.app.cli import main

    server = dying_server(tokenizer, n_ok=2)
    try:
        code = main(["eval", "--backend", "vllm", "--base-url", server.url, "--model", "m",
                     "--tokenizer", tiny_model_dir, "--episodes", "8", "--concurrency", "1",
                     "--max-turns", "2", "--out", str(tmp_path / "run")])
    finally:
        server.close()
    err = capsys.readouterr().err
    assert code != 0 and server.url.split("//")[1] in err and "Traceback" not in err
    trajs = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert len(trajs) == 8  # every episode is recorded, none lost
    faults = [t["fault"] for t in trajs]
    assert faults.count("skipped") >= 5 and faults.count("backend") == 1
    assert len(server.requests) <= 4  # the dead server was not retried episode after episode


# -- through `seed-agents train` ----------------------------------------------------

def write_tasks(path: Path, faults: list[str | None]) -> Path:
    path.write_text("".join(t.model_dump_json() + "\n" for t in tasks_with(*faults)))
    return path


def train_yaml(tmp_path: Path, tiny_model_dir: str, faults: list[str | None], **over) -> Path:
    cfg = faulty_train_config(str(write_tasks(tmp_path / "t.jsonl", faults)), tiny_model_dir,
                              num_tasks=len(faults), tasks_per_iteration=len(faults), out=str(tmp_path / "run"),
                              # no task here hangs: the timeout only has to outlast a slow first
                              # generation on a loaded machine (3 s did not, now and then)
                              runner={"group_size": 2, "progress": False, "episode_timeout_s": 60.0}, **over)
    path = tmp_path / "train.yaml"
    path.write_text(json.dumps(cfg))
    return path


def test_train_skips_faulted_episodes_and_counts_them(tmp_path, tiny_model_dir):
    from seed_agents.app.cli import main

    assert main(["train", "--config", str(train_yaml(tmp_path, tiny_model_dir, [None, "env"]))]) == 0
    (metrics,) = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert metrics["faults/env"] == 2 and metrics["episodes_trained"] == 2 and metrics["groups_dropped"] == 1
    assert metrics["rows"] == 2  # one row per clean episode; the crashed ones made none
    trajs = [json.loads(x) for x in (tmp_path / "run" / "trajectories.jsonl").read_text().splitlines()]
    assert sorted(str(t["fault"]) for t in trajs) == ["None", "None", "env", "env"]  # recorded, not trained


def test_a_raising_reward_stops_training_before_any_update(tmp_path, tiny_model_dir, capsys):
    from seed_agents.app.cli import main

    code = main(["train", "--config", str(train_yaml(tmp_path, tiny_model_dir, ["reward", "reward"]))])
    err = capsys.readouterr().err
    assert code != 0 and "reward" in err and "Traceback" not in err
    out = tmp_path / "run"
    assert not (out / "metrics.jsonl").exists() and not list((out / "checkpoints").glob("checkpoint-*"))
    assert len((out / "trajectories.jsonl").read_text().splitlines()) == 4  # recorded all the same


EXIT_AFTER_TIMEOUT = """
import asyncio, atexit, sys, time

# registered before the backend's own exit hook, so it runs after it (atexit is last in, first
# out): how many forward passes the abandoned generation made once the exit began
forwards, exit_began = [], [float("inf")]
atexit.register(lambda: print("forwards after exit began", sum(t >= exit_began[0] for t in forwards), flush=True))
from seed_agents.backends.local import LocalBackend
from seed_agents.chat_model import SeedChatModel
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.testing import build_faulty_agent, faulty_reward
from seed_agents.types import SamplingParams, Task

backend = LocalBackend(sys.argv[1])
backend.model.register_forward_hook(lambda *a: forwards.append(time.perf_counter()))
llm = SeedChatModel(backend=backend, tokenizer=backend.tokenizer, sampling=SamplingParams(max_tokens=4000))
runner = EpisodeRunner(build_faulty_agent(llm), RunnerConfig(group_size=2, episode_timeout_s=0.5, progress=False),
                       reward_fn=faulty_reward)
t0 = time.perf_counter()
trajs = asyncio.run(runner.run([Task(task_id="t")]))
assert [t.fault.value for t in trajs] == ["timeout", "timeout"], trajs
print("episodes done", round(time.perf_counter() - t0, 2), flush=True)
exit_began[0] = time.perf_counter()
"""


def test_timed_out_local_generation_is_cancelled_and_the_process_exits_cleanly(tiny_model_dir, tmp_path):
    """Exit status 134 ("terminate called without an active exception") came from a torch
    forward still running on an abandoned thread at exit; 4000 tokens take ~10 s here."""
    import subprocess
    import sys

    script = tmp_path / "exit_after_timeout.py"
    script.write_text(EXIT_AFTER_TIMEOUT)
    for _ in range(2):  # the abort was intermittent
        proc = subprocess.run([sys.executable, str(script), tiny_model_dir], capture_output=True, text=True, timeout=180)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "episodes done" in proc.stdout and "terminate called" not in proc.stderr
        # the abandoned generation stopped at once: a token or two after the exit began, not the
        # rest of its 4000. Counted in forward passes, not seconds: a loaded machine slows both
        after_exit = int(proc.stdout.split("forwards after exit began")[1].split()[0])
        assert after_exit <= 3, proc.stdout


def test_zero_variance_groups_is_the_share_of_trained_groups_with_one_reward(tokenizer):
    from seed_agents.trainers.rollout import GraphRollout

    llm = fake_llm(tokenizer)
    runner = faulty_runner(llm, group_size=2)
    trajs = asyncio.run(runner.run(tasks_with(None, None, None)))

    def with_rewards(*rewards):
        return [t.model_copy(update={"reward": r}) for t, r in zip(trajs, rewards, strict=True)]

    metrics = GraphRollout(runner, llm, skills="none").metrics
    assert metrics(with_rewards(1.0, 1.0, 0.0, 1.0, 0.0, 0.0))["zero_variance_groups"] == pytest.approx(2 / 3)
    assert metrics(with_rewards(1.0, 0.0, 0.0, 1.0, 0.5, 0.0))["zero_variance_groups"] == 0.0
    assert metrics([t.model_copy(update={"fault": FaultKind.ENV}) for t in trajs])["zero_variance_groups"] == 1.0
