"""WebShop without a model: search, pages, invalid actions, catalogs, manifests, data
loading in the original file format, errors and configs."""

import json
import math
import random
from pathlib import Path

import pytest

from seed_agents.config import ConfigError, EvalConfig, TrainConfig, load_config
from seed_agents.envs import EnvSuite, TextEnv, load_env_suite
from seed_agents.tools.webshop import WebShopDataError, WebShopEnv, WebShopSuite, get_reward, synthetic_catalog
from seed_agents.tools.webshop.catalog import GOAL_SHUFFLE_SEED, Goal, load_webshop
from seed_agents.tools.webshop.env import RESULTS_PER_PAGE, SEARCH_ACTION
from seed_agents.tools.webshop.search import BM25Index, tokenize

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CATEGORIES = {f"synthetic-{c}" for c in ("beauty", "electronics", "fashion", "food", "furniture")}


@pytest.fixture(scope="module")
def suite():
    return WebShopSuite(seed=0)


# ---------------------------------------------------------------- search


def test_bm25_score_matches_the_formula():
    index = BM25Index(["apple banana", "apple", "cherry"])
    # N=3, df(banana)=1, avgdl=4/3, doc 0 has length 2: idf * tf*(k1+1) / (tf + k1*(1-b+b*dl/avgdl))
    idf = math.log(1 + (3 - 1 + 0.5) / (1 + 0.5))
    expected = idf * 1.9 / (1 + 0.9 * (0.6 + 0.4 * 2 / (4 / 3)))
    assert index.scores("banana") == {0: pytest.approx(expected)}
    assert index.search("banana") == [0]


def test_bm25_ranking():
    docs = ["red cotton shirt", "blue cotton shirt", "red wine glass", "Shirts, the red ones", "red cotton shirt"]
    index = BM25Index(docs)
    ranked = index.search("red shirt")
    assert set(ranked[:3]) == {0, 3, 4} and ranked.index(0) < ranked.index(4)  # exact tie -> earlier doc
    assert index.search("the of and") == [] and index.search("zebra") == []
    assert index.search("cotton", k=1) == [0]
    assert index.search("wine")[0] == 2
    assert tokenize("The Batteries, Shoes & Glass") == ["battery", "shoe", "glass"]


@pytest.mark.parametrize("seed", range(5))
def test_vectorized_bm25_equals_the_plain_python_formula_bit_for_bit(seed):
    """Random documents over a tiny vocabulary (many shared terms, repeated words, exact
    ties, empty documents): the numpy scorer gives the reference loop's scores exactly
    and the same top-k, ties to the earlier document included."""
    import random

    from seed_agents.tools.webshop.search import reference_scores, reference_search

    rng = random.Random(seed)
    vocab = ["red", "shirt", "cotton", "wine", "glass", "blue", "shoe", "the", "battery", "x1"]
    docs = [" ".join(rng.choices(vocab, k=rng.randint(0, 12))) for _ in range(300)]
    docs += docs[:20]  # duplicates: exact ties
    index = BM25Index(docs)
    for _ in range(30):
        query = " ".join(rng.choices(vocab + ["zebra"], k=rng.randint(1, 6)))
        assert index.scores(query) == reference_scores(index, query)
        for k in (1, 7, 50, 1000):
            assert index.search(query, k) == reference_search(index, query, k)


# ---------------------------------------------------------------- pages and protocol


def goal_task(suite, k=0):
    return suite.tasks("test", k + 1)[k]


