"""WebShop's purchase reward, reimplemented from the original ``engine/goal.py``.

    reward = r_type * (matched attributes + matched options + [price <= budget])
                     / (goal attributes  + goal options    + 1)

``r_type`` (0, 0.1, 0.5 or 1) says whether the bought product is the kind asked for: the
same search query, two shared levels of the category path, or enough shared title nouns.
Success is ``reward == 1``.

Where this departs from the original, and why:
- Title nouns: the original tags both titles with spaCy (``en_core_web_sm``) and keeps
  NOUN/PROPN tokens. We keep every word with a letter that is not a stopword. Product
  titles are Title Case, so spaCy tags nearly all of their words PROPN anyway; the
  difference is adjectives and verbs in lower-case titles, which we keep and it drops.
  A title compared with itself scores 1 either way.
- Fuzzy matching is thefuzz 0.19's ``token_set_ratio`` (the version WebShop pins) with
  its pure-Python ``difflib`` matcher, which is what runs when python-Levenshtein is
  not installed (WebShop's requirements do not list it). With it installed, scores near
  the 85 threshold can differ slightly.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from difflib import SequenceMatcher
from typing import Any, Protocol

FUZZY_THRESHOLD = 85  # token_set_ratio above this counts as a match
CATEGORY_SEP = "›"

# Option values are reduced to the first of these colors they contain before matching,
# scanning in this (alphabetical) order: "navy blue" -> "blue", "dark grey" -> "dark".
COLORS = tuple("""
alabaster apricot aqua ash asphalt azure banana beige black blue blush bordeaux bronze
brown burgundy camel camo caramel champagne charcoal cheetah chestnut chocolate christmas
coffee cognac copper coral cranberry cream crystal dark denim eggplant elephant espresso
fuchsia gold granite grape graphite grass gray green grey heather indigo ivory ivy khaki
lavender lemon leopard light lilac lime magenta maroon mauve merlot midnight mint mocha
multicolor mushroom mustard natural navy nude olive orange peach pewter pink plum purple
rainbow red rose royal rust sand sapphire seashell silver skull slate steel stone
stonewash sunflower tan taupe teal tiger turquoise violet walnut wheat white wine yellow
""".split())

_STOPWORDS = frozenset("""
a an and are as at be but by for from has have if in into is it its no not of on or so
such than that the their then there these they this to was were will with without your
you our we i me my
""".split())


class Purchasable(Protocol):
    """What the reward reads from a product (``catalog.Product`` has these fields)."""

    title: str
    query: str
    product_category: str
    attributes: Sequence[str]
    bullet_points: Sequence[str]
    description: str


class GoalSpec(Protocol):
    """What the reward reads from a goal (``catalog.Goal`` has these fields)."""

    name: str
    query: str
    product_category: str
    attributes: Sequence[str]
    options: Sequence[str]
    price_upper: float


# ---------------------------------------------------------------- fuzzy matching


def _full_process(s: str) -> str:
    """thefuzz's default preprocessing: drop Latin-1 high characters, non-word
    characters to spaces, lower case, strip."""
    s = "".join(c for c in s if not 128 <= ord(c) < 256)
    return re.sub(r"(?ui)\W", " ", s).lower().strip()


def _ratio(a: str, b: str) -> int:
    if a == b:
        return 100
    if not a or not b:
        return 0
    return int(round(100 * SequenceMatcher(None, a, b).ratio()))


def token_set_ratio(s1: str, s2: str) -> int:
    """0-100 similarity of two strings as word sets: the shared words compared with
    each side's full word set (so "red" vs "bright red" scores 100)."""
    p1, p2 = _full_process(s1), _full_process(s2)
    if not p1 or not p2:
        return 0
    t1, t2 = set(p1.split()), set(p2.split())
    sect = " ".join(sorted(t1 & t2))
    only1 = (sect + " " + " ".join(sorted(t1 - t2))).strip()
    only2 = (sect + " " + " ".join(sorted(t2 - t1))).strip()
    return max(_ratio(sect, only1), _ratio(sect, only2), _ratio(only1, only2))


def normalize_color(value: str) -> str:
    """The first color of ``COLORS`` that ``value`` contains, else ``value`` itself."""
    return next((c for c in COLORS if c in value), value)


# ---------------------------------------------------------------- reward terms


def title_nouns(title: str) -> list[str]:
    """Stand-in for spaCy's NOUN/PROPN tokens: lower-cased words with a letter, minus
    stopwords. A list, not a set: repeated words count in the denominator, as in spaCy."""
    words = re.findall(r"[a-z0-9]+(?:['’][a-z]+)?", title.lower())
    return [w for w in words if re.search(r"[a-z]", w) and w not in _STOPWORDS]


def type_reward(product: Purchasable, goal: GoalSpec) -> dict[str, Any]:
    query_match = product.query == goal.query
    bought = {x.strip() for x in product.product_category.split(CATEGORY_SEP)}
    wanted = {x.strip() for x in goal.product_category.split(CATEGORY_SEP)}
    category_match = len(bought & wanted) >= 2
    desired = title_nouns(goal.name)
    shared = len(set(title_nouns(product.title)) & set(desired))
    title_score = shared / len(desired) if desired else 0.2

    r_type = 1.0 if (query_match or category_match or title_score > 0.2) else 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match,
            "title_score": title_score}


def attribute_matches(product: Purchasable, goal_attributes: Iterable[str]) -> int:
    """Goal attributes found among the product's attributes (fuzzy), else verbatim in its
    title, features or description."""
    text = (product.title.lower(), " ".join(product.bullet_points).lower(), product.description.lower())
    n = 0
    for wanted in goal_attributes:
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in product.attributes):
            n += 1
        elif any(wanted in t for t in text):
            n += 1
    return n


def option_matches(chosen: Iterable[str], goal_options: Iterable[str]) -> int:
    """Goal option values matched (fuzzy, after color normalization) by a chosen value."""
    have = [normalize_color(o) for o in chosen]
    return sum(
        any(token_set_ratio(h, normalize_color(w)) > FUZZY_THRESHOLD for h in have)
        for w in goal_options
    )


def get_reward(product: Purchasable, goal: GoalSpec, price: float,
               options: dict[str, str]) -> tuple[float, dict[str, Any]]:
    """The reward of buying ``product`` at ``price`` with ``options`` ({name: value})
    for ``goal``, and its parts."""
    type_info = type_reward(product, goal)
    price_ok = price <= goal.price_upper
    n_attr = attribute_matches(product, goal.attributes)
    n_opt = option_matches(options.values(), goal.options)
    total = len(goal.attributes) + len(goal.options) + 1
    reward = (n_attr + n_opt + int(price_ok)) / total * type_info["r_type"]
    info = {
        **type_info,
        "r_att": n_attr / len(goal.attributes) if goal.attributes else None,
        "r_option": n_opt / len(goal.options) if goal.options else None,
        "r_price": price_ok,
        "attributes_matched": n_attr,
        "options_matched": n_opt,
    }
    return reward, info
