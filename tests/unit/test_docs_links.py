"""Links between the README and the docs pages resolve: the file exists and, where the link
names a section, the page has a heading with that anchor.

Headings here get renamed as results come in ("two seeds (not decided yet)" -> "three
seeds ..."), and a renamed heading silently breaks every link to its old anchor; nothing
else in the suite would notice."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```", re.S)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = CODE.sub("", page.read_text())
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def test_anchor_follows_githubs_rule() -> None:
    assert anchor("Training inside the band: T 0.5, three seeds (a gain, below the goal)") == \
        "training-inside-the-band-t-05-three-seeds-a-gain-below-the-goal"
    assert anchor("Wrap your agent: does it improve?") == "wrap-your-agent-does-it-improve"


def test_every_link_between_pages_resolves() -> None:
    broken = []
    for page in PAGES:
        for target in LINK.findall(CODE.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
                continue
            path, _, section = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif section and dest.suffix == ".md" and section not in anchors(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)
