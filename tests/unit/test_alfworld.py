"""ALFWorld suite without the game engine: manifest, data errors, rewards, invalid actions.

Data folders here are tiny fakes in ALFWorld's layout (``traj_data.json`` + a
``game.tw-pddl`` holding only the ``solvable`` flag); the env runs on a fake engine.
The real engine plays the fixture games in tests/integration/test_alfworld_env.py.
"""

import inspect
import json
import re
import sys
from pathlib import Path

import pytest

import seed_agents.tools.alfworld as alf
from seed_agents.config import EvalConfig, TrainConfig, load_config
from seed_agents.envs import EnvSuite, TextEnv, available_envs, load_env_suite
from seed_agents.tools.alfworld import (
    INVALID_ACTION_TEXT,
    SPLITS,
    TASK_TYPES,
    AlfWorldDataError,
    AlfWorldEnv,
    AlfWorldSuite,
    shaped_reward,
    split_intro,
)

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "alfworld"

# (task type, number of games) per split of the fake data folder
LAYOUT = {
    "train": {"pick_and_place_simple": 3, "look_at_obj_in_light": 2, "pick_clean_then_place_in_recep": 2,
              "pick_heat_then_place_in_recep": 1, "pick_cool_then_place_in_recep": 1, "pick_two_obj_and_place": 1},
    "valid_seen": {"pick_and_place_simple": 1, "look_at_obj_in_light": 1, "pick_two_obj_and_place": 1},
    "valid_unseen": {"pick_heat_then_place_in_recep": 2},
}


def add_game(split_dir, task, trial, task_type, *, solvable=True, game=True):
    trial_dir = split_dir / task / trial
    trial_dir.mkdir(parents=True)
    (trial_dir / "traj_data.json").write_text(json.dumps({"task_type": task_type}))
    if game:
        (trial_dir / "game.tw-pddl").write_text(json.dumps({"solvable": solvable}))


def make_data(root):
    for split, types in LAYOUT.items():
        for task_type, count in types.items():
            for k in range(count):
                add_game(root / "json_2.1.1" / split, f"{task_type}-Obj{k}-None-Recep-{10 + k}",
                         f"trial_T2019090{k}_000000_00000{k}", task_type)
    return root


@pytest.fixture
def data(tmp_path):
    return make_data(tmp_path / "alfworld-data")


def ids(tasks):
    return [t.task_id for t in tasks]


# ---------------------------------------------------------------- manifest


def test_task_types_are_the_papers_six():
    assert TASK_TYPES == {
        "pick_and_place_simple": "pick", "look_at_obj_in_light": "look",
        "pick_clean_then_place_in_recep": "clean", "pick_heat_then_place_in_recep": "heat",
        "pick_cool_then_place_in_recep": "cool", "pick_two_obj_and_place": "pick2",
    }


def test_manifest_is_deterministic_and_stable_across_machines(data, tmp_path):
    first = AlfWorldSuite(data_dir=data, seed=1).tasks("train", 10)
    again = AlfWorldSuite(data_dir=data, seed=2).tasks("train", 10)
    elsewhere = AlfWorldSuite(data_dir=make_data(tmp_path / "other" / "copy")).tasks("train", 10)
    assert [t.model_dump() for t in first] == [t.model_dump() for t in again] == [t.model_dump() for t in elsewhere]
    assert first[0].model_dump() == {
        "task_id": "alfworld-train-pick_and_place_simple-Obj1-None-Recep-11-trial_T20190901_000000_000001",
        "split": "train",
        "data": {"path": "pick_and_place_simple-Obj1-None-Recep-11/trial_T20190901_000000_000001", "game_type": "pick"},
    }


def test_small_n_covers_every_type_and_is_a_prefix(data):
    suite = AlfWorldSuite(data_dir=data)
    full = suite.tasks("train", 10)
    assert [t.data["game_type"] for t in full[:6]] == ["pick", "look", "clean", "heat", "cool", "pick2"]
    assert [t.data["game_type"] for t in full[6:]] == ["pick", "look", "clean", "pick"]
    for n in range(11):
        assert ids(suite.tasks("train", n)) == ids(full[:n])
    assert [t.data["game_type"] for t in suite.tasks("valid_seen", 3)] == ["pick", "look", "pick2"]


