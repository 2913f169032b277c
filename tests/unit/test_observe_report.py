"""The HTML report: what it shows, that user and model text stays text, and the gateway's
``/dashboard`` (admin only, no-script policy). The page rendered in a real browser is in
tests/integration/test_dashboard_browser.py."""

from __future__ import annotations

import re
from html.parser import HTMLParser

import markupsafe
import pytest
from fastapi.testclient import TestClient

from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.upstream import Upstream
from seed_agents.observe.data import outcomes, read_overview, session_details
from seed_agents.observe.report import CSP, build_chart, build_report, render_report
from seed_agents.observe.testing import XSS, populate


class Elements(HTMLParser):
    """Every start tag with its attributes, as a browser's tokenizer sees them."""

    def __init__(self, page: str) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.feed(page)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


@pytest.fixture
def filled(store):
    return populate(store, hours=4, per_hour=3)


@pytest.fixture
def page(store, filled) -> str:
    return build_report(store, store_label="sqlite:///traces.db", sessions=100)


def test_every_payload_stays_text(page, filled):
    tags = Elements(page).tags
    assert not [t for t, _ in tags if t in ("script", "img", "iframe", "object")]
    assert not [a for _, a in tags if any(k.startswith("on") for k in a)]  # no event handler attribute anywhere
    escaped = str(markupsafe.escape(XSS))  # what Jinja2's autoescape writes
    # the payload was in the task key, the user's message, the model's tool call, a reward comment and the skill
    assert page.count(escaped) >= 4
    session = page.split(f'data-session="{filled.xss_session}"')[1].split('<details class="session"')[0]
    assert "&lt;script&gt;" in session and "<script" not in session


def test_the_page_has_a_no_script_policy(page):
    tags = Elements(page).tags
    meta = [a for t, a in tags if t == "meta" and a.get("http-equiv") == "Content-Security-Policy"]
    assert meta and meta[0]["content"] == CSP and "script-src" not in CSP and "default-src 'none'" in CSP


def test_page_shows_versions_decisions_queues_and_sessions(page, store, filled):
    tags = Elements(page).tags
    rows = {k: [a for t, a in tags if k in a] for k in ("data-version", "data-decision", "data-queue", "data-session")}
    assert sorted({int(a["data-version"]) for a in rows["data-version"] if "class" in a and a["class"] == "version-row"}) == [0, 1, 2, 3]
    assert [(a["data-decision"], a["data-action"]) for a in rows["data-decision"]] == [("3", "reject"), ("2", "promote"), ("1", "promote")]
    assert len(rows["data-session"]) == len(filled.session_ids)
    assert {a["data-queue"] for a in rows["data-queue"]} >= {"ready_to_train", "awaiting_reward", "trained"}
    assert 'data-serving="policy"' in page and "policy v1" in page
    # the drill-down: calls with their tool calls, rewards, skills
    assert page.count('class="call"') == 2 * len(filled.session_ids)
    assert "search_books({&#34;title&#34;:" in page
    assert page.count('class="reward-row"') == sum(len(store.rewards(s)) for s in filled.session_ids)
    assert "Borrow by the id the search returned." in page
    assert "flagged: secret" in page and "flagged: fault: env" in page
    assert "[REDACTED]" in page  # what the gateway stored instead of the secret


def test_no_token_ids_and_no_metadata_on_the_page(store):
    from seed_agents.types import LLMCall

    store.create_session("s1", metadata={"client_header": "Authorization: Bearer must-not-show"})
    store.add_call("s1", LLMCall(messages=[{"role": "user", "content": "hi"}], prompt_ids=[424242, 434343],
                                 completion_ids=[454545], logprobs=[-0.25], text="hello"))
    page = build_report(store, store_label="s")
    assert "424242" not in page and "454545" not in page and "must-not-show" not in page
    assert "2 prompt + 1 completion tokens" in page


def test_chart_geometry(store, filled):
    ov = read_overview(store)
    chart = build_chart(ov, window_s=3600)
    outs = outcomes(ov.points)
    assert [s.version for s in chart.series] == [0, 1]
    assert sum(p.window.n for s in chart.series for p in s.points) == len(outs)
    plot_top, plot_bottom = chart.top, chart.height - chart.bottom
    for s in chart.series:
        for p in s.points:  # y is the rate: 100% at the top, 0% at the bottom
            assert p.y == pytest.approx(plot_bottom - p.window.rate * (plot_bottom - plot_top))
            assert chart.left <= p.x <= chart.width - chart.right
        assert [p.x for p in s.points] == sorted(p.x for p in s.points)
    labels = [label for _, label, _ in chart.markers]  # switches inside the plotted span; the reject moved nothing
    assert "promote v1" in labels and set(labels) <= {"promote v0", "promote v1"}


def test_empty_store_renders(store):
    page = render_report(read_overview(store), session_details(store, []), store_label="s")
    assert "No rewarded sessions yet." in page and "No decisions yet." in page and "No sessions yet." in page


def _client(fake, store, tokenizer, **security):
    cfg = GatewayConfig(upstream="http://fake", model="tiny", security=security)
    upstream = Upstream("http://fake", "tiny", transport=fake.transport(), retries=0)
    return TestClient(build_app(cfg, store, upstream, tokenizer=tokenizer))


def test_gateway_dashboard_needs_the_admin_key(fake, store, filled, tokenizer):
    with _client(fake, store, tokenizer, admin_keys=["adm-key-123456"], client_keys=["cli-key-123456"]) as c:
        assert c.get("/dashboard").status_code == 401
        assert c.get("/dashboard", headers={"Authorization": "Bearer cli-key-123456"}).status_code == 403
        r = c.get("/dashboard?sessions=2", headers={"Authorization": "Bearer adm-key-123456"})
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
        assert r.headers["content-security-policy"] == CSP
        assert r.text.count('class="session"') == 2 and "sqlite trace store" in r.text
        assert c.get("/dashboard?sessions=100000", headers={"Authorization": "Bearer adm-key-123456"}).status_code == 400


def test_gateway_dashboard_is_a_503_when_the_store_breaks(fake, store, tokenizer, monkeypatch):
    from seed_agents.store import StoreError

    with _client(fake, store, tokenizer) as c:
        monkeypatch.setattr(store, "model_versions", lambda *a, **k: (_ for _ in ()).throw(StoreError("gone")))
        r = c.get("/dashboard")
        assert r.status_code == 503 and r.json()["error"]["code"] == "store_error"
        assert re.search("gone", r.text) is None
