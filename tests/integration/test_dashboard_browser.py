"""The report page in a real headless browser (Debian's ``chromium``).

The browser loads the static report (``seed-agents report``) and the gateway's
``/dashboard`` over a loopback socket, and the test reads the DOM the browser built
(``--dump-dom``): the expected rows are there, the success curve has one series per
version, and the HTML/script payload planted in one session (task key, user message, tool
call, reward comment, skill) is text: no element came of it and the page title is intact.
A screenshot is taken too; with ``SEED_AGENTS_DASHBOARD_PNG=docs/dashboard.png`` it is
written there (that is how the README's picture is made).

Without chromium the tests skip, unless ``SEED_AGENTS_REQUIRE_BROWSER=1`` (CI) makes that
a failure. Install: ``apt-get install -y --no-install-recommends chromium``.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from seed_agents.observe.report import build_report, write_report
from seed_agents.observe.testing import populate
from seed_agents.store import TraceStore

pytestmark = pytest.mark.integration

TITLE = "seed-agents: deployed agent report"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found:
        return found
    reason = "chromium is not installed (apt-get install -y --no-install-recommends chromium)"
    if os.environ.get("SEED_AGENTS_REQUIRE_BROWSER") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def browse(url: str, tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """One headless chromium run on ``url`` (its own profile folder; no network needed)."""
    profile = tmp_path / "chromium-profile"
    cmd = [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
           f"--user-data-dir={profile}", "--window-size=1280,1800", *extra, url]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=True)


class Dom(HTMLParser):
    """Elements of the browser's serialized DOM: (tag, attributes), and the title text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[tuple[str, dict[str, str | None]]] = []
        self.title = ""
        self._in_title = False
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append((tag, dict(attrs)))
        self._in_title = tag == "title" and not self.title  # the page's; SVG <title>s are tooltips

    def handle_endtag(self, tag: str) -> None:
        self._in_title = False

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data

    def having(self, tag: str, **attrs: str) -> list[dict[str, str | None]]:
        return [a for t, a in self.elements if t == tag and all(a.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def check_page(dom: Dom, populated, n_sessions: int) -> None:
    assert dom.title == TITLE  # the planted script would have renamed the page
    assert not [t for t, _ in dom.elements if t in ("script", "img", "iframe")]
    assert not [a for _, a in dom.elements if any(k.startswith("on") for k in a)]
    assert len(dom.having("details", **{"class": "session"})) == n_sessions
    assert len([a for a in dom.having("tr") if a.get("class") == "version-row"]) == len(populated.versions)
    assert [a["data-action"] for a in dom.having("tr") if a.get("class") == "decision-row"] == ["reject", "promote", "promote"]
    assert {a["data-version"] for a in dom.having("g", **{"class": "series"})} == {"0", "1"}
    assert len(dom.having("circle")) >= 4
    assert len([a for a in dom.having("tr") if a.get("class") == "queue-row"]) >= 6
    assert [a for a in dom.having("details", **{"class": "session"}) if a.get("data-session") == populated.xss_session]


@pytest.fixture
def populated_store(tmp_path):
    store = TraceStore.open(f"sqlite:///{tmp_path}/traces.db")
    yield store, populate(store)
    store.close()


def test_static_report_renders_in_chromium(populated_store, tmp_path):
    store, populated = populated_store
    page = tmp_path / "report.html"
    write_report(build_report(store, store_label="sqlite:///traces.db", sessions=100), page)
    text = browse(page.as_uri(), tmp_path, "--dump-dom").stdout
    check_page(Dom(text), populated, len(populated.session_ids))
    assert "&lt;script&gt;document.title" in text  # the payload is there, as the text the user typed

    shot = Path(os.environ.get("SEED_AGENTS_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    shot.parent.mkdir(parents=True, exist_ok=True)
    browse(page.as_uri(), tmp_path, f"--screenshot={shot.resolve()}", "--hide-scrollbars")
    head = shot.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", head[16:24])
    assert (width, height) == (1280, 1800)


def test_gateway_dashboard_renders_in_chromium(populated_store, tmp_path, tiny_model_dir):
    from transformers import AutoTokenizer

    from examples.library_service import DemoServer
    from seed_agents.gateway.app import build_app
    from seed_agents.gateway.config import GatewayConfig
    from seed_agents.gateway.testing import FakeVLLM
    from seed_agents.gateway.upstream import Upstream

    store, populated = populated_store
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    fake = FakeVLLM(tokenizer, model="tiny")
    app = build_app(GatewayConfig(upstream="http://fake", model="tiny"), store,
                    Upstream("http://fake", "tiny", transport=fake.transport(), retries=0), tokenizer=tokenizer)
    with DemoServer(app) as server:  # no keys configured: open, as on loopback
        dom = Dom(browse(f"{server.url}/dashboard?sessions=8", tmp_path, "--dump-dom").stdout)
    check_page(dom, populated, 8)