def test_ids_are_unique_safe_file_names_and_name_their_split(data):
    suite = AlfWorldSuite(data_dir=data)
    all_ids = [t.task_id for split in SPLITS for t in suite.tasks(split, len(suite.games(split)))]
    assert len(all_ids) == len(set(all_ids)) == 15
    assert all(re.fullmatch(r"alfworld-(train|valid_seen|valid_unseen)-[A-Za-z0-9_.-]+", i) for i in all_ids)
    for task in suite.tasks("valid_unseen", 2):
        assert task.split == "valid_unseen"
        assert (data / "json_2.1.1" / "valid_unseen" / task.data["path"] / "game.tw-pddl").is_file()


def test_unplayable_games_are_skipped_like_alfworld_does(data):
    split_dir = data / "json_2.1.1" / "valid_seen"
    add_game(split_dir, "pick_and_place_simple-A-None-B-1", "trial_unsolvable", "pick_and_place_simple", solvable=False)
    add_game(split_dir, "pick_and_place_simple-A-None-B-2", "trial_nogame", "pick_and_place_simple", game=False)
    add_game(split_dir, "pick_and_place_with_movable_recep-A-Bowl-B-3", "trial_x", "pick_and_place_with_movable_recep")
    add_game(split_dir, "pick_heat_then_place_in_recep-AppleSliced-None-B-4", "trial_x",
             "pick_heat_then_place_in_recep")
    add_game(split_dir, "some_new_type-A-None-B-5", "trial_x", "some_new_type")
    games = AlfWorldSuite(data_dir=data).games("valid_seen")
    assert [g.game_type for g in games] == ["look", "pick", "pick2"]


@pytest.mark.parametrize("n", [-1, 4])
def test_n_outside_the_split_is_an_error(data, n):
    with pytest.raises(ValueError, match="valid_seen' has 3 ALFWorld games; asked for"):
        AlfWorldSuite(data_dir=data).tasks("valid_seen", n)


def test_unknown_split(data):
    with pytest.raises(ValueError, match="train, valid_seen, valid_unseen"):
        AlfWorldSuite(data_dir=data).tasks("test", 1)


# ---------------------------------------------------------------- data folder


def assert_says_what_to_do(err, *fragments):
    msg = str(err.value)
    assert isinstance(err.value, FileNotFoundError)
    for text in ("pip install alfworld", "alfworld-download", "ALFWORLD_DATA", "env_options.data_dir", *fragments):
        assert text in msg, f"{text!r} missing from:\n{msg}"


def test_missing_data_dir(tmp_path):
    with pytest.raises(AlfWorldDataError) as err:
        AlfWorldSuite(data_dir=tmp_path / "nowhere").tasks("valid_seen", 1)
    assert_says_what_to_do(err, str(tmp_path / "nowhere"), "does not exist")


def test_data_dir_without_json_folder(tmp_path):
    with pytest.raises(AlfWorldDataError) as err:
        AlfWorldSuite(data_dir=tmp_path).tasks("train", 1)
    assert_says_what_to_do(err, "has no json_2.1.1 folder")


def test_missing_split_and_empty_split(data):
    import shutil

    shutil.rmtree(data / "json_2.1.1" / "valid_unseen")
    with pytest.raises(AlfWorldDataError) as err:
        AlfWorldSuite(data_dir=data).tasks("valid_unseen", 1)
    assert_says_what_to_do(err, "valid_unseen does not exist")
    (data / "json_2.1.1" / "valid_unseen").mkdir()
    with pytest.raises(AlfWorldDataError) as err:
        AlfWorldSuite(data_dir=data).tasks("valid_unseen", 1)
    assert_says_what_to_do(err, "no ALFWorld tasks")


def test_tasks_without_game_files_say_so():
    """The committed fixtures hold only the problems; make_fixtures.py adds the games."""
    with pytest.raises(AlfWorldDataError) as err:
        AlfWorldSuite(data_dir=FIXTURES).tasks("valid_seen", 1)
    assert_says_what_to_do(err, "6 ALFWorld tasks", "have no game.tw-pddl")


def test_missing_game_file_fails_in_prepare(data):
    suite = AlfWorldSuite(data_dir=data)
    tasks = suite.tasks("valid_seen", 3)
    (data / "json_2.1.1" / "valid_seen" / tasks[1].data["path"] / "game.tw-pddl").unlink()
    suite.prepare(tasks[:1])
    with pytest.raises(AlfWorldDataError) as err:
        suite.prepare(tasks)
    assert_says_what_to_do(err, tasks[1].task_id)