def test_a_full_visit_through_every_page(suite):
    task = goal_task(suite)
    env = suite.make_env(task)
    assert isinstance(env, TextEnv)
    obs = env.reset()
    assert obs.admissible_actions == [SEARCH_ACTION]
    assert obs.text.splitlines()[1] == f"Instruction: {task.data['instruction']}"
    assert obs.info == {"game_type": task.data["game_type"], "catalog": "synthetic", "page": "search",
                        "task_id": task.task_id}

    obs = env.step(f"search[{task.data['query']}]")
    assert obs.info["page"] == "results" and "Page 1 (Total results: " in obs.text
    assert obs.admissible_actions[:2] == ["click[Back to Search]", "click[Next >]"]
    asins = [a[6:-1] for a in obs.admissible_actions[2:]]
    assert len(asins) == RESULTS_PER_PAGE and all(f"[{a}]" in obs.text for a in asins)

    page2 = env.step("click[next >]")  # case-insensitive
    assert "Page 2" in page2.text and "click[< Prev]" in page2.admissible_actions
    assert env.step("click[< Prev]").admissible_actions == obs.admissible_actions

    target = suite.catalog.by_asin[asins[0]]
    item = env.step(f"click[{asins[0].lower()}]")
    assert item.info["page"] == "item" and target.title in item.text and f"Price: {target.price_tag}" in item.text
    values = [v for vs in target.options.values() for v in vs]
    assert item.admissible_actions == ["click[Back to Search]", "click[< Prev]", *(f"click[{v}]" for v in values),
                                       "click[Description]", "click[Features]", "click[Reviews]", "click[Buy Now]"]
    name, first = next(iter(target.options.items()))[0], values[0]
    assert f"Selected: {name}: {first}" in env.step(f"click[{first}]").text

    desc = env.step("click[Description]")
    assert desc.info["page"] == "sub" and target.description in desc.text
    assert desc.admissible_actions == ["click[Back to Search]", "click[< Prev]"]
    back = env.step("click[< Prev]").text
    assert "Selected:" in back and target.title in back  # the options are kept
    assert "- " + target.bullet_points[0] in env.step("click[Features]").text
    env.step("click[< Prev]")
    assert env.step("click[< Prev]").admissible_actions == obs.admissible_actions  # back to page 1
    assert env.step("click[Back to Search]").admissible_actions == [SEARCH_ACTION]


def test_buying_ends_the_episode_with_the_reward(suite):
    task = goal_task(suite, 2)
    goal, catalog = task.data, suite.catalog
    env = suite.make_env(task)
    env.reset()
    env.step(f"search[{goal['instruction']}]")
    env.step(f"click[{goal['asin']}]")
    for value in goal["options"]:
        env.step(f"click[{value}]")
    obs = env.step("click[Buy Now]")
    assert obs.done and obs.won and not obs.lost and obs.reward == 1.0
    assert obs.admissible_actions == [] and "Your score (min 0.0, max 1.0): 1" in obs.text
    assert obs.info["purchased_asin"] == goal["asin"] and obs.info["reward_parts"]["r_type"] == 1.0
    with pytest.raises(RuntimeError, match="over"):
        env.step("click[Buy Now]")

    # Without the options: the reward is the product's, computed by the reward function.
    product = catalog.by_asin[goal["asin"]]
    env = WebShopEnv(catalog, Goal.from_data(goal))
    env.reset()
    env.step(f"search[{goal['instruction']}]")
    env.step(f"click[{goal['asin']}]")
    obs = env.step("click[buy now]")
    expected = get_reward(product, env.goal, product.price, {})[0]
    assert obs.reward == expected < 1 and obs.done and not obs.won and obs.lost


@pytest.mark.parametrize("action,reason", [
    ("buy the shirt", "use search[your query] or click"),
    ("click[Buy Now]", "no [Buy Now]"),
    ("click[Back to Search]", "no [Back to Search]"),
    ("search[]", "query is empty"),
    ("click[Search]", "no [Search]"),
])
def test_invalid_actions_leave_the_search_page_as_it_was(suite, action, reason):
    env = suite.make_env(goal_task(suite))
    first = env.reset()
    obs = env.step(action)
    assert obs.invalid and reason in obs.text and obs.text.startswith("Invalid action:")
    assert not obs.done and obs.reward == 0
    assert first.text in obs.text and obs.admissible_actions == first.admissible_actions and obs.info == first.info


