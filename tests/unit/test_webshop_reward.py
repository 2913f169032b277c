"""WebShop's purchase reward on hand-computed cases.

reward = r_type * (attributes matched + options matched + [price <= budget])
                / (goal attributes + goal options + 1)
"""

import pytest

from seed_agents.tools.webshop.catalog import Goal, Product
from seed_agents.tools.webshop.reward import get_reward, normalize_color, title_nouns, token_set_ratio, type_reward

SHIRT = Product(
    asin="B000SHIRT1", title="Acme Red Cotton T-Shirt", price=20.0, price_tag="$20.0", category="fashion",
    query="t-shirt", product_category="Clothing › Men › Shirts › T-Shirts",
    attributes=("cotton", "machine wash"), options={"color": ("red", "blue"), "size": ("small", "x-large")},
    description="A soft tee.", bullet_points=("Soft fabric",),
)
GOAL = Goal(
    instruction="i need a cotton machine wash t-shirt in red, x-large", asin=SHIRT.asin, category="fashion",
    query="t-shirt", name=SHIRT.title, product_category=SHIRT.product_category,
    attributes=("cotton", "machine wash"), options=("red", "x-large"), price_upper=30.0,
)
RIGHT = {"color": "red", "size": "x-large"}


def product(**changes):
    return Product(**{**{f: getattr(SHIRT, f) for f in SHIRT.__dataclass_fields__}, **changes})


def goal(**changes):
    return Goal(**{**GOAL.__dict__, **changes})


def test_everything_matched_is_one():
    reward, info = get_reward(SHIRT, GOAL, 20.0, RIGHT)
    assert reward == 1.0
    assert info["r_type"] == 1.0 and info["r_price"] is True
    assert info["attributes_matched"] == 2 and info["options_matched"] == 2


def test_one_of_two_attributes():
    # "slim fit" is nowhere in the product: (1 + 2 + 1) / (2 + 2 + 1)
    reward, info = get_reward(SHIRT, goal(attributes=("cotton", "slim fit")), 20.0, RIGHT)
    assert reward == pytest.approx(4 / 5) and info["r_att"] == 0.5


def test_attribute_found_in_description_or_fuzzily():
    # Not in the attribute list, but verbatim in the description: it counts.
    p = product(attributes=("100% cotton",), description="Machine wash cold. A soft tee.".lower())
    assert get_reward(p, GOAL, 20.0, RIGHT)[0] == 1.0  # "100% cotton" ~ "cotton" (token set)


def test_option_mismatch():
    # blue instead of red: (2 + 1 + 1) / 5
    assert get_reward(SHIRT, GOAL, 20.0, {"color": "blue", "size": "x-large"})[0] == pytest.approx(4 / 5)


def test_no_option_chosen():
    reward, info = get_reward(SHIRT, GOAL, 20.0, {})
    assert reward == pytest.approx(3 / 5) and info["r_option"] == 0.0


def test_price_over_budget():
    reward, info = get_reward(SHIRT, GOAL, 35.0, RIGHT)
    assert reward == pytest.approx(4 / 5) and info["r_price"] is False


def test_goal_without_options():
    # (2 + 0 + 1) / (2 + 0 + 1): options the goal did not ask for do not matter
    assert get_reward(SHIRT, goal(options=()), 20.0, {"color": "blue"})[0] == 1.0


def test_type_mismatch_halves_everything():
    # Another kind of product that happens to match every attribute, option and the price:
    # no query or category match, title nouns {acme} / [acme, red, cotton, t, shirt] = 0.2,
    # not above 0.2 -> r_type 0.5.
    mug = product(title="Acme Ceramic Coffee Mug", query="coffee mug", product_category="Home › Kitchen › Mugs",
                  options={"color": ("red",), "size": ("x-large",)})
    reward, info = get_reward(mug, GOAL, 20.0, RIGHT)
    assert info["title_score"] == pytest.approx(0.2) and not info["query_match"] and not info["category_match"]
    assert info["r_type"] == 0.5 and reward == pytest.approx(0.5)


def test_no_shared_title_noun_zeroes_the_reward():
    mug = product(title="Zenith Ceramic Mug", query="coffee mug", product_category="Home › Kitchen › Mugs")
    reward, info = get_reward(mug, GOAL, 20.0, RIGHT)
    assert info["r_type"] == 0.0 and reward == 0.0


def test_tiny_title_overlap_gives_a_tenth():
    # 1 shared noun of 11 wanted: title_score 1/11 < 0.1 -> r_type 0.1 even with a query match
    long_name = "Acme alpha bravo charlie delta echo foxtrot golf hotel india juliet"
    info = type_reward(product(title="Acme Mug"), goal(name=long_name))
    assert info["query_match"] and info["title_score"] == pytest.approx(1 / 11) and info["r_type"] == 0.1


def test_query_or_category_match_keeps_full_type_reward():
    # title_score 0.2 (not > 0.2) is rescued by a query match, or by two shared category levels
    p = product(title="Acme Mug")
    assert type_reward(p, GOAL)["r_type"] == 1.0  # same query
    other_query = product(title="Acme Mug", query="tee")
    assert type_reward(other_query, GOAL)["r_type"] == 1.0  # Clothing, Men, ... shared
    unrelated = product(title="Acme Mug", query="tee", product_category="Clothing › Women")
    assert type_reward(unrelated, GOAL)["r_type"] == 0.5


def test_reward_parts_combine_multiplicatively():
    # type 0.5, one attribute of two, one option of two, price over: 0.5 * (1 + 1 + 0) / 5
    mug = product(title="Acme Ceramic Coffee Mug", query="coffee mug", product_category="Home › Kitchen › Mugs",
                  attributes=("cotton",), options={"color": ("red",)})
    assert get_reward(mug, GOAL, 99.0, {"color": "red"})[0] == pytest.approx(0.5 * 2 / 5)


@pytest.mark.parametrize("a,b,score", [
    ("red", "bright red", 100),  # one side's words all shared
    ("x-large", "large", 100),  # punctuation splits words: the original's quirk, kept
    ("abcd", "abce", 75),  # no shared word: plain ratio 2 * 3 / 8
    ("Cotton", "cotton!", 100),  # case and punctuation ignored
    ("", "red", 0),
])
def test_token_set_ratio(a, b, score):
    assert token_set_ratio(a, b) == score


def test_color_normalization():
    assert normalize_color("navy blue") == "blue"  # first color of the alphabetical list
    assert normalize_color("dark grey") == "dark"
    assert normalize_color("x-large") == "x-large"
    # "light blue" and "navy blue" both become "blue": a match, as in the original
    assert get_reward(SHIRT, goal(options=("navy blue",)), 20.0, {"color": "light blue"})[0] == 1.0


def test_title_nouns_drop_stopwords_and_numbers():
    assert title_nouns("The Best T-Shirt for Men, 2 Pack") == ["best", "t", "shirt", "men", "pack"]
