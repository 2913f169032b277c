"""Products, goals and splits: loaded from the original WebShop files, or synthetic.

The original data (``setup.sh`` in github.com/princeton-nlp/WebShop downloads it):

- ``items_shuffle.json`` (``items_shuffle_1000.json`` for the 1,000-product subset): a
  list of scraped products: ``asin``, ``name``, ``full_description``,
  ``small_description`` (the bullet points), ``pricing`` ("$12.99", or two prices),
  ``customization_options`` ({name: [{"value": ..., "image": ...}]}), ``category``,
  ``query`` and ``product_category`` ("A › B › C").
- ``items_ins_v2.json`` (``items_ins_v2_1000.json``): {asin: {"attributes": [...], ...}},
  the attribute tags the reward matches against.
- ``items_human_ins.json``: {asin: [{"instruction", "instruction_attributes",
  "instruction_options"}, ...]}, the crowd-written goals. These human goals are the
  standard benchmark; the original's alternative, goals generated from the attribute
  file's templates (``human_goals=False``), is not supported.

Loading follows the original ``load_products``/``get_human_goals``: skip bad or repeated
ASINs, lower-case option values with "/" written " | ", one goal per human instruction
with attributes, a budget drawn from the next few multiples of $10 above the price, then
the goal list shuffled with ``random.seed(233)``. The shuffle does not depend on the
budgets, so goal ``i`` here is goal ``i`` of the original server, and the splits are the
original's goal-index ranges (baseline_models/env.py): test = 0-499, eval = 500-1499,
train = 1500-end. The original draws prices inside a price range, and the budgets, from
the process-wide RNG before it seeds it with 233, so they depend on whatever ran first;
we draw both from ``Random(233)``, so a task's budget is the same in every run.
"""

from __future__ import annotations

import json
import random
import re
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from seed_agents.errors import ConfigError
from seed_agents.tools.webshop.search import BM25Index

SEARCH_TOP_K = 50
PRICE_STEPS = tuple(10.0 * i for i in range(1, 100))  # budgets are multiples of $10
NO_BUDGET = 1_000_000.0
GOAL_SHUFFLE_SEED = 233
WEBSHOP_SPLITS = {"test": (0, 500), "eval": (500, 1500), "train": (1500, None)}

PRODUCT_FILES = ("items_shuffle.json", "items_shuffle_1000.json")
ATTRIBUTE_FILES = ("items_ins_v2.json", "items_ins_v2_1000.json")
HUMAN_GOALS_FILE = "items_human_ins.json"


class WebShopDataError(FileNotFoundError):
    """The WebShop data directory is missing, incomplete or unreadable."""

    def __init__(self, problem: str) -> None:
        super().__init__(
            f"{problem}\nWebShop needs its data files in one folder (env_options.data_dir): "
            f"{PRODUCT_FILES[0]} (or {PRODUCT_FILES[1]}), {ATTRIBUTE_FILES[0]} (or "
            f"{ATTRIBUTE_FILES[1]}) and {HUMAN_GOALS_FILE}. Get them with the original "
            f"repository's setup script: git clone https://github.com/princeton-nlp/WebShop "
            f"&& cd WebShop && ./setup.sh -d all (or -d small for 1,000 products); it "
            f"downloads them with gdown into WebShop/data. Or play the built-in synthetic "
            f"catalog instead (env_options: {{catalog: synthetic}}); its scores are not "
            f"WebShop's."
        )


@dataclass(frozen=True, slots=True)
class Product:
    asin: str
    title: str
    price: float  # what the reward compares with the budget (one draw for a price range)
    price_tag: str  # what the pages show: "$12.99" or "$10.99 to $20.99"
    category: str
    query: str
    product_category: str
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]  # option name -> values, in page order
    description: str
    bullet_points: tuple[str, ...]
    rating: str = "N.A."

    def search_text(self) -> str:
        """What the search engine indexes (the original's document contents)."""
        opts = ", and ".join(f"{name}: {', '.join(values)}" for name, values in self.options.items())
        first_bullet = self.bullet_points[0] if self.bullet_points else ""
        return " ".join([self.title, self.description, first_bullet, opts]).lower()