def test_invalid_actions_on_the_results_page(suite):
    env = suite.make_env(goal_task(suite))
    env.reset()
    results = env.step("search[shampoo]")
    for action in ("search[lipstick]", "click[SYN9999999]", "click[< Prev]", "click[Description]"):
        obs = env.step(action)
        assert obs.invalid and obs.admissible_actions == results.admissible_actions
    assert "no search bar" in env.step("search[lipstick]").text
    assert not env.step("  CLICK [Back to Search] ").invalid  # spacing and case are forgiven


def test_step_before_reset_raises(suite):
    with pytest.raises(RuntimeError, match="reset"):
        suite.make_env(goal_task(suite)).step("search[x]")


def test_search_only_returns_fifty_results_at_most(suite):
    env = suite.make_env(goal_task(suite))
    env.reset()
    obs = env.step("search[black white red green small large organic free]")
    assert "(Total results: 50)" in obs.text
    for _ in range(4):
        obs = env.step("click[Next >]")
    assert "Page 5" in obs.text and "click[Next >]" not in obs.admissible_actions


# ---------------------------------------------------------------- synthetic catalog and manifest


def test_synthetic_catalog_is_deterministic_and_consistent():
    a, b = synthetic_catalog(0), synthetic_catalog(0)
    assert a.products == b.products and a.goals == b.goals
    assert synthetic_catalog(1).goals != a.goals
    assert len(a.products) == 120 and len(a.goals) == 360
    assert {g.category for g in a.goals} == CATEGORIES
    for g in a.goals:
        p = a.by_asin[g.asin]
        assert set(g.attributes) <= set(p.attributes) and g.price_upper > p.price
        chosen = {name: v for name, values in p.options.items() for v in values if v in g.options}
        assert set(chosen.values()) == set(g.options)
        assert get_reward(p, g, p.price, chosen)[0] == 1.0  # every goal is winnable


def test_manifest_is_stable_and_splits_are_disjoint(suite):
    first = [t.model_dump() for t in suite.tasks("train", 20)]
    again = [t.model_dump() for t in WebShopSuite(seed=123).tasks("train", 20)]
    assert first == again
    assert [t["task_id"] for t in first[:3]] == ["webshop-synthetic-00200", "webshop-synthetic-00201",
                                                 "webshop-synthetic-00202"]
    ids = {split: {t.task_id for t in suite.tasks(split, len(suite.catalog.split_range(split)))}
           for split in ("train", "eval", "test")}
    assert [len(v) for v in ids.values()] == [160, 100, 100]
    assert not (ids["train"] & ids["eval"]) and not (ids["train"] & ids["test"]) and not (ids["eval"] & ids["test"])
    assert {t.data["game_type"] for t in suite.tasks("test", 5)} == CATEGORIES


def test_bad_split_and_bad_n(suite):
    with pytest.raises(ValueError, match="valid splits: test, eval, train"):
        suite.tasks("eval_seen", 1)
    with pytest.raises(ValueError, match=r"\[0, 100\]"):
        suite.tasks("test", 101)


def test_suite_is_registered_with_the_protocol_defaults(suite):
    loaded = load_env_suite("webshop", seed=0, catalog="synthetic")
    assert isinstance(loaded, EnvSuite) and loaded.name == "webshop"
    assert loaded.catalog is suite.catalog  # loaded once per process
    assert WebShopSuite.agent_defaults == {"max_turns": 15, "history": "window", "history_window": 2}


def test_bad_suite_options_get_one_clear_error():
    with pytest.raises(ConfigError, match="unknown webshop env_options.*data_dirr"):
        WebShopSuite(data_dirr="/x")
    with pytest.raises(ConfigError, match="unknown webshop catalog"):
        WebShopSuite(catalog="amazon")
    with pytest.raises(ConfigError, match="ignores data_dir"):
        WebShopSuite(catalog="synthetic", data_dir="/x")


# ---------------------------------------------------------------- the original data files


