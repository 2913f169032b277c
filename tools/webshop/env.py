"""The WebShop text protocol: pages, clickables, ``search[...]`` and ``click[...]``.

Pages and transitions follow the original text env (``web_agent_text_env.py``):

- search page: the instruction and a search bar; only ``search[query]`` works here.
- results page: [Back to Search], [< Prev] (after page 1), [Next >], then ten products
  per page (ASIN, title, price) out of the top 50 hits.
- item page: [Back to Search], [< Prev] (to the results), the option values (clicking
  one selects it for its option), title, price, rating, [Description], [Features],
  [Reviews], [Buy Now].
- sub-pages (description, features, reviews): [Back to Search], [< Prev] (to the item).
- Buy Now ends the episode with the reward of the item and the selected options.

``click[x]`` matches a clickable of the current page case-insensitively. What we render
differently: pages are lines of text with clickables in [brackets] rather than the
original's " [SEP] "-joined strings, selected options are listed, and [Next >] is not
offered past the last result. An action the page does not accept leaves the state as
it was and is answered with ``invalid=True``, a one-line reason and the page again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from typing import Any

from seed_agents.envs import EnvObservation
from seed_agents.tools.webshop.catalog import Catalog, Goal, Product
from seed_agents.tools.webshop.reward import get_reward

RESULTS_PER_PAGE = 10
BACK_TO_SEARCH, NEXT_PAGE, PREV_PAGE, BUY_NOW = "Back to Search", "Next >", "< Prev", "Buy Now"
SUB_PAGES = ("Description", "Features", "Reviews")
SEARCH_ACTION = "search[<query>]"  # shown among the admissible actions on the search page
_ACTION = re.compile(r"\s*(search|click)\s*\[(.*)\]\s*", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class Clickable:
    text: str
    kind: str  # back | next | prev | product | option | sub | buy
    value: str = ""  # the ASIN, the option name, or the sub-page name


@dataclass(frozen=True)
class Page:
    """Where the shopper is. Every transition builds a new Page (``replace``); an invalid
    action keeps the old one."""

    kind: str  # search | results | item | sub | done
    query: str = ""
    results: tuple[Product, ...] = ()
    number: int = 1
    product: Product | None = None
    options: dict[str, str] = field(default_factory=dict)
    sub: str = ""
    reward: float = 0.0

    @property
    def has_search_bar(self) -> bool:
        return self.kind == "search"

    def clickables(self) -> list[Clickable]:
        if self.kind == "results":
            out = [Clickable(BACK_TO_SEARCH, "back")]
            if self.number > 1:
                out.append(Clickable(PREV_PAGE, "prev"))
            if self.number * RESULTS_PER_PAGE < len(self.results):
                out.append(Clickable(NEXT_PAGE, "next"))
            return out + [Clickable(p.asin, "product", p.asin) for p in self.shown]
        if self.kind == "item":
            assert self.product is not None
            opts = [Clickable(v, "option", name) for name, values in self.product.options.items() for v in values]
            subs = [Clickable(s, "sub", s) for s in SUB_PAGES]
            return [Clickable(BACK_TO_SEARCH, "back"), Clickable(PREV_PAGE, "prev"), *opts, *subs,
                    Clickable(BUY_NOW, "buy")]
        if self.kind == "sub":
            return [Clickable(BACK_TO_SEARCH, "back"), Clickable(PREV_PAGE, "prev")]
        return []

    @property
    def shown(self) -> tuple[Product, ...]:
        start = (self.number - 1) * RESULTS_PER_PAGE
        return self.results[start:start + RESULTS_PER_PAGE]

    def render(self, instruction: str) -> str:
        head = f"Instruction: {instruction}"
        if self.kind == "search":
            return f"WebShop\n{head}\n[Search]"
        if self.kind == "done":
            return f"Thank you for shopping with us!\nYour score (min 0.0, max 1.0): {self.reward:.4g}"
        lines = [head, f"[{BACK_TO_SEARCH}]"]
        if self.kind == "results":
            lines.append(f"Page {self.number} (Total results: {len(self.results)})")
            nav = [f"[{c.text}]" for c in self.clickables() if c.kind in ("prev", "next")]
            if nav:
                lines.append(" ".join(nav))
            lines += [f"[{p.asin}]\n{p.title}\n{p.price_tag}" for p in self.shown]
            return "\n".join(lines)
        p = self.product
        assert p is not None
        lines.append(f"[{PREV_PAGE}]")
        if self.kind == "item":
            lines += [f"{name}: " + " ".join(f"[{v}]" for v in values) for name, values in p.options.items()]
            if self.options:
                lines.append("Selected: " + ", ".join(f"{k}: {v}" for k, v in self.options.items()))
            lines += [p.title, f"Price: {p.price_tag}", f"Rating: {p.rating}",
                      " ".join(f"[{s}]" for s in (*SUB_PAGES, BUY_NOW))]
        elif self.sub == "Description":
            lines.append(p.description or "(no description)")
        elif self.sub == "Features":
            lines += [f"- {b}" for b in p.bullet_points] or ["(no features)"]
        else:
            lines.append("(no reviews)")  # the original data ships without reviews
        return "\n".join(lines)


class WebShopEnv:
    """One shopping episode for one goal (``TextEnv``). The per-step reward is 0 until
    Buy Now, then the purchase reward, so an episode's rewards sum to its score."""

    def __init__(self, catalog: Catalog, goal: Goal, *, task_id: str | None = None) -> None:
        self.catalog = catalog
        self.goal = goal
        self.task_id = task_id
        self.page = Page("search")
        self._started = False
        self._info: dict[str, Any] = {}

    def reset(self) -> EnvObservation:
        self.page = Page("search")
        self._started = True
        self._info = {"game_type": self.goal.category, "catalog": self.catalog.source, "page": "search"}
        if self.task_id is not None:
            self._info["task_id"] = self.task_id
        return self._observe()

    def step(self, action: str) -> EnvObservation:
        if not self._started:
            raise RuntimeError("call reset() before step()")
        if self.page.kind == "done":
            raise RuntimeError("the episode is over; make a new env for the next one")
        m = _ACTION.fullmatch(action)
        if m is None:
            return self._invalid("use search[your query] or click[a button on this page]")
        verb, arg = m.group(1).lower(), m.group(2).strip()
        if verb == "search":
            if not self.page.has_search_bar:
                return self._invalid("there is no search bar on this page; click [Back to Search] first")
            if not arg:
                return self._invalid("the search query is empty")
            query = arg.lower()
            return self._go(Page("results", query=query, results=tuple(self.catalog.search(query))))
        clicked = next((c for c in self.page.clickables() if c.text.lower() == arg.lower()), None)
        if clicked is None:
            return self._invalid(f"there is no [{arg}] to click on this page")
        return self._click(clicked)

    def close(self) -> None:
        pass

    # ------------------------------------------------------------ transitions

    def _click(self, c: Clickable) -> EnvObservation:
        page = self.page
        if c.kind == "back":
            return self._go(Page("search"))
        if c.kind in ("next", "prev") and page.kind == "results":
            return self._go(replace(page, number=page.number + (1 if c.kind == "next" else -1)))
        if c.kind == "prev" and page.kind == "item":  # to the results page it came from
            return self._go(replace(page, kind="results", product=None, options={}))
        if c.kind == "prev":  # from a sub-page to its item, options kept
            return self._go(replace(page, kind="item", sub=""))
        if c.kind == "product":
            return self._go(replace(page, kind="item", product=self.catalog.by_asin[c.value], options={}))
        if c.kind == "option":
            return self._go(replace(page, options={**page.options, c.value: c.text}))
        if c.kind == "sub":
            return self._go(replace(page, kind="sub", sub=c.value))
        return self._buy()

    def _buy(self) -> EnvObservation:
        product, options = self.page.product, dict(self.page.options)
        assert product is not None
        reward, parts = get_reward(product, self.goal, product.price, options)
        self.page = Page("done", product=product, options=options, reward=reward)
        self._info.update(page="done", purchased_asin=product.asin, purchased_options=options,
                          goal_asin=self.goal.asin, reward_parts=parts)
        won = reward >= 1.0
        return self._observe(reward=reward, done=True, won=won, lost=not won)

    def _go(self, page: Page) -> EnvObservation:
        self.page = page
        self._info["page"] = page.kind
        return self._observe()

    def _admissible(self) -> list[str]:
        search = [SEARCH_ACTION] if self.page.has_search_bar else []
        clicks = dict.fromkeys(f"click[{c.text}]" for c in self.page.clickables())  # an option value may repeat
        return search + list(clicks)

    def _observe(self, reward: float = 0.0, done: bool = False, won: bool = False,
                 lost: bool = False) -> EnvObservation:
        return EnvObservation(text=self.page.render(self.goal.instruction), admissible_actions=self._admissible(),
                              reward=reward, done=done, won=won, lost=lost, info=dict(self._info))

    def _invalid(self, reason: str) -> EnvObservation:
        text = f"Invalid action: {reason}.\n\n{self.page.render(self.goal.instruction)}"
        return EnvObservation(text=text, admissible_actions=self._admissible(), invalid=True, info=dict(self._info))
