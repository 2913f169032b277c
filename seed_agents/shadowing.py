"""A folder or module named like a dependency, found where the dependency should be: one line.

``import vllm``, ``importlib.util.find_spec("vllm")`` and every library probe built on it ask
the import system, which walks ``sys.path`` in order: the working directory (``python -m``,
``python -c``, ``PYTHONPATH=.``), then ``PYTHONPATH``, then the interpreter's own folders.
What it finds there stands in for the real package in three ways:

- a module (``vllm.py``) or a regular package (a folder with ``__init__.py``) is imported
  instead of an installed package found later on the path;
- a folder without ``__init__.py``, when no regular package of that name exists on the path,
  becomes a namespace package. A regular package anywhere on the path wins over it, so a
  folder named ``torch`` next to an installed torch is harmless; but an editable install
  reached through a meta-path finder loses to it, and a dependency that is not installed here
  (vLLM lives in its own venv) is found as that folder. TRL's ``is_vllm_available`` then sees
  a spec, reads no version ("N/A") and ``import trl.trainer.grpo_trainer`` dies in
  ``packaging.version``: what a ``serve --work-dir ./vllm`` folder did to ``continual``;
- a dependency that is itself a namespace package (langgraph) merges every folder of its name
  on the path: a module in an earlier folder shadows the installed submodule of that name.
  A folder that holds none of the installed submodules' names only adds to the namespace.

A module or package counts as the dependency when a distribution of that name claims it: it
sits in the folder holding the distribution's metadata (site-packages, a checkout with its
``.egg-info``) or under the folder an editable install points to. Anything else is reported.
The CLI checks before any command imports one of them (``seed_agents.app.cli.main``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.metadata
import importlib.util
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from seed_agents.errors import UserError

DEPENDENCIES: Mapping[str, str] = {
    "torch": "torch", "transformers": "transformers", "trl": "trl", "vllm": "vllm", "langgraph": "langgraph",
    "langchain_core": "langchain-core", "langchain": "langchain", "peft": "peft", "accelerate": "accelerate",
    "datasets": "datasets",
}
"""Import name -> distribution name of what the CLI imports, or the libraries it imports probe
for: the names this module checks."""


class ShadowedDependency(UserError, ImportError):
    """A folder or module on the import path would be imported as a dependency it is not."""


@dataclass(frozen=True)
class Shadow:
    """``path`` would be imported as ``name`` (a dependency, or a submodule of one) and is not it."""

    name: str
    path: Path
    installed: Path | None
    """Where the real distribution is installed, or None where it is not."""

    def message(self, cwd: Path | None = None, pythonpath: Sequence[str] | None = None) -> str:
        """One line: the file or folder, what it does, and the fix."""
        cwd = Path.cwd().resolve() if cwd is None else cwd
        where = _where(self.path, cwd, pythonpath)
        if self.installed is not None:
            effect = f"shadows the installed {self.name} package ({self.installed})"
        else:
            effect = (f"would be imported as {self.name}, which is not installed here: libraries that probe for "
                      f"{self.name} take it for the package")
        fix = "rename or move it" + (", or run from another folder" if self.path.parent == cwd else "")
        return f"{_shown(self.path, cwd)} ({where}) {effect}; {fix}"


def _shown(path: Path, cwd: Path) -> str:
    return f"./{path.relative_to(cwd)}" if path.is_relative_to(cwd) else str(path)


def _where(path: Path, cwd: Path, pythonpath: Sequence[str] | None) -> str:
    what = "a folder" if path.is_dir() else "a file"
    if path.parent == cwd:
        return f"{what} in the working directory"
    entries = os.environ.get("PYTHONPATH", "").split(os.pathsep) if pythonpath is None else pythonpath
    if any(entry and _resolved(entry) == path.parent for entry in entries):
        return f"{what} on PYTHONPATH"
    return f"{what} on the import path"


def _resolved(entry: str) -> Path:
    return Path(entry or ".").resolve()


def find_shadows(path: Sequence[str] | None = None, names: Mapping[str, str] = DEPENDENCIES) -> list[Shadow]:
    """Each of ``names`` that the import system would find as something other than its installed
    distribution; imports nothing.

    ``path=None`` asks the interpreter's whole import system (``sys.meta_path`` over
    ``sys.path``): exactly what ``import`` would find. A list asks only the path-based finder
    over those entries, and reads distribution metadata from them.
    """
    shadows = []
    for name, dist_name in names.items():
        spec = _spec(name, path)
        if spec is None:
            continue
        claims = list(_claims(dist_name, path))
        installed = claims[0][0] if claims else None
        if spec.has_location:
            found = Path(str(spec.origin)).resolve()
            found = found.parent if spec.submodule_search_locations is not None else found  # a package is its folder
            if not _claimed(found, claims):
                shadows.append(Shadow(name, found, installed))
        elif spec.origin is None and spec.submodule_search_locations:  # a namespace package
            portions = [Path(p).resolve() for p in spec.submodule_search_locations]
            theirs = [p for p in portions if _claimed(p, claims)]
            if not theirs:
                shadows.append(Shadow(name, portions[0], installed))
                continue
            first: dict[str, Path] = {}  # submodule -> the folder it is imported from
            for portion in portions:
                for sub in _submodules(portion):
                    first.setdefault(sub, portion)
            shadows += [Shadow(f"{name}.{sub}", first[sub], installed)
                        for sub in sorted(set().union(*map(_submodules, theirs))) if first[sub] not in theirs]
        # else built-in or frozen: nothing on the path
    return shadows


def _spec(name: str, path: Sequence[str] | None) -> importlib.machinery.ModuleSpec | None:
    try:
        if path is None:
            return importlib.util.find_spec(name)
        return importlib.machinery.PathFinder.find_spec(name, list(path))
    except (ImportError, ValueError):  # a module in sys.modules without a spec: not ours to judge
        return None


def _claims(dist_name: str, path: Sequence[str] | None) -> Iterable[tuple[Path, bool]]:
    """(folder, editable) for each installed distribution ``dist_name``: the folder holding its
    metadata, and for an editable install the source folder it points to."""
    found = (importlib.metadata.distributions(name=dist_name) if path is None
             else importlib.metadata.distributions(name=dist_name, path=list(path)))
    for dist in found:
        yield Path(str(dist.locate_file(""))).resolve(), False
        try:
            direct = json.loads(dist.read_text("direct_url.json") or "{}")
        except (OSError, ValueError):
            continue
        url = urlparse(str(direct.get("url", "")))
        if isinstance(direct.get("dir_info"), dict) and direct["dir_info"].get("editable") and url.scheme == "file":
            yield Path(unquote(url.path)).resolve(), True


def _claimed(found: Path, claims: Iterable[tuple[Path, bool]]) -> bool:
    return any(found.is_relative_to(root) if editable else found.parent == root for root, editable in claims)


def _submodules(folder: Path) -> set[str]:
    """What ``folder`` offers as submodules that win over another folder's: modules and regular
    packages (a plain subfolder is a namespace portion, which loses to either)."""
    suffixes = tuple(importlib.machinery.all_suffixes())
    try:
        entries = list(folder.iterdir())
    except OSError:
        return set()
    return {entry.name.partition(".")[0] for entry in entries
            if (entry.is_file() and entry.name.endswith(suffixes)) or (entry / "__init__.py").is_file()}


def check_shadowing(path: Sequence[str] | None = None) -> None:
    """Raise ``ShadowedDependency`` naming the first shadowed dependency, if any."""
    shadows = find_shadows(path)
    if shadows:
        raise ShadowedDependency(shadows[0].message())


def shadowing_name(folder: str | os.PathLike[str], path: Sequence[str] | None = None) -> str | None:
    """The dependency a folder would stand for if commands imported from where it is: its name
    when that is one of ``DEPENDENCIES`` and it sits in the working directory or in a folder on
    ``PYTHONPATH`` (or on ``path`` when given); else None. For folders we are about to create."""
    folder = Path(folder).resolve()
    if folder.name not in DEPENDENCIES:
        return None
    entries = [os.getcwd(), *os.environ.get("PYTHONPATH", "").split(os.pathsep)] if path is None else path
    return folder.name if any(entry and _resolved(entry) == folder.parent for entry in entries) else None