def write_original_files(root: Path, suffix: str = "_1000") -> None:
    def product(asin, name, pricing, options, query="shirt", category="fashion"):
        return {"asin": asin, "name": name, "full_description": f"{name}. Soft and warm.",
                "small_description": [f"About {name}"], "pricing": pricing, "customization_options": options,
                "category": category, "query": f" {query.upper()} ", "images": ["x.jpg"],
                "product_category": "Clothing › Men › Shirts", "brand": "Acme"}

    products = [
        product("B000000001", "Acme Wool Shirt", "$25.00", {"Color": [{"value": "Navy/White", "image": None}]}),
        product("B000000002", "Acme Cotton Shirt", "$10.00 - $20.00", {"Size": [{"value": "Large"}], "Fit": None}),
        product("B000000001", "A duplicate ASIN", "$1.00", {}),
        product("nan", "No ASIN", "$1.00", {}),
        product("B000000003", "Acme Silk Scarf", "", None, query="scarf"),
        product("B000000004", "Acme Luxury Coat", "$995.00", {}, query="coat"),
    ]
    attributes = {"B000000001": {"attributes": ["wool", "machine wash"]}, "B000000002": {"attributes": ["cotton"]}}
    def ins(text, attrs, opts=()):
        return {"instruction": text, "instruction_attributes": list(attrs), "instruction_options": list(opts)}

    human = {
        "B000000001": [ins("i want a wool shirt in navy.", ["wool"], ["navy | white"]),
                       ins("no attributes: skipped", [])],
        "B000000002": [ins("cotton shirt, large", ["cotton"], ["large"])],
        "B000000003": [ins("a silk scarf", ["silk"])],
        "B000000004": [ins("a luxury coat", ["luxury"])],
    }
    (root / f"items_shuffle{suffix}.json").write_text(json.dumps(products))
    (root / f"items_ins_v2{suffix}.json").write_text(json.dumps(attributes))
    (root / "items_human_ins.json").write_text(json.dumps(human))


def test_loader_reads_the_original_format(tmp_path):
    write_original_files(tmp_path)
    catalog = load_webshop(tmp_path)
    assert [p.asin for p in catalog.products] == ["B000000001", "B000000002", "B000000003", "B000000004"]
    wool, cotton, scarf, coat = catalog.products
    assert wool.options == {"color": ("navy | white",)} and wool.price == 25.0 and wool.price_tag == "$25.0"
    assert wool.attributes == ("wool", "machine wash") and wool.query == "shirt"
    assert cotton.options == {"size": ("large",)} and cotton.price_tag == "$10.0 to $20.0"
    assert 10 <= cotton.price <= 20  # one draw inside the range
    assert scarf.price == 100.0 and scarf.attributes == ("DUMMY_ATTR",) and scarf.options == {}

    # One goal per human instruction with attributes, shuffled like the original server's list.
    unshuffled = ["i want a wool shirt in navy", "cotton shirt, large", "a silk scarf", "a luxury coat"]
    random.Random(GOAL_SHUFFLE_SEED).shuffle(unshuffled)
    assert [g.instruction.split(", and price lower than")[0] for g in catalog.goals] == unshuffled
    goals = {g.asin: g for g in catalog.goals}
    wool_goal = goals["B000000001"]
    assert wool_goal.price_upper in (40.0, 50.0, 60.0)  # above $25: the larger of 2 of {30, 40, 50, 60}
    assert wool_goal.instruction.endswith(f", and price lower than {wool_goal.price_upper:.2f} dollars")
    assert goals["B000000004"].price_upper == 1_000_000 and goals["B000000004"].instruction == "a luxury coat"
    assert goals["B000000001"].options == ("navy | white",)
    assert load_webshop(tmp_path).goals == catalog.goals  # budgets are seeded

    suite = WebShopSuite(data_dir=tmp_path)
    tasks = suite.tasks("test", 4)
    assert [t.task_id for t in tasks] == ["webshop-00000", "webshop-00001", "webshop-00002", "webshop-00003"]
    assert tasks[0].data["catalog"] == "webshop" and tasks[0].data["game_type"] == "fashion"
    assert suite.tasks("train", 0) == [] and suite.tasks("eval", 0) == []

    # The goal's own product with its options wins in the env.
    task = next(t for t in tasks if t.data["asin"] == "B000000001")
    env = suite.make_env(task)
    env.reset()
    assert "click[B000000001]" in env.step("search[wool shirt]").admissible_actions
    env.step("click[B000000001]")
    env.step("click[navy | white]")
    assert env.step("click[Buy Now]").reward == 1.0


