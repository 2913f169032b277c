"""Preregistered runs: a comparison whose settings were committed before it first ran.

Past README figures were chosen and reported on one held-out set: every setting that won was
picked by the same tasks that then measured it. A preregistered comparison fixes its settings
in a file under ``bench/preregistered/`` and commits it before the first run; the benchmark
(``--preregistered FILE``) then refuses to start unless that file is committed and unmodified,
takes every setting from it, and writes into the result file which file and which commit
(``PREREGISTRATION_KEY`` in its config). ``scripts/readme_tables.py`` refuses a README figure
whose preregistration commit is not older than the run.

A file is YAML: ``bench`` (the benchmark it is for), ``settings`` (the benchmark's options by
their flag names without ``--``, every one the command line would otherwise take) and free
text (``why``) the benchmark ignores.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "bench" / "preregistered"
PREREGISTRATION_KEY = "preregistration"
"""The result config's key: ``{"path", "commit", "committed_at"}``."""
RUNTIME_FLAGS = ("--work", "--results-dir", "--note")
"""What a preregistered invocation may still name: where it runs and writes, and what ran beside it."""


class PreregistrationError(Exception):
    """A preregistered run that may not start: one line for the user."""


@dataclass(frozen=True)
class Preregistration:
    path: str
    """The file, relative to the repository root."""
    commit: str
    """The last commit that changed it."""
    committed_at: str
    """That commit's committer time, ISO 8601 with its offset."""
    settings: dict[str, Any]

    def record(self) -> dict[str, str]:
        """What the result file keeps."""
        return {"path": self.path, "commit": self.commit, "committed_at": self.committed_at}

    def argv(self) -> list[str]:
        """The settings as the benchmark's command line (``true`` a bare flag, ``false`` none)."""
        out: list[str] = []
        for key, value in self.settings.items():
            flag = f"--{key.replace('_', '-')}"
            if value is True:
                out.append(flag)
            elif value is not False:
                out += [flag, ",".join(map(str, value)) if isinstance(value, list) else str(value)]
        return out


def _git(root: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
    if done.returncode:
        raise PreregistrationError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}")
    return done.stdout.strip()


def load(path: Path | str, bench: str, root: Path = ROOT) -> Preregistration:
    """The preregistration at ``path`` for benchmark ``bench``, or one clear error: the file must
    lie under ``bench/preregistered/``, be committed, and match its last commit exactly."""
    file = Path(path).resolve()
    try:
        rel = file.relative_to(root.resolve()).as_posix()
    except ValueError:
        raise PreregistrationError(f"{path}: a preregistration lives under bench/preregistered/ in this repository")
    if not rel.startswith("bench/preregistered/") or not file.is_file():
        raise PreregistrationError(f"{path}: not a file under bench/preregistered/")
    if not _git(root, "ls-files", "--", rel):
        raise PreregistrationError(f"{rel} is not committed: commit it before its first run")
    if _git(root, "status", "--porcelain", "--", rel):
        raise PreregistrationError(f"{rel} differs from its last commit: a preregistration runs as committed")
    commit, committed_at = _git(root, "log", "-1", "--format=%H %cI", "--", rel).split(" ")
    doc = yaml.safe_load(file.read_text(encoding="utf-8")) or {}
    if doc.get("bench") != bench:
        raise PreregistrationError(f"{rel} is for {doc.get('bench')!r}, not {bench!r}")
    settings = doc.get("settings")
    if not isinstance(settings, dict) or not settings:
        raise PreregistrationError(f"{rel} has no settings mapping")
    return Preregistration(rel, commit, committed_at, settings)


def split_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--preregistered FILE`` taken out of ``argv``: (FILE or None, the rest). With a file, the
    rest may name only ``RUNTIME_FLAGS``: every other setting is the file's."""
    rest, path, i = [], None, 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--preregistered" or arg.startswith("--preregistered="):
            path = arg.partition("=")[2] if "=" in arg else (argv[i + 1] if i + 1 < len(argv) else "")
            i += 1 if "=" in arg else 2
            continue
        rest.append(arg)
        i += 1
    if path is not None:
        if not path:
            raise PreregistrationError("--preregistered needs a file")
        named = [a.partition("=")[0] for a in rest if a.startswith("--")]
        if other := [a for a in named if a not in RUNTIME_FLAGS]:
            raise PreregistrationError(f"--preregistered takes its settings from the file; the command line may name "
                                       f"only {', '.join(RUNTIME_FLAGS)}, not {', '.join(other)}")
    return path, rest


def older_than(record: dict[str, Any], started_at: str | None) -> bool:
    """Whether the preregistration commit came before the run started (both ISO 8601)."""
    from datetime import datetime

    if not started_at or not record.get("committed_at"):
        return False
    return datetime.fromisoformat(record["committed_at"]) < datetime.fromisoformat(started_at)
