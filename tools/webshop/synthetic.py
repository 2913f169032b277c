"""A small synthetic WebShop catalog, generated from a seed: the offline default.

Five categories x four product types x six products, each with three attributes drawn
from its type's pool, zero to two option groups and a price; three goals per product ask
for some of its attributes, one value per option group and a budget above its price.
Products of one type share attribute pools, so a search returns several plausible
items and only the right one earns the full reward. Ids and categories say
``synthetic``: these numbers are not WebShop's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from seed_agents.tools.webshop.catalog import (
    Catalog,
    Goal,
    Product,
    budget_for,
    instruction_with_budget,
)

SYNTHETIC_SPLITS = {"test": (0, 100), "eval": (100, 200), "train": (200, None)}
PRODUCTS_PER_TYPE = 6
GOALS_PER_PRODUCT = 3


@dataclass(frozen=True)
class _Type:
    noun: str
    path: str  # product category path below the department
    attributes: tuple[str, ...]
    options: dict[str, tuple[str, ...]]
    price: tuple[float, float]


def _t(noun: str, path: str, attributes: str, options: dict[str, str], price: tuple[float, float]) -> _Type:
    """A product type from comma-separated attribute and option-value lists."""
    split = lambda text: tuple(x.strip() for x in text.split(","))  # noqa: E731
    return _Type(noun, path, split(attributes), {k: split(v) for k, v in options.items()}, price)


_COLORS = "black, white, navy blue, red, green, grey"
_SIZES = "small, medium, large, x-large"

_DEPARTMENTS: dict[str, tuple[str, tuple[_Type, ...]]] = {
    "beauty": ("Beauty & Personal Care", (
        _t("shampoo", "Hair Care › Shampoos",
           "sulfate free, paraben free, for dry hair, natural ingredients, cruelty free, long lasting",
           {"size": "8 fl oz, 16 fl oz, 32 fl oz", "scent": "lavender, coconut, unscented, citrus"}, (6, 30)),
        _t("lipstick", "Makeup › Lips › Lipstick",
           "long lasting, cruelty free, matte finish, moisturizing, vegan, easy to apply",
           {"color": "red, nude, pink, plum, coral"}, (5, 25)),
        _t("face cream", "Skin Care › Face › Moisturizers",
           "anti aging, fragrance free, for sensitive skin, hyaluronic acid, non greasy, spf 30",
           {"size": "1.7 oz, 3.4 oz"}, (12, 60)),
        _t("hair dryer", "Hair Care › Styling Tools › Hair Dryers",
           "ionic, lightweight, fast drying, low noise, foldable handle, with diffuser",
           {"color": "black, white, pink"}, (20, 120)),
    )),
    "electronics": ("Electronics", (
        _t("wireless headphones", "Headphones › Over-Ear Headphones",
           "noise cancelling, bluetooth 5.0, long battery life, built-in microphone, foldable, fast charging",
           {"color": "black, white, navy blue, red"}, (25, 200)),
        _t("usb c charger", "Accessories › Chargers & Adapters",
           "fast charging, compact size, dual port, overheat protection, foldable plug, 65w",
           {"color": "black, white"}, (10, 50)),
        _t("bluetooth speaker", "Portable Audio › Speakers",
           "waterproof, long battery life, high fidelity, portable, loud bass, easy to carry",
           {"color": "black, blue, red, grey"}, (20, 150)),
        _t("mechanical keyboard", "Computers › Keyboards",
           "rgb backlit, hot swappable, wireless, compact 60 percent, blue switches, ergonomic",
           {"switch": "red switch, brown switch, blue switch"}, (30, 160)),
    )),
    "fashion": ("Clothing, Shoes & Jewelry", (
        _t("t-shirt", "Men › Clothing › Shirts › T-Shirts",
           "cotton, machine wash, short sleeve, slim fit, breathable, crew neck",
           {"color": _COLORS, "size": _SIZES}, (8, 35)),
        _t("running shoes", "Women › Shoes › Athletic › Running",
           "non slip, lightweight, breathable mesh, memory foam, arch support, rubber sole",
           {"color": "black, white, pink, grey", "size": "6, 7, 8, 9, 10"}, (30, 120)),
        _t("rain jacket", "Women › Clothing › Coats & Jackets",
           "waterproof, hooded, packable, windproof, zip pockets, machine wash",
           {"color": "navy blue, green, red, black", "size": _SIZES}, (30, 110)),
        _t("maxi dress", "Women › Clothing › Dresses",
           "floral print, long sleeve, high waist, v neck, flowy, with pockets",
           {"color": "beige, green, black, pink", "size": "small, medium, large"}, (20, 70)),
    )),
    "food": ("Grocery & Gourmet Food", (
        _t("coffee beans", "Beverages › Coffee › Whole Bean",
           "dark roast, organic, fair trade, single origin, low acid, medium roast",
           {"size": "12 ounce, 2 pound, 5 pound"}, (9, 60)),
        _t("protein bar", "Snacks › Bars › Protein Bars",
           "gluten free, low sugar, high protein, keto friendly, non gmo, plant based",
           {"flavor": "chocolate, peanut butter, vanilla, berry", "size": "pack of 6, pack of 12"}, (10, 40)),
        _t("green tea", "Beverages › Tea › Green",
           "organic, caffeine free, individually wrapped, loose leaf, antioxidant rich, sugar free",
           {"size": "20 count, 50 count, 100 count"}, (5, 30)),
        _t("olive oil", "Pantry › Oils › Olive",
           "extra virgin, cold pressed, non gmo, first harvest, glass bottle, single origin",
           {"size": "500 ml, 1 liter"}, (10, 45)),
    )),
    "furniture": ("Home & Kitchen", (
        _t("bookshelf", "Furniture › Living Room › Bookcases",
           "solid wood, easy assembly, 5 tier, industrial style, space saving, storage space",
           {"color": "walnut, white, black, oak"}, (40, 250)),
        _t("office chair", "Furniture › Home Office › Desk Chairs",
           "ergonomic, lumbar support, adjustable height, mesh back, swivel, with armrests",
           {"color": "black, grey, white"}, (60, 300)),
        _t("coffee table", "Furniture › Living Room › Tables",
           "solid wood, with storage, mid century, easy assembly, round top, metal legs",
           {"color": "walnut, white, black"}, (50, 280)),
        _t("storage ottoman", "Furniture › Living Room › Ottomans",
           "faux leather, foldable, space saving, with lid, velvet, living room",
           {"color": "grey, navy blue, beige, pink", "size": "small, large"}, (25, 120)),
    )),
}

_BRANDS = ("Aldora", "Brivo", "Calyx", "Dunmore", "Everly", "Fennick", "Glimmer", "Halden", "Iverna",
           "Juniper Lane", "Kestrel", "Lumora", "Marlow", "Norvik", "Orrin", "Pellam", "Quillon", "Rosewell")
_TEMPLATES = (
    "i need {a} {noun}{opts}",
    "i am looking for {art} {noun} that is {a}{opts}",
    "find me {a} {noun}{opts}",
    "i want to buy {art} {noun} which is {a}{opts}",
)


def _product(rng: random.Random, asin: str, category: str, dept: str, t: _Type) -> Product:
    attrs = tuple(rng.sample(t.attributes, 3))
    options = {name: tuple(sorted(rng.sample(values, min(len(values), rng.randint(2, 4))), key=values.index))
               for name, values in t.options.items() if rng.random() < 0.85}
    lo, hi = t.price
    price = round(rng.uniform(lo, hi), 2)
    if rng.random() < 0.2:  # a price range, as some real listings have
        top = round(price * rng.uniform(1.1, 1.5), 2)
        tag, price = f"${price} to ${top}", round(rng.uniform(price, top), 2)
    else:
        tag = f"${price}"
    title = f"{rng.choice(_BRANDS)} {attrs[0].title()} {t.noun.title()}, {attrs[1].title()}"
    return Product(
        asin=asin, title=title, price=price, price_tag=tag, category=category, query=t.noun,
        product_category=f"{dept} › {t.path}", attributes=attrs, options=options,
        description=f"This {t.noun} is {attrs[0]}, {attrs[1]} and {attrs[2]}. A synthetic product for testing.",
        bullet_points=tuple(a.capitalize() for a in attrs),
    )


def _goal(rng: random.Random, p: Product) -> Goal:
    attrs = tuple(rng.sample(p.attributes, rng.randint(1, 2)))
    chosen = {name: rng.choice(values) for name, values in p.options.items()}
    opts = "".join(f"{', and' if i else ' with'} {name} {value}" for i, (name, value) in enumerate(chosen.items()))
    art = "an" if p.query[0] in "aeiou" else "a"
    text = rng.choice(_TEMPLATES).format(a=" and ".join(attrs), noun=p.query, art=art, opts=opts)
    upper = budget_for(p.price, rng)
    return Goal(instruction=instruction_with_budget(text, upper), asin=p.asin, category=p.category, query=p.query,
                name=p.title, product_category=p.product_category, attributes=attrs,
                options=tuple(chosen.values()), price_upper=upper)


def synthetic_catalog(seed: int = 0) -> Catalog:
    """The same catalog for the same seed, on any machine. Goals interleave categories
    (goal ``k`` is from category ``k mod 5``), so a few tasks already cover all five."""
    rng = random.Random(f"webshop-synthetic-{seed}")
    products: list[Product] = []
    by_category: dict[str, list[Product]] = {}
    for category, (dept, types) in _DEPARTMENTS.items():
        for t in types:
            for _ in range(PRODUCTS_PER_TYPE):
                p = _product(rng, f"SYN{len(products):07d}", f"synthetic-{category}", dept, t)
                products.append(p)
                by_category.setdefault(p.category, []).append(p)
    queues = []
    for items in by_category.values():
        goals = [_goal(rng, p) for p in items for _ in range(GOALS_PER_PRODUCT)]
        rng.shuffle(goals)
        queues.append(goals)
    goals = [g for round_ in zip(*queues, strict=True) for g in round_]
    rng.shuffle(products)  # the search must not find products in generation order
    return Catalog("synthetic", products, goals, SYNTHETIC_SPLITS)
