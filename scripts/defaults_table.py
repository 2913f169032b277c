"""The table of `seed-agents train`'s evidence-backed defaults in docs/training.md, generated
from the config models.

A default chosen by a learning run says so next to its field (``seed_agents.config.evidence``:
why, in one sentence, and the result's anchor in docs/results.md); this script prints those as
a table between ``<!-- defaults:train -->`` and ``<!-- /defaults:train -->``, with the
value ``--preset paper`` gives beside each, so the page cannot drift from the models.

    .venv/bin/python scripts/defaults_table.py           # rewrite the table in docs/training.md
    .venv/bin/python scripts/defaults_table.py --check   # exit 1 if the page differs from the models
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: scripts/ is on the path, the repo root is not

from seed_agents.config import PAPER_PRESET, TrainConfig  # noqa: E402
from seed_agents.config.evidence import reasons  # noqa: E402

PAGE = Path("docs") / "training.md"
MARKER = re.compile(r"(<!-- defaults:train -->\n)(?P<body>.*?)(<!-- /defaults:train -->)", re.S)
CODE = re.compile(r"```.*?```", re.S)


class TableError(Exception):
    """A marker missing, or a result the table links to that docs/results.md lacks."""


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(page: Path) -> dict[str, str]:
    """Each heading of ``page`` by its anchor."""
    text = CODE.sub("", page.read_text(encoding="utf-8"))
    return {anchor(m.group(1)): m.group(1).strip() for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def shown(value: Any) -> str:
    """A value as a YAML config writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def preset_value(path: str) -> str:
    """What ``--preset paper`` sets at ``path``; "-" where it sets nothing."""
    value: Any = PAPER_PRESET
    for name in path.split("."):
        if not isinstance(value, dict) or name not in value:
            return "-"
        value = value[name]
    return f"`{shown(value)}`"


def table(root: Path) -> list[str]:
    """The markdown rows: one per evidence-backed default of ``TrainConfig``."""
    docs = root / "docs"
    rows = ["| setting | default | `--preset paper` | why | result |", "|---|---|---|---|---|"]
    for reason in reasons(TrainConfig):
        page, _, section = reason.evidence.partition("#")
        titles = headings(docs / page)
        if section not in titles:
            raise TableError(f"{reason.path}: {reason.evidence} names no heading of docs/{page}")
        why = reason.why.replace("|", "\\|")
        rows.append(f"| `{reason.path}` | `{shown(reason.default)}` | {preset_value(reason.path)} | {why} | "
                    f"[{titles[section]}]({reason.evidence}) |")
    return rows


def render(text: str, root: Path) -> str:
    """``text`` (docs/training.md) with the table between its markers regenerated."""
    if not MARKER.search(text):
        raise TableError(f"{PAGE} has no <!-- defaults:train --> ... <!-- /defaults:train --> markers")
    body = "\n".join(table(root))
    return MARKER.sub(lambda m: m.group(1) + body + "\n" + m.group(3), text)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="Change nothing; exit 1 if the page differs from the models.")
    ap.add_argument("--root", type=Path, default=ROOT, help="Checkout whose docs/training.md holds the table.")
    args = ap.parse_args(argv)
    path = args.root / PAGE
    try:
        current = path.read_text(encoding="utf-8")
        new = render(current, args.root)
    except (TableError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        if new != current:
            sys.stdout.writelines(difflib.unified_diff(current.splitlines(True), new.splitlines(True), str(PAGE),
                                                       f"{PAGE} (from the config models)"))
            print(f"the defaults table in {PAGE} differs from the config models; run {Path(__file__).name}",
                  file=sys.stderr)
            return 1
        print(f"{PAGE} matches the config models")
        return 0
    if new != current:
        path.write_text(new, encoding="utf-8")
    print(f"{'rewrote' if new != current else 'unchanged'}: {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
