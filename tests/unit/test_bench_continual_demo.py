"""bench/continual_demo.py's own parts, without a model: the family's settings, the canary
subset, the figures read from gate decisions (canary per version, the gate's power, the
atlas's three levels) and the traffic player's guards."""

from __future__ import annotations

import asyncio
import json
import statistics
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from bench.continual_demo import ROOT, atlas_levels, canary_by_version, demo_config, parse_args, power_of
from examples.atlas_tasks import make_tasks
from seed_agents.app.continual_config import ContinualConfig
from seed_agents.continual.canary import CanaryEpisode, EpisodeTrace, ToolCallTrace
from seed_agents.continual.gate import GateConfig, gate_power


def test_the_atlas_family_runs_the_learning_curves_budget_by_default():
    args = parse_args(["--family", "atlas"])
    assert args.config == ROOT / "configs" / "continual_atlas.yaml"
    assert (args.model, args.cycles, args.traffic, args.canary) == ("smollm2", 9, None, None)
    smoke = parse_args(["--family", "atlas", "--smoke"])
    assert (smoke.model, smoke.cycles, smoke.traffic, smoke.canary) == ("tiny", 3, 2, 8)
    library = parse_args([])
    assert (library.family, library.cycles, library.traffic) == ("library", 3, 6)
    assert library.config == ROOT / "configs" / "continual_demo.yaml"


@pytest.mark.parametrize("argv, message", [
    (["--family", "atlas", "--model", "taught-tiny"], "teaches the library"),
    (["--config", "no/such/file.yaml"], "no such file"),
    (["--cycles", "2", "--regression-cycle", "3"], "--regression-cycle"),
    (["--canary", "-1"], "--canary"),
])
def test_bad_arguments_get_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        parse_args(argv)
    assert exit_info.value.code == 2 and message in capsys.readouterr().err


def test_the_atlas_config_validates_and_its_canary_subset_is_the_first_tasks(tmp_path: Path):
    args = parse_args(["--family", "atlas", "--canary", "5"])
    cfg = demo_config(args, tmp_path, "model-dir", "http://127.0.0.1:1", None)
    assert isinstance(cfg, ContinualConfig)
    assert (cfg.sessions_per_cycle, cfg.group_size, cfg.canary.temperature) == (4, 8, 0.0)
    assert (cfg.trainer.learning_rate, cfg.trainer.lr_schedule) == (3e-4, "constant")
    assert cfg.agent.tool_choices() == {"first_tool_choice": "required"}
    written = [json.loads(line)["task_id"] for line in Path(cfg.canary.tasks).read_text().splitlines()]
    assert written == [t.task_id for t in make_tasks("heldout", levels=[0])[:5]]


def decision(version: int, baseline: int, cand: float, prom: float, per_task: dict[str, float], *,
             forced: bool = False) -> dict:
    return {"version": version, "baseline": baseline, "candidate_mean": cand, "promoted_mean": prom,
            "per_task": per_task, "forced_regression": forced}


def test_canary_by_version_lists_every_measurement_in_order():
    rows = [decision(1, 0, 0.5, 0.4, {}), decision(2, 1, 0.0, 0.55, {}, forced=True), decision(3, 1, 0.6, 0.5, {})]
    assert canary_by_version(rows) == {"v0": [0.4], "v1": [0.5, 0.55, 0.5], "v2": [0.0], "v3": [0.6]}


def test_the_gates_power_pools_trained_candidates_only():
    gate = GateConfig(margin=0.1, confidence=0.9)
    trained = [decision(1, 0, 0.5, 0.4, {"a": 1.0, "b": 0.0, "c": 0.0, "d": -1.0}),
               decision(3, 1, 0.5, 0.5, {"a": 0.0, "b": 1.0, "c": 0.0, "d": 0.0})]
    forced = decision(2, 1, 0.0, 0.5, {"a": -1.0, "b": -1.0, "c": -1.0, "d": -1.0}, forced=True)
    got = power_of([trained[0], forced, trained[1]], 80, gate)
    sd = statistics.stdev([1.0, 0.0, 0.0, -1.0, 0.0, 1.0, 0.0, 0.0])
    assert got == {**gate_power(sd, 80, gate).model_dump(), "pooled_differences": 8}
    assert power_of([decision(1, 0, 0.5, 0.5, {"a": 0.0, "b": 0.0}), forced], 80, gate) is None


def episode(task_id: str, calls: list[tuple[str, dict]], reward: float, *, cut_args: bool = False) -> CanaryEpisode:
    traces = [ToolCallTrace(name=n, args=json.dumps(a)[:5] if cut_args else json.dumps(a)) for n, a in calls]
    return CanaryEpisode(side="candidate", version=1, task_id=task_id, seed=0, reward=reward,
                         trace=EpisodeTrace(tool_calls=traces))


def test_atlas_levels_keep_format_apart_from_competence():
    task = make_tasks("heldout", levels=[0])[0]
    tasks = {task.task_id: task}
    (call,) = task.data["calls"]
    place, field = call["args"]["place"], call["args"]["field"]
    rows = [episode(task.task_id, [("lookup", {"place": place.upper(), "field": field})], 1.0),  # right, case aside
            episode(task.task_id, [("lookup", {"place": "Nowhere", "field": field})], 0.0),  # format only
            episode(task.task_id, [("lookup", {"place": place, "field": field})], 0.0, cut_args=True),  # cut: unknown
            episode(task.task_id, [], 0.0)]  # no call
    assert atlas_levels(rows, tasks) == {"episodes": 4, "parsed": 0.75, "right_calls": 0.25, "right_answer": 0.25}
    assert atlas_levels([], tasks)["episodes"] == 0


def test_traffic_that_returns_loans_plays_one_session_at_a_time():
    from examples.library_service import play_traffic

    with pytest.raises(ValueError, match="one session at a time"):
        asyncio.run(play_traffic(None, None, "http://127.0.0.1:1", "rec", sessions=2, concurrency=2))
    with pytest.raises(ValueError, match="concurrency"):
        asyncio.run(play_traffic(None, None, "http://127.0.0.1:1", "rec", sessions=2, concurrency=0,
                                 return_loans=False))


def test_the_atlas_production_logs_every_request_by_origin():
    from bench.continual_demo import FAMILIES

    app = FAMILIES["atlas"].production()
    client = TestClient(app)
    assert client.get("/add", params={"a": 2, "b": 3}, headers={"X-Demo-Origin": "traffic"}).json() == 5
    assert client.get("/openapi.json").status_code == 200
    assert app.state.log.by_origin() == {"traffic": {"GET": 1}, "unmarked": {"GET": 1}}
    assert app.state.log.mutating() == 0
