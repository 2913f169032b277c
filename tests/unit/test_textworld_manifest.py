"""The TextWorld manifest and text cleaning: fast, no game is generated."""

import pytest

from seed_agents.envs import EnvSuite, available_envs, load_env_suite
from seed_agents.tools.textworld import SEEN_TYPES, SPLITS, UNSEEN_TYPES, TextWorldSuite, clean_feedback, manifest


def test_ids_are_stable_and_unique():
    first = manifest("train", 5)
    assert [t.task_id for t in first] == [
        "tw-treasure_hunter-l1-s100000",
        "tw-treasure_hunter-l2-s100001",
        "tw-treasure_hunter-l3-s100002",
        "tw-custom-w2-o3-q2-s100003",
        "tw-treasure_hunter-l1-s100004",
    ]
    assert [t.model_dump() for t in manifest("train", 5)] == [t.model_dump() for t in first]
    ids = [t.task_id for split in SPLITS for t in manifest(split, 500)]
    assert len(ids) == len(set(ids))


def test_task_data_holds_generation_params():
    task = manifest("eval_unseen", 1)[0]
    assert task.split == "eval_unseen"
    assert task.data == {
        "game_type": "coin_collector-l2",
        "make_args": ["tw-coin_collector", "--level", "2"],
        "seed": 300000,
    }


def test_splits_have_disjoint_seeds():
    seeds = {split: {t.data["seed"] for t in manifest(split, 2000)} for split in SPLITS}
    assert not seeds["train"] & seeds["eval_seen"]
    assert not seeds["train"] & seeds["eval_unseen"]
    assert not seeds["eval_seen"] & seeds["eval_unseen"]


def test_unseen_types_only_in_eval_unseen():
    seen = {g.name for g in SEEN_TYPES}
    unseen = {g.name for g in UNSEEN_TYPES}
    assert not seen & unseen
    for split in ("train", "eval_seen"):
        assert {t.data["game_type"] for t in manifest(split, 100)} == seen
    assert {t.data["game_type"] for t in manifest("eval_unseen", 100)} == unseen


def test_small_n_covers_several_types():
    assert len({t.data["game_type"] for t in manifest("train", 4)}) == 4
    assert len({t.data["game_type"] for t in manifest("eval_unseen", 2)}) == 2


@pytest.mark.parametrize("n", [0, 1, 7, 64])
def test_n_is_respected(n):
    assert len(TextWorldSuite(cache_dir="/nonexistent").tasks("eval_seen", n)) == n


def test_bad_split_and_bad_n():
    suite = TextWorldSuite(cache_dir="/nonexistent")
    with pytest.raises(ValueError, match="train, eval_seen, eval_unseen"):
        suite.tasks("test", 3)
    with pytest.raises(ValueError):
        suite.tasks("train", -1)


def test_suite_is_an_env_suite_and_creates_nothing(tmp_path):
    suite = TextWorldSuite(cache_dir=tmp_path / "cache")
    assert isinstance(suite, EnvSuite)
    assert suite.name == "textworld"
    suite.tasks("train", 10)
    assert not (tmp_path / "cache").exists()


def test_cache_dir_defaults_to_env_var(tmp_path, monkeypatch):
    monkeypatch.setenv("SEED_AGENTS_CACHE", str(tmp_path))
    assert TextWorldSuite().cache_dir == tmp_path


def test_registered_as_entry_point(tmp_path):
    if "textworld" not in available_envs():
        pytest.skip("seed-agents is not installed (no entry points)")
    assert isinstance(load_env_suite("textworld", cache_dir=tmp_path), TextWorldSuite)


def test_clean_feedback_strips_banner_status_and_footer():
    raw = (
        "\n\n                    ________  ________  __    __  ________        \n"
        "                   |        \\|        \\|  \\  |  \\|        \\       \n"
        "                    \\$$$$$$$$| $$$$$$$$| $$  | $$ \\$$$$$$$$       \n\n"
        "Your objective is to take the key.\n\n-= Shower =-\nYou've entered a shower.\n\n\n\n"
        "There is a key on the floor.\n\n>                                   -= Shower =-0/1"
    )
    assert clean_feedback(raw) == (
        "Your objective is to take the key.\n\n-= Shower =-\nYou've entered a shower.\n\nThere is a key on the floor."
    )
    end = (
        "\nYou pick up the key.\n\n\n\nYour score has just gone up by one point.\n\n\n"
        "                *** The End ***\n\nYou scored 1 out of a possible 1, in 2 turns.\n\n\n"
        "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?\n>              "
    )
    assert clean_feedback(end) == (
        "You pick up the key.\n\nYour score has just gone up by one point.\n\n*** The End ***\n\n"
        "You scored 1 out of a possible 1, in 2 turns."
    )
