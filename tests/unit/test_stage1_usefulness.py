"""`skills eval`: the usefulness math on hand-made numbers, scoring on a tiny random model,
and the re-run check on a scripted env."""

import json

import pytest
import torch
from langchain_core.messages import HumanMessage, SystemMessage
from transformers import AutoModelForCausalLM

from seed_agents.app.cli import main
from seed_agents.backends.local import LocalBackend
from seed_agents.chat_model import SeedChatModel
from seed_agents.envs import EnvSuite
from seed_agents.errors import ConfigError
from seed_agents.graphs.env_agent import build_env_agent
from seed_agents.scoring import sequence_logprobs
from seed_agents.skills import SystemBlockInjector, TaskLineInjector, teacher_prompt_ids
from seed_agents.stage1.usefulness import (
    RerunConfig,
    Scorer,
    UsefulnessConfig,
    evaluate_skills,
    find_tasks,
    mean,
    outcome_deltas,
    paired_outcome,
    per_token_delta,
    rerun_check,
    run_usefulness,
)
from seed_agents.testing import FakeBackend, ScriptedEnv
from seed_agents.types import LLMCall, SamplingParams, SkillExample, Task, Trajectory

SKILL_A = "Open the door first, then go north to leave the room."
SKILL_B = "Never wait or look around; open the door and go north."

# -- the math on hand-made numbers ----------------------------------------------------


def test_per_token_delta():
    assert per_token_delta(-10.0, -12.0, 4) == 0.5
    assert per_token_delta(-3.0, -1.0, 2) == -1.0
    assert per_token_delta(-1.0, -1.0, 0) is None


def test_outcome_deltas_and_margin():
    r = outcome_deltas([0.5, -0.2, 0.1, -0.4], [True, False, True, False])
    assert r["delta_success"] == pytest.approx(0.3) and r["delta_failure"] == pytest.approx(-0.3)
    assert r["margin"] == pytest.approx(0.6) and (r["n_success"], r["n_failure"]) == (2, 2)
    only_wins = outcome_deltas([0.2], [True])
    assert only_wins["delta_failure"] is None and only_wins["margin"] is None
    assert outcome_deltas([], [])["delta_success"] is None
    with pytest.raises(ValueError):
        outcome_deltas([0.1], [True, False])


def test_paired_outcome():
    assert paired_outcome([0.3, 0.1], [-0.1]) == 1.0
    assert paired_outcome([0.1], [0.2, 0.4]) == 0.0
    assert paired_outcome([0.2], [0.2]) == 0.5
    assert paired_outcome([0.2], []) is None and paired_outcome([], [0.1]) is None
    assert mean([1.0, 0.0, 0.5]) == 0.5 and mean([]) is None


# -- synthetic episodes with real token ids ---------------------------------------------


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def render_llm(tokenizer):
    return SeedChatModel(backend=None, tokenizer=tokenizer)


