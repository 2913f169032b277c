"""The WebShop text protocol against a running original WebShop server (its Flask app,
``python -m web_agent_site.app``), over HTTP.

The server renders HTML pages; we read clickables from them the way the original text
env does (buttons with class ``btn``, ``a.product-link`` ASINs, radio option values, the
``#search_input`` bar) and build the next URL from the route shapes of ``app.py``:
``/<session>``, ``/search_results/<session>/<keywords>/<page>``,
``/item_page/<session>/<asin>/<keywords>/<page>/<options>``,
``/item_sub_page/.../<sub_page>/<options>`` and ``/done/<session>/<asin>/<options>``.
A session id containing ``fixed_<i>`` makes the server use goal ``i``. The reward is
read from the done page. Observations are the page's visible text, one element a line,
clickables in [brackets].
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field
from html.parser import HTMLParser
from typing import Any
from urllib.parse import quote

import httpx

from seed_agents.envs import EnvObservation
from seed_agents.tools.webshop.env import SEARCH_ACTION

_ACTION = re.compile(r"\s*(search|click)\s*\[(.*)\]\s*", re.IGNORECASE | re.DOTALL)
_VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "wbr"}
_INVISIBLE = {"head", "script", "style", "title"}
_SUB_PAGES = ("description", "features", "reviews", "attributes")


@dataclass
class ParsedPage:
    """What a WebShop HTML page offers: lines of visible text and its clickables."""

    lines: list[str] = field(default_factory=list)
    clickables: list[tuple[str, str, str]] = field(default_factory=list)  # (text, kind, option name)
    has_search_bar: bool = False
    by_id: dict[str, str] = field(default_factory=dict)  # text under elements with these ids

    @property
    def text(self) -> str:
        return "\n".join(self.lines)


class _PageParser(HTMLParser):
    WATCH_IDS = ("instruction-text", "reward", "goal-category")

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.page = ParsedPage()
        self._stack: list[tuple[str, str, bool, str]] = []  # (tag, clickable kind, hidden, watched id)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = {k: v or "" for k, v in attrs}
        if tag == "input":
            if a.get("id") == "search_input":
                self.page.has_search_bar = True
            if a.get("type") == "radio":
                self.page.clickables.append((a.get("value", ""), "option", a.get("name", "")))
            return
        if tag in _VOID:
            return
        classes = a.get("class", "").split()
        kind = "button" if tag == "button" and "btn" in classes else "product" if "product-link" in classes else ""
        kind = kind or ("label" if tag == "label" else "")
        hidden = "hidden" in a or "display:none" in a.get("style", "").replace(" ", "") or tag in _INVISIBLE
        watched = a.get("id", "") if a.get("id") in self.WATCH_IDS else ""
        if self._stack:
            _, parent_kind, parent_hidden, parent_id = self._stack[-1]
            kind, hidden, watched = kind or parent_kind, hidden or parent_hidden, watched or parent_id
        self._stack.append((tag, kind, hidden, watched))

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._stack) - 1, -1, -1):  # tolerate unclosed tags
            if self._stack[i][0] == tag:
                del self._stack[i:]
                return

    def handle_data(self, data: str) -> None:
        text = " ".join(data.split())
        if not text:
            return
        _, kind, hidden, watched = self._stack[-1] if self._stack else ("", "", False, "")
        if watched:
            self.page.by_id[watched] = (self.page.by_id.get(watched, "") + " " + text).strip()
        if hidden:
            return
        if kind in ("button", "product"):
            self.page.clickables.append((text, kind, ""))
        self.page.lines.append(f"[{text}]" if kind else text)


def parse_page(html: str) -> ParsedPage:
    parser = _PageParser()
    parser.feed(html)
    parser.close()
    return parser.page


class WebShopServerEnv:
    """One episode against the server for goal ``goal_index`` (``TextEnv``)."""

    def __init__(self, base_url: str, goal_index: int, *, task_id: str | None = None,
                 game_type: str | None = None, timeout_s: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.goal_index = goal_index
        self.session = f"seed{uuid.uuid4().hex[:12]}fixed_{goal_index}"
        self._client = httpx.Client(timeout=timeout_s)
        self._info: dict[str, Any] = {"catalog": "webshop-server", "goal_index": goal_index}
        if task_id is not None:
            self._info["task_id"] = task_id
        if game_type is not None:
            self._info["game_type"] = game_type
        self._state: dict[str, Any] = {}
        self._page: ParsedPage | None = None
        self._done = False

    def reset(self) -> EnvObservation:
        self._state = {"page": "search", "keywords": [], "number": 1, "asin": None, "options": {}}
        self._done = False
        return self._load(self._url("index"))

    def step(self, action: str) -> EnvObservation:
        if self._page is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; make a new env for the next one")
        m = _ACTION.fullmatch(action)
        if m is None:
            return self._invalid("use search[your query] or click[a button on this page]")
        verb, arg = m.group(1).lower(), m.group(2).strip().lower()
        s = self._state
        if verb == "search":
            if not self._page.has_search_bar:
                return self._invalid("there is no search bar on this page; click [Back to Search] first")
            if not arg:
                return self._invalid("the search query is empty")
            s.update(page="results", keywords=arg.replace("/", " ").split(" "), number=1, asin=None, options={})
            return self._load(self._url("results"))
        match = next((c for c in self._clickables() if c[0].lower() == arg), None)
        if match is None:
            return self._invalid(f"there is no [{m.group(2).strip()}] to click on this page")
        text, kind, option_name = match
        here = s["page"]
        if arg == "back to search":
            s.update(page="search", keywords=[], number=1, asin=None, options={})
            return self._load(self._url("index"))
        if arg in ("next >", "< prev") and here == "results":
            s["number"] += 1 if arg == "next >" else -1
            return self._load(self._url("results"))
        if arg == "< prev" and here == "item":
            s.update(page="results", asin=None, options={})
            return self._load(self._url("results"))
        if arg == "< prev":
            s["page"] = "item"
            return self._load(self._url("item"))
        if kind == "product":
            s.update(page="item", asin=text, options={})
            return self._load(self._url("item"))
        if kind == "option":
            s["options"] = {**s["options"], option_name: text}
            return self._load(self._url("item"))
        if arg in _SUB_PAGES:
            s.update(page="sub", sub=arg.capitalize())
            return self._load(self._url("sub"))
        if arg == "buy now":
            return self._buy()
        return self._invalid(f"[{text}] does nothing here")

    def close(self) -> None:
        self._client.close()

    # ------------------------------------------------------------ HTTP

    def _url(self, route: str) -> str:
        s, q = self._state, (lambda x: quote(str(x), safe=""))
        if route == "index":
            return f"{self.base_url}/{self.session}"
        if route == "results":
            return f"{self.base_url}/search_results/{self.session}/{q(s['keywords'])}/{s['number']}"
        tail = f"{q(s['asin'])}/{q(s['keywords'])}/{s['number']}"
        if route == "item":
            return f"{self.base_url}/item_page/{self.session}/{tail}/{q(s['options'])}"
        if route == "sub":
            return f"{self.base_url}/item_sub_page/{self.session}/{tail}/{s['sub']}/{q(s['options'])}"
        return f"{self.base_url}/done/{self.session}/{q(s['asin'])}/{q(s['options'])}"

    def _get(self, url: str) -> ParsedPage:
        try:
            response = self._client.get(url, follow_redirects=True)
            response.raise_for_status()
        except httpx.HTTPError as e:
            raise RuntimeError(f"the WebShop server at {self.base_url} failed on {url}: {e}") from e
        return parse_page(response.text)

    def _load(self, url: str) -> EnvObservation:
        self._page = self._get(url)
        self._info["page"] = self._state["page"]
        return self._observe()

    def _buy(self) -> EnvObservation:
        page = self._get(self._url("done"))
        try:
            reward = float(page.by_id["reward"].split()[-1])
        except (KeyError, ValueError, IndexError):
            raise RuntimeError(f"the WebShop server's done page has no reward: {page.text[:300]!r}") from None
        self._page, self._done = page, True
        self._state["page"] = "done"
        self._info.update(page="done", purchased_asin=self._state["asin"],
                          purchased_options=dict(self._state["options"]))
        if page.by_id.get("goal-category"):
            self._info["game_type"] = page.by_id["goal-category"].removeprefix("category").strip()
        won = reward >= 1.0
        return self._observe(reward=reward, done=True, won=won, lost=not won)

    # ------------------------------------------------------------ observations

    def _clickables(self) -> list[tuple[str, str, str]]:
        assert self._page is not None
        if self._done:
            return []
        return [c for c in self._page.clickables if not (c[1] == "button" and c[0].lower() == "search")]

    def _admissible(self) -> list[str]:
        assert self._page is not None
        search = [SEARCH_ACTION] if self._page.has_search_bar and not self._done else []
        return search + list(dict.fromkeys(f"click[{c[0]}]" for c in self._clickables()))

    def _observe(self, reward: float = 0.0, done: bool = False, won: bool = False,
                 lost: bool = False) -> EnvObservation:
        assert self._page is not None
        return EnvObservation(text=self._page.text, admissible_actions=self._admissible(), reward=reward,
                              done=done, won=won, lost=lost, info=dict(self._info))

    def _invalid(self, reason: str) -> EnvObservation:
        assert self._page is not None
        return EnvObservation(text=f"Invalid action: {reason}.\n\n{self._page.text}",
                              admissible_actions=self._admissible(), invalid=True, info=dict(self._info))