def test_full_file_names_are_preferred_and_explicit_names_win(tmp_path):
    write_original_files(tmp_path, suffix="")
    assert len(load_webshop(tmp_path).goals) == 4
    (tmp_path / "items_shuffle.json").rename(tmp_path / "mine.json")
    with pytest.raises(WebShopDataError, match="items_shuffle.json or items_shuffle_1000.json not found"):
        load_webshop(tmp_path)
    assert len(load_webshop(tmp_path, products_file="mine.json").goals) == 4


@pytest.mark.parametrize("damage,message", [
    (lambda d: d.rmdir(), "data directory not found"),
    (lambda d: None, "items_shuffle.json or items_shuffle_1000.json not found"),
    (lambda d: (write_original_files(d), (d / "items_human_ins.json").unlink()), "items_human_ins.json not found"),
    (lambda d: (write_original_files(d), (d / "items_ins_v2_1000.json").write_text("{not json")), "cannot read"),
    (lambda d: (write_original_files(d), (d / "items_shuffle_1000.json").write_text("{}")), "expected a JSON list"),
    (lambda d: (write_original_files(d), (d / "items_human_ins.json").write_text("{}")), "no goals"),
])
def test_bad_data_dir_gets_one_error_that_says_what_to_do(tmp_path, damage, message):
    data = tmp_path / "data"
    data.mkdir()
    damage(data)
    with pytest.raises(WebShopDataError, match=message) as err:
        WebShopSuite(data_dir=data)
    assert isinstance(err.value, FileNotFoundError)
    text = str(err.value)
    for hint in ("items_shuffle.json", "items_ins_v2.json", "items_human_ins.json", "setup.sh",
                 "princeton-nlp/WebShop", "catalog: synthetic"):
        assert hint in text


def test_catalog_webshop_without_data_dir():
    with pytest.raises(WebShopDataError, match="no data_dir given"):
        WebShopSuite(catalog="webshop")


def test_cli_prints_the_data_error_without_a_traceback(tmp_path, capsys):
    from seed_agents.app.cli import main

    cfg = tmp_path / "eval.yaml"
    cfg.write_text(f"env: webshop\nsplit: test\nenv_options:\n  data_dir: {tmp_path / 'missing'}\n")
    code = main(["eval", "--config", str(cfg), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "WebShop data directory not found" in err and "Traceback" not in err


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("name", ["paper_webshop_qwen2.5-3b.yaml", "paper_webshop_qwen2.5-7b.yaml"])
def test_paper_configs(name):
    cfg = load_config(TrainConfig, CONFIGS / name, {})
    assert cfg.env == "webshop" and cfg.split == "train" and "data_dir" in cfg.env_options
    assert (cfg.tasks_per_iteration, cfg.runner.group_size, cfg.iterations) == (16, 8, 150)
    assert cfg.trainer.learning_rate == 1e-6 and cfg.backend.kind == "vllm"
    assert (cfg.agent.max_turns, cfg.agent.history, cfg.agent.history_window) == (15, "window", 2)
    assert cfg.num_tasks >= cfg.tasks_per_iteration * cfg.iterations  # no goal trained on twice
    assert cfg.eval.split == "test" and cfg.eval.num_tasks == 500 and cfg.eval.every == cfg.iterations  # at the end
    assert "2.5-" + name.split("2.5-")[1].split(".yaml")[0].upper() in cfg.backend.model.upper()


def test_eval_config():
    cfg = load_config(EvalConfig, CONFIGS / "eval_webshop.yaml", {})
    assert cfg.env == "webshop" and cfg.split == "test" and cfg.num_tasks == 500
    assert (cfg.agent.max_turns, cfg.agent.history_window) == (15, 2) and cfg.sampling.temperature == 0.0