def test_data_dir_resolution(tmp_path, monkeypatch):
    monkeypatch.setenv("ALFWORLD_DATA", str(tmp_path / "from-env"))
    assert AlfWorldSuite().data_dir == tmp_path / "from-env"
    assert AlfWorldSuite(data_dir=tmp_path / "given").data_dir == tmp_path / "given"
    monkeypatch.delenv("ALFWORLD_DATA")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert AlfWorldSuite().data_dir == tmp_path / "home" / ".cache" / "alfworld"


def test_suite_reads_nothing_until_asked(tmp_path):
    suite = AlfWorldSuite(data_dir=tmp_path / "nowhere")
    assert isinstance(suite, EnvSuite) and suite.name == "alfworld"
    assert not (tmp_path / "nowhere").exists()


def test_cli_prints_one_clear_error(tmp_path, capsys):
    from seed_agents.app.cli import main

    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"env: alfworld\nsplit: valid_seen\nenv_options:\n  data_dir: {tmp_path / 'nowhere'}\n")
    assert main(["eval", "--config", str(cfg), "--out", str(tmp_path / "run"), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("seed-agents eval: error: ALFWorld data not found") and "alfworld-download" in err


def test_registered_as_entry_point(data):
    if "alfworld" not in available_envs():
        pytest.skip("seed-agents is not installed (no entry points)")
    suite = load_env_suite("alfworld", seed=3, data_dir=str(data))
    assert isinstance(suite, AlfWorldSuite) and suite.seed == 3 and suite.data_dir == data


# ---------------------------------------------------------------- rewards and the env


def test_shaped_reward():
    assert shaped_reward(won=True, invalid=False) == 10.0
    assert shaped_reward(won=False, invalid=False) == 0.0
    assert shaped_reward(won=False, invalid=True) == -0.1
    assert shaped_reward(won=True, invalid=False, win_reward=1.0) == 1.0
    assert shaped_reward(won=False, invalid=True, invalid_penalty=0.5) == -0.5


def test_split_intro_drops_the_banner_and_finds_the_task():
    raw = ("-= Welcome to TextWorld, ALFRED! =-\n\nYou are in the middle of a room. Looking quickly around you, "
           "you see a shelf 1.\n\nYour task is to: put a mug in shelf.")
    text, objective = split_intro(raw)
    assert text == ("You are in the middle of a room. Looking quickly around you, you see a shelf 1.\n\n"
                    "Your task is to: put a mug in shelf.")
    assert objective == "Your task is to: put a mug in shelf."


class FakeState(dict):
    def __init__(self, feedback, admissible, won=False, moves=0):
        super().__init__(won=won, admissible_commands=admissible, moves=moves)
        self.feedback = feedback


INTRO = "-= Welcome to TextWorld, ALFRED! =-\n\nYou see a shelf 1.\n\nYour task is to: put a mug in shelf."
OBJECTIVE = "Your task is to: put a mug in shelf."


class FakeEngine:
    """Plays "go to shelf 1" then "move mug 1 to shelf 1"; clobbers sys.argv like fast-downward."""

    def __init__(self):
        self.commands = []

    def reset(self):
        sys.argv = ["translate.py", "domain", "task"]
        self.commands = []
        return FakeState(INTRO, ["go to shelf 1", "help", "inventory", "look"])

    def step(self, command):
        self.commands.append(command)
        moves = len(self.commands)
        if command == "move mug 1 to shelf 1":
            return FakeState("You move the mug 1 to the shelf 1.", ["look"], won=True, moves=moves), 1, True
        return FakeState("You arrive at shelf 1.", ["help", "look", "move mug 1 to shelf 1"], moves=moves), 0, False


@pytest.fixture
def fake_engine(monkeypatch):
    engine = FakeEngine()
    monkeypatch.setattr(alf, "_load_engine", lambda game_file: engine)
    monkeypatch.setattr(alf, "_IDLE_ENGINES", [])  # keep the fake out of the real pool
    return engine


def test_env_rewards_invalid_actions_and_win(fake_engine, tmp_path):
    argv = list(sys.argv)
    env = AlfWorldEnv(tmp_path / "game.tw-pddl", task_id="t1", game_type="pick")
    assert isinstance(env, TextEnv)
    obs = env.reset()
    assert sys.argv == argv
    assert obs.text == f"You see a shelf 1.\n\n{OBJECTIVE}"
    assert obs.admissible_actions == ["go to shelf 1", "inventory", "look"]  # no "help"
    assert obs.info == {"objective": OBJECTIVE, "task_id": "t1", "game_type": "pick", "moves": 0}
    assert (obs.reward, obs.done, obs.won, obs.invalid) == (0.0, False, False, False)

    for bad in ["help", "take the moon", "", "move mug 1 to shelf 1"]:  # the last is not admissible yet
        out = env.step(bad)
        assert out.invalid and out.reward == -0.1 and not out.done and out.text == INVALID_ACTION_TEXT
        assert out.admissible_actions == obs.admissible_actions and out.info == obs.info
    assert fake_engine.commands == []  # nothing reached the game

    obs = env.step("  Go To  SHELF 1 ")
    assert fake_engine.commands == ["go to shelf 1"] and obs.reward == 0.0 and not obs.invalid
    assert obs.text == "You arrive at shelf 1." and obs.info["moves"] == 1
    obs = env.step("move mug 1 to shelf 1")
    assert obs.won and obs.done and obs.reward == 10.0 and obs.info["game_type"] == "pick"
    with pytest.raises(RuntimeError, match="over"):
        env.step("look")
    env.close()
    assert alf._IDLE_ENGINES == [fake_engine]  # back in the pool for the next episode


def test_custom_reward_scale(fake_engine, tmp_path):
    env = AlfWorldEnv(tmp_path / "game.tw-pddl", win_reward=1.0, invalid_penalty=0.0)
    env.reset()
    assert env.step("dance").reward == 0.0
    env.step("go to shelf 1")
    assert env.step("move mug 1 to shelf 1").reward == 1.0


def test_step_before_reset_and_after_close(fake_engine, tmp_path):
    env = AlfWorldEnv(tmp_path / "game.tw-pddl")
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")
    env.reset()
    env.close()
    with pytest.raises(RuntimeError, match="reset"):
        env.step("look")


# ---------------------------------------------------------------- graph and configs


def test_agent_defaults_match_the_graph_defaults():
    from seed_agents.graphs.alfworld import build_alfworld_agent

    params = inspect.signature(build_alfworld_agent).parameters
    assert AlfWorldSuite.agent_defaults == {k: params[k].default for k in ("max_turns", "history", "history_window")}
    assert AlfWorldSuite.agent_defaults == {"max_turns": 30, "history": "window", "history_window": 5}


def test_build_graph_compiles_with_suite_and_call_options(tmp_path):
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.testing import FakeBackend
    from seed_agents.types import SamplingParams

    class Tok:
        eos_token_id = 0

    llm = SeedChatModel(backend=FakeBackend(Tok(), "look"), tokenizer=Tok(), sampling=SamplingParams(max_tokens=4))
    graph = AlfWorldSuite(data_dir=tmp_path, max_turns=7).build_graph(llm, history_window=2)
    assert set(graph.get_graph().nodes) >= {"observe", "act", "step"}


@pytest.mark.parametrize("size", ["3b", "7b"])
def test_paper_configs_validate(size):
    cfg = load_config(TrainConfig, CONFIGS / f"paper_alfworld_qwen2.5-{size}.yaml", {})
    assert (cfg.env, cfg.split, cfg.tasks_per_iteration, cfg.runner.group_size) == ("alfworld", "train", 16, 8)
    assert (cfg.trainer.learning_rate, cfg.iterations) == (1e-6, 150)
    assert (cfg.agent.max_turns, cfg.agent.history, cfg.agent.history_window) == (30, "window", 5)
    assert cfg.skills.injector == "task_line" and cfg.backend.kind == "vllm" and not cfg.trainer.merge_rows
    assert cfg.backend.model.endswith(f"Qwen2.5-{size.upper()}-Instruct")
    assert cfg.eval.split == "valid_seen" and cfg.eval.every == cfg.iterations and cfg.eval.temperature == 0.0
    assert cfg.num_tasks >= cfg.iterations * cfg.tasks_per_iteration
    suite = AlfWorldSuite(**cfg.env_options)  # every env option is one the suite takes
    assert (suite.win_reward, suite.invalid_penalty) == (10.0, 0.1)


def test_eval_config_validates():
    cfg = load_config(EvalConfig, CONFIGS / "eval_alfworld.yaml", {})
    assert (cfg.env, cfg.split, cfg.episodes, cfg.runner.group_size) == ("alfworld", "valid_seen", 140, 1)
    assert (cfg.agent.max_turns, cfg.agent.history, cfg.agent.history_window) == (30, "window", 5)
    assert cfg.sampling.temperature == 0.0


# -- the offline analyzer: skills from the goal and the commands, as data -----------------------

from seed_agents.tools.alfworld_analyzer import AlfWorldAnalyzer, generalize, goal_of  # noqa: E402


def alf_turn(listed, action, *, invalid=False, reward=0.0):
    from seed_agents.types import EnvStep

    return EnvStep(observation="...", admissible_actions=listed, action=action, invalid=invalid, reward=reward)


def alf_skill(steps, success, game_type="clean", goal="Your task is to: put a clean mug in coffeemachine."):
    import asyncio

    from seed_agents.skills import parse_skill
    from seed_agents.types import EpisodeRecord

    episode = EpisodeRecord(success=success, steps=steps, metadata={"objective": goal, "game_type": game_type})
    reply = asyncio.run(AlfWorldAnalyzer().analyze(None, episode))
    assert reply.error is None, reply.error
    summary, skill, reason = parse_skill(reply.text)
    assert reason is None, reply.text
    return summary, skill


AT_COUNTER = ["go to sinkbasin 1", "take mug 1 from countertop 1", "look"]
AT_SINK = ["clean mug 1 with sinkbasin 1", "go to coffeemachine 1", "look"]
AT_MACHINE = ["move mug 1 to coffeemachine 1", "look"]


def test_alfworld_workflow_names_kinds_not_instances_in_order():
    steps = [alf_turn(["go to countertop 1"], "go to countertop 1"), alf_turn(AT_COUNTER, "take mug 1 from countertop 1"),
             alf_turn(AT_COUNTER, "look"), alf_turn(AT_COUNTER, "go to sinkbasin 1"),
             alf_turn(AT_SINK, "clean mug 1 with sinkbasin 1"), alf_turn(AT_SINK, "go to coffeemachine 1"),
             alf_turn(AT_MACHINE, "move mug 1 to coffeemachine 1", reward=10.0)]
    summary, skill = alf_skill(steps, True)
    assert skill.startswith("To put a clean mug in coffeemachine: 'take mug from countertop', then "
                            "'clean mug with sinkbasin', then 'move mug to coffeemachine'.")
    assert "mug 1" not in skill and "'look'" not in skill and "succeeded in 7 steps" in summary


def test_alfworld_failure_rules_name_the_missing_steps_and_never_quote_failures():
    steps = [alf_turn(["go to countertop 1"], "go to countertop 1"), alf_turn(AT_COUNTER, "fly to the mug", invalid=True),
             alf_turn(AT_COUNTER, "look"), alf_turn(AT_COUNTER, "look")]
    summary, skill = alf_skill(steps, False)
    assert skill.startswith("The goal needs the mug:")  # offered by 'take mug 1 from countertop 1', never taken
    assert "clean it with the sinkbasin" in skill  # the clean task's own step never happened
    assert "exactly one command copied from the admissible list" in skill
    assert "fly to" not in skill and "never took the mug" in summary and "1 invalid command" in summary


def test_alfworld_analyzer_helpers():
    assert generalize("take mug 12 from countertop 3") == "take mug from countertop"
    from seed_agents.types import EpisodeRecord

    assert goal_of(EpisodeRecord(first_observation="You see a shelf 1.\n\nYour task is to: put a mug in shelf.")) \
        == "put a mug in shelf"


def test_alfworld_analyzer_reads_what_the_env_agent_recorded(fake_engine, tmp_path, tokenizer):
    """The real AlfWorldEnv (fake engine) played by the ALFWorld graph: the goal comes from
    info["objective"], the commands from the recorded turns."""
    import asyncio

    from seed_agents.capture import capture
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.graphs.alfworld import build_alfworld_agent
    from seed_agents.testing import FakeBackend
    from seed_agents.types import EpisodeRecord, SamplingParams, Task

    llm = SeedChatModel(backend=FakeBackend(tokenizer, ["go to shelf 1", "move mug 1 to shelf 1"]), tokenizer=tokenizer,
                        sampling=SamplingParams(max_tokens=12))
    graph = build_alfworld_agent(llm, max_turns=4)
    env = AlfWorldEnv(tmp_path / "game.tw-pddl", task_id="t1", game_type="pick")

    async def play():
        with capture():
            return await graph.ainvoke({"task": Task(task_id="t1")}, config={"configurable": {"env": env}})

    state = asyncio.run(play())
    assert state["success"]
    episode = EpisodeRecord.from_metadata(state["metadata"], success=True)
    reply = asyncio.run(AlfWorldSuite(data_dir=tmp_path).offline_analyzer().analyze(None, episode))
    assert "To put a mug in shelf: 'move mug to shelf'" in json.loads(reply.text)["episode_skill"]