def make_call(llm, tokenizer, task_text, obs, action):
    messages = [SystemMessage("You play a text game. Answer with one command."),
                HumanMessage(f"Your task is to: {task_text}\n{obs}\nYour command:")]
    prompt_ids, dicts = llm.render(messages)
    comp = tokenizer(action, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    return LLMCall(messages=dicts, prompt_ids=prompt_ids, completion_ids=comp, logprobs=[-1.0] * len(comp), text=action)


def make_traj(llm, tokenizer, tid, task, success, actions, split="train"):
    calls = [make_call(llm, tokenizer, f"leave the room ({task})", f"Step {i}: a room with a door.", a)
             for i, a in enumerate(actions)]
    return Trajectory(trajectory_id=tid, task_id=task, group_id=f"g-{task}", split=split, success=success,
                      reward=float(success), calls=calls, steps=len(calls))


def make_example(traj, analyzer, skill, valid=True):
    return SkillExample(example_id=traj.trajectory_id, trajectory_id=traj.trajectory_id, task_id=traj.task_id,
                        success=traj.success, messages=[{"role": "user", "content": "analyze"}], skill=skill if valid else "",
                        completion="{}", valid=valid, reject_reason=None if valid else "skill too short", analyzer=analyzer)


@pytest.fixture(scope="module")
def episodes(render_llm, tokenizer):
    trajs = [
        make_traj(render_llm, tokenizer, "e0", "t0", True, ["open door", "go north"]),   # t0: a mixed group
        make_traj(render_llm, tokenizer, "e1", "t0", False, ["look", "wait"]),
        make_traj(render_llm, tokenizer, "e2", "t1", True, ["open door", "go north"]),   # t1: successes only
        make_traj(render_llm, tokenizer, "e3", "t1", True, ["open door", "go north"], split="eval"),
    ]
    by_analyzer = {
        "analyzer-a": [make_example(t, "analyzer-a", SKILL_A) for t in trajs],
        "analyzer-b": [make_example(t, "analyzer-b", SKILL_B, valid=i % 2 == 0) for i, t in enumerate(trajs)],
    }
    return {t.trajectory_id: t for t in trajs}, by_analyzer


def test_scorer_matches_the_plain_forward_pass_and_caches(model, episodes):
    trajs, _ = episodes
    call = trajs["e0"].calls[0]
    scorer = Scorer(model, batch_size=3)
    pairs = [(c.prompt_ids, c.completion_ids) for t in trajs.values() for c in t.calls]
    scorer.prefetch(pairs)
    assert scorer.forward_sequences == len({(tuple(p), tuple(c)) for p, c in pairs}) < len(pairs)
    with torch.no_grad():
        direct = sequence_logprobs(model, call.prompt_ids, call.completion_ids).double().sum().item()
    assert scorer(call.prompt_ids, call.completion_ids) == pytest.approx(direct, abs=1e-4)
    scorer(call.prompt_ids, call.completion_ids)
    assert scorer.forward_sequences == len(scorer.cache)  # a cached pair is never scored again


def test_sharing_the_prompts_prefix_changes_the_work_not_the_numbers(model):
    """Prompts that share a system prompt (40 tokens here) run it once per batch: the scores
    agree with whole sequences to float rounding, and fewer tokens run."""
    g = torch.Generator().manual_seed(2)
    system = torch.randint(5, 1000, (40,), generator=g).tolist()
    pairs = [(system + torch.randint(5, 1000, (n,), generator=g).tolist(), torch.randint(5, 1000, (m,), generator=g).tolist())
             for n, m in [(3, 4), (12, 1), (5, 9), (30, 2), (1, 6)]]
    pairs.append(([7, 8, 9], [10, 11]))  # a prompt that shares nothing, batched with the rest
    shared, whole = Scorer(model, batch_size=8), Scorer(model, batch_size=8, share_prefix=False)
    shared.prefetch(pairs)
    whole.prefetch(pairs)
    assert shared.cache.keys() == whole.cache.keys() and len(whole.cache) == len(pairs)
    for k in whole.cache:
        assert shared.cache[k] == pytest.approx(whole.cache[k], abs=1e-4)
    assert whole.forward_tokens == sum(len(p) + len(c) for p, c in pairs)
    # the prompt that shares nothing gets a batch of its own, so the five that share run the 40 tokens once
    assert shared.forward_tokens == whole.forward_tokens - 4 * 40
    by_twos = Scorer(model, batch_size=2)  # three batches of sharing rows (2, 2, 1): the prefix runs three times
    by_twos.prefetch(pairs)
    assert by_twos.forward_tokens == whole.forward_tokens - 2 * 40
    for k in whole.cache:
        assert by_twos.cache[k] == pytest.approx(whole.cache[k], abs=1e-4)


def test_one_row_per_analyzer_with_coverage_and_hand_checked_delta(model, tokenizer, render_llm, episodes):
    trajs, by_analyzer = episodes
    result = evaluate_skills(model, tokenizer, trajs, by_analyzer, batch_size=4)
    rows = {r["analyzer"]: r for r in result["rows"]}
    assert list(rows) == ["analyzer-a", "analyzer-b"]
    a, b = rows["analyzer-a"], rows["analyzer-b"]
    assert (a["examples"], a["valid"], a["coverage"], a["episodes_scored"]) == (4, 4, 1.0, 4)
    assert (b["examples"], b["valid"], b["coverage"], b["episodes_scored"]) == (4, 2, 0.5, 2)  # invalid: no signal
    assert a["n_success"] == 3 and a["n_failure"] == 1
    assert a["margin"] == pytest.approx(a["delta_success"] - a["delta_failure"])
    # paired: only t0 has both outcomes; both of its episodes carry an analyzer-a skill, one a b skill
    assert a["n_pairs"] == 2 and b["n_pairs"] == 1 and a["paired_win_rate"] in (0.0, 0.5, 1.0)
    assert result["counts"]["render_mismatches"] == 0

    # the Delta of e1 (a failure) recomputed by hand, call by call
    injector = SystemBlockInjector()
    with torch.no_grad():
        shift = sum((sequence_logprobs(model, teacher_prompt_ids(render_llm, c, SKILL_A, injector), c.completion_ids).sum()
                     - sequence_logprobs(model, c.prompt_ids, c.completion_ids).sum()).item() for c in trajs["e1"].calls)
    tokens = sum(len(c.completion_ids) for c in trajs["e1"].calls)
    e1 = next(e for e in result["episodes"]["analyzer-a"] if e["trajectory_id"] == "e1")
    assert e1["tokens"] == tokens and e1["delta"] == pytest.approx(shift / tokens, abs=1e-4)
    assert a["delta_failure"] == pytest.approx(e1["delta"])
    assert e1["delta"] != 0.0  # the skill does reach the prompt


def test_a_skill_that_changes_nothing_gives_delta_exactly_zero(model, tokenizer, episodes):
    class Nothing:
        def inject(self, messages, skill):
            return list(messages)

    trajs, by_analyzer = episodes
    result = evaluate_skills(model, tokenizer, trajs, by_analyzer, injector=Nothing(), batch_size=3)
    deltas = [e["delta"] for eps in result["episodes"].values() for e in eps]
    assert deltas and all(d == 0.0 for d in deltas)
    a = result["rows"][0]
    assert a["analyzer"] == "analyzer-a" and a["margin"] == 0.0 and a["paired_win_rate"] == 0.5  # ties


def test_task_line_injector_is_used_when_asked(model, tokenizer, episodes):
    trajs, by_analyzer = episodes
    sys_ = evaluate_skills(model, tokenizer, trajs, {"analyzer-a": by_analyzer["analyzer-a"]}, paired=False)
    task = evaluate_skills(model, tokenizer, trajs, {"analyzer-a": by_analyzer["analyzer-a"]}, paired=False,
                           injector=TaskLineInjector())
    assert sys_["rows"][0]["delta_success"] != task["rows"][0]["delta_success"]
    assert sys_["rows"][0]["n_pairs"] == 0


# -- the command: files in, usefulness.json out -----------------------------------------


def write_inputs(tmp_path, episodes):
    trajs, by_analyzer = episodes
    tp = tmp_path / "trajectories.jsonl"
    tp.write_text("".join(t.model_dump_json() + "\n" for t in trajs.values()))
    files = []
    for name, exs in by_analyzer.items():
        f = tmp_path / f"{name}.jsonl"
        f.write_text("".join(e.model_dump_json() + "\n" for e in exs))
        files.append(f)
    orphan = make_example(Trajectory(trajectory_id="gone", task_id="t9", group_id="g"), "analyzer-a", SKILL_A)
    with files[0].open("a") as fh:
        fh.write(orphan.model_dump_json() + "\n")
    return tp, files


def test_run_filters_held_out_tasks_and_writes_the_table(tmp_path, tiny_model_dir, episodes, capsys):
    tp, files = write_inputs(tmp_path, episodes)
    (tmp_path / "sft_summary.json").write_text(json.dumps({"heldout_task_ids": ["t0"]}))
    rc = main(["skills", "eval", "--trajectories", str(tp), "--examples", *map(str, files), "--model", tiny_model_dir,
               "--tasks-from", str(tmp_path / "sft_summary.json"), "--out", str(tmp_path / "out")])
    assert rc == 0
    out = capsys.readouterr().out
    assert "analyzer-a" in out and "analyzer-b" in out and "margin" in out
    result = json.loads((tmp_path / "out" / "usefulness.json").read_text())
    rows = {r["analyzer"]: r for r in result["rows"]}
    assert rows["analyzer-a"]["examples"] == 2 and rows["analyzer-b"]["examples"] == 2  # only task t0
    assert result["counts"]["kept"] == 2 and result["counts"]["examples_without_trajectory"] == 1
    by_split = run_usefulness(UsefulnessConfig(trajectories=tp, examples=files, model=tiny_model_dir, split="eval",
                                               out=tmp_path / "out2", paired=False))
    assert [r["examples"] for r in by_split["rows"]] == [1, 1]


def test_bad_inputs_give_one_clear_error(tmp_path, episodes, capsys):
    tp, files = write_inputs(tmp_path, episodes)
    with pytest.raises(ConfigError, match="no trajectories"):
        run_usefulness(UsefulnessConfig(examples=files))
    with pytest.raises(ConfigError, match="no examples files"):
        run_usefulness(UsefulnessConfig(trajectories=tp))
    with pytest.raises(ConfigError, match="does not exist"):
        run_usefulness(UsefulnessConfig(trajectories=tp, examples=[tmp_path / "nope.jsonl"]))
    (tmp_path / "ids.json").write_text(json.dumps(["t7"]))
    with pytest.raises(ConfigError, match="no episodes left"):
        run_usefulness(UsefulnessConfig(trajectories=tp, examples=files, tasks_from=tmp_path / "ids.json"))
    (tmp_path / "bad.json").write_text(json.dumps({"other": 1}))
    with pytest.raises(ConfigError, match="heldout_task_ids"):
        run_usefulness(UsefulnessConfig(trajectories=tp, examples=files, tasks_from=tmp_path / "bad.json"))
    assert main(["skills", "eval", "--trajectories", str(tp), "--examples", str(files[0]), "--injector", "nope"]) == 2
    assert "injector: Input should be 'system', 'task_line' or 'last_turn'" in capsys.readouterr().err  # the field, the choices
    assert main(["skills", "eval", "--trajectories", str(tmp_path / "x.jsonl"), "--examples", str(files[0])]) == 2
    assert "does not exist" in capsys.readouterr().err


# -- the re-run check -------------------------------------------------------------------


class ScriptedSuite(EnvSuite):
    name = "scripted"

    def tasks(self, split, n):
        return [Task(task_id=f"{split}-{i}", split=split) for i in range(min(n, 20))]

    def make_env(self, task):
        return ScriptedEnv()

    def build_graph(self, llm, **options):
        return build_env_agent(llm, **options)


class ListSink:
    def __init__(self):
        self.records = []

    def write(self, kind, record):
        self.records.append(record)

    def close(self):
        pass


def test_find_tasks_looks_ids_up_in_the_manifests():
    found = find_tasks(ScriptedSuite(), {"train-3": "train", "eval-12": "eval", "train-99": "train"})
    assert sorted(found) == ["eval-12", "train-3"] and found["eval-12"].split == "eval"


def test_rerun_compares_success_with_and_without_the_skill(tokenizer):
    def reply(prompt_ids):  # follows the skill when it is in the prompt, dawdles otherwise
        text = tokenizer.decode(prompt_ids)
        if "<skill>" not in text:
            return "look"
        return "open door" if "open door" in text.rsplit("Valid commands", 1)[-1] else "go north"

    llm = SeedChatModel(backend=FakeBackend(tokenizer, reply), tokenizer=tokenizer)
    tasks = [Task(task_id="a"), Task(task_id="b")]
    skills = {"good": {"a": [SKILL_A], "b": [SKILL_A, SKILL_B]}, "partial": {"a": [SKILL_B]}}
    cfg = RerunConfig(episodes_per_task=2, agent={"max_turns": 3, "history": "window"})
    sink = ListSink()
    r = rerun_check(ScriptedSuite(), llm, tasks, skills, cfg, SystemBlockInjector(), sink=sink)
    assert r["good"] == {"episodes": 4, "tasks": 2, "success_with": 1.0, "success_without": 0.0,
                         "errors_with": 0, "errors_without": 0}
    assert (r["partial"]["episodes"], r["partial"]["tasks"], r["partial"]["success_with"]) == (2, 1, 1.0)
    assert len(sink.records) == 4 + 4 + 2  # baseline 2 tasks x 2, good 2 x 2, partial 1 x 2
    skilled = [t for t in sink.records if t.calls[0].scope["arm"] == "good" and t.task_id == "b"]
    assert {SKILL_A in t.calls[0].messages[0]["content"] for t in skilled} == {True, False}  # k mod len(skills)


def test_rerun_arms_share_seeds_so_a_no_op_skill_reproduces_the_baseline(model, tokenizer):
    class Nothing:
        def inject(self, messages, skill):
            return list(messages)

    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=1)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer)
    cfg = RerunConfig(episodes_per_task=2, concurrency=4, sampling=SamplingParams(max_tokens=6, temperature=1.0),
                      agent={"max_turns": 2, "history": "window"})
    sink = ListSink()
    rerun_check(ScriptedSuite(), llm, [Task(task_id="a")], {"noop": {"a": [SKILL_A]}}, cfg, Nothing(), seed=3, sink=sink)
    arms = {(t.calls[0].scope["arm"], t.sample_index): [c.completion_ids for c in t.calls] for t in sink.records}
    assert arms[("noop", 0)] == arms[("baseline", 0)] and arms[("noop", 1)] == arms[("baseline", 1)]
    assert arms[("baseline", 0)] != arms[("baseline", 1)]  # different seeds per episode index