@dataclass(frozen=True)
class Goal:
    """One shopping instruction and what the reward checks it against."""

    instruction: str
    asin: str  # the product the instruction was written for
    category: str
    query: str
    name: str  # that product's title
    product_category: str
    attributes: tuple[str, ...]
    options: tuple[str, ...]  # option values asked for
    price_upper: float

    def to_data(self) -> dict[str, Any]:
        d = asdict(self)
        d["attributes"], d["options"] = list(self.attributes), list(self.options)
        return d

    @classmethod
    def from_data(cls, data: dict[str, Any]) -> Goal:
        names = cls.__dataclass_fields__
        d = {k: v for k, v in data.items() if k in names}
        return cls(**{**d, "attributes": tuple(d["attributes"]), "options": tuple(d["options"])})


@dataclass
class Catalog:
    """Products and goals of one source; ``splits`` maps a split to a goal-index range."""

    source: str  # "webshop" or "synthetic"
    products: list[Product]
    goals: list[Goal]
    splits: dict[str, tuple[int, int | None]]
    by_asin: dict[str, Product] = field(init=False)
    _index: BM25Index | None = field(default=None, init=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def __post_init__(self) -> None:
        self.by_asin = {p.asin: p for p in self.products}

    def split_range(self, split: str) -> range:
        if split not in self.splits:

            raise ConfigError(f"unknown WebShop split {split!r} of the {self.source} catalog; valid splits: "
                              f"{', '.join(self.splits)}; choose one with --split (or split: in the config)")
        start, end = self.splits[split]
        return range(min(start, len(self.goals)), len(self.goals) if end is None else min(end, len(self.goals)))

    @property
    def index(self) -> BM25Index:
        """The search index, built on first use (once, whichever thread asks first)."""
        with self._lock:
            if self._index is None:
                self._index = BM25Index(p.search_text() for p in self.products)
            return self._index

    def search(self, query: str, k: int = SEARCH_TOP_K) -> list[Product]:
        return [self.products[i] for i in self.index.search(query, k)]


def budget_for(price: float, rng: random.Random) -> float:
    """The original's budget: the larger of two draws from the next four multiples of
    $10 above the price; no budget when fewer than two are left (prices near $1000)."""
    above = [p for p in PRICE_STEPS if p > price][:4]
    if len(above) < 2:
        return NO_BUDGET
    return max(rng.sample(above, 2))


def instruction_with_budget(text: str, price_upper: float) -> str:
    return text if price_upper >= NO_BUDGET else f"{text}, and price lower than {price_upper:.2f} dollars"


# ---------------------------------------------------------------- original files


def _resolve(data_dir: Path, given: str | Path | None, candidates: tuple[str, ...]) -> Path:
    if given is not None:
        path = Path(given).expanduser()
        path = path if path.is_absolute() else data_dir / path
        if not path.is_file():
            raise WebShopDataError(f"WebShop data file not found: {path}.")
        return path
    for name in candidates:
        if (data_dir / name).is_file():
            return data_dir / name
    raise WebShopDataError(f"WebShop data file {' or '.join(candidates)} not found in {data_dir}.")


def _read_json(path: Path, kind: type) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise WebShopDataError(f"cannot read WebShop data file {path}: {e}") from None
    if not isinstance(data, kind):
        raise WebShopDataError(f"{path} is not a WebShop data file: expected a JSON {kind.__name__}, "
                               f"got {type(data).__name__}.")
    return data


def _parse_pricing(raw: Any) -> list[float]:
    prices = []
    for part in str(raw or "").split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            prices.append(float(digits))
        except ValueError:
            continue
    return prices[:2]


def _product(raw: dict[str, Any], attributes: dict[str, Any], rng: random.Random) -> Product:
    pricing = _parse_pricing(raw.get("pricing")) or [100.0]
    if len(pricing) == 1:
        price, tag = pricing[0], f"${pricing[0]}"
    else:
        price, tag = rng.uniform(*pricing), f"${pricing[0]} to ${pricing[1]}"
    options: dict[str, tuple[str, ...]] = {}
    for name, contents in (raw.get("customization_options") or {}).items():
        if contents:
            options[name.lower()] = tuple(c["value"].strip().replace("/", " | ").lower() for c in contents)
    bullets = raw.get("small_description") or []
    attrs = (attributes.get(raw["asin"]) or {}).get("attributes") or ["DUMMY_ATTR"]
    return Product(
        asin=raw["asin"], title=raw.get("name") or "", price=price, price_tag=tag,
        category=raw.get("category") or "", query=(raw.get("query") or "").lower().strip(),
        product_category=raw.get("product_category") or "", attributes=tuple(attrs), options=options,
        description=raw.get("full_description") or "",
        bullet_points=tuple(bullets) if isinstance(bullets, list) else (str(bullets),),
    )


def _human_goal(p: Product, ins: dict[str, Any], rng: random.Random) -> Goal | None:
    attrs = ins.get("instruction_attributes") or []
    if not attrs:
        return None  # the original skips these too
    options = ins.get("instruction_options") or []
    upper = budget_for(p.price, rng)
    return Goal(
        instruction=instruction_with_budget(ins["instruction"].strip("."), upper), asin=p.asin,
        category=p.category, query=p.query, name=p.title, product_category=p.product_category,
        attributes=tuple(attrs), options=tuple(options.values() if isinstance(options, dict) else options),
        price_upper=upper,
    )


def find_webshop_files(data_dir: str | Path, products_file: str | Path | None = None,
                       attributes_file: str | Path | None = None,
                       human_goals_file: str | Path | None = None) -> tuple[Path, Path, Path]:
    """(products, attributes, human goals) paths; ``WebShopDataError`` if one is missing."""
    root = Path(data_dir).expanduser()
    if not root.is_dir():
        raise WebShopDataError(f"WebShop data directory not found: {root}.")
    return (_resolve(root, products_file, PRODUCT_FILES), _resolve(root, attributes_file, ATTRIBUTE_FILES),
            _resolve(root, human_goals_file, (HUMAN_GOALS_FILE,)))


def load_webshop(data_dir: str | Path, products_file: str | Path | None = None,
                 attributes_file: str | Path | None = None, human_goals_file: str | Path | None = None) -> Catalog:
    """The original catalog and human goals; ``WebShopDataError`` says what is wrong."""
    return load_webshop_files(*find_webshop_files(data_dir, products_file, attributes_file, human_goals_file))


def load_webshop_files(*paths: Path) -> Catalog:
    """``load_webshop`` on resolved (products, attributes, human goals) paths."""
    raw_products = _read_json(paths[0], list)
    attributes = _read_json(paths[1], dict)
    human = _read_json(paths[2], dict)

    rng = random.Random(GOAL_SHUFFLE_SEED)
    products, seen = [], set()
    for raw in raw_products:
        asin = raw.get("asin") if isinstance(raw, dict) else None
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        try:
            products.append(_product(raw, attributes, rng))
        except (KeyError, TypeError, AttributeError) as e:
            raise WebShopDataError(f"{paths[0]}: product {asin} is not in WebShop's format ({e!r}).") from None

    goals = []
    for p in products:
        for ins in human.get(p.asin) or []:
            try:
                goal = _human_goal(p, ins, rng)
            except (KeyError, TypeError, AttributeError) as e:
                raise WebShopDataError(f"{paths[2]}: an instruction for {p.asin} is not in WebShop's "
                                       f"format ({e!r}).") from None
            if goal is not None:
                goals.append(goal)
    if not goals:
        raise WebShopDataError(f"no goals: none of the products in {paths[0]} has an instruction with "
                               f"attributes in {paths[2]}.")
    random.Random(GOAL_SHUFFLE_SEED).shuffle(goals)
    return Catalog("webshop", products, goals, WEBSHOP_SPLITS)


_CACHE: dict[tuple[Any, ...], Catalog] = {}
_CACHE_LOCK = threading.Lock()


def cached(key: tuple[Any, ...], build: Callable[[], Catalog]) -> Catalog:
    """One catalog (and search index) per process and source: suites built twice (train
    and eval, or several tests) share it."""
    with _CACHE_LOCK:
        if key not in _CACHE:
            _CACHE[key] = build()
        return _CACHE[key]
