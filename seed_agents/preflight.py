"""Checks every command makes before it writes anything, and ``--overwrite`` done safely.

A command first validates its whole input: the config (pydantic), the model names (no
network: see ``models.resolve_model``), the server, the env and its task split, and that
``--out`` can be written. Only then does it touch ``--out``: a rejected command leaves the
folder exactly as it was (absent if it was absent). Each failure is a ``UserError`` whose
message names the problem and the fix; the CLI prints it as one line.

``--overwrite`` (``replace_run``) moves the previous run's files into
``<out>.old-<timestamp>/`` and deletes them only when the new run has *finished*; a failure
or Ctrl-C before that deletes the new run's files and moves the old ones back. Only the
files a run writes are moved, never anything else in the folder. A run killed with
SIGKILL in between leaves the old files in that folder, which the start-up line names.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seed_agents.errors import ConfigError

if TYPE_CHECKING:
    from seed_agents.config.core import BackendConfig
    from seed_agents.types import Task


def check_out(out: Path, *, holds_run: bool, overwrite: bool | None, what: str) -> None:
    """Raise ``ConfigError`` unless a run may write into ``out``; writes nothing.

    ``holds_run``: ``out`` already holds a run of this command (``what`` names its
    marker file). ``overwrite=None``: the command has no ``--overwrite``.
    """
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder; choose another --out")
    if holds_run and not overwrite:
        fix = "choose another --out or pass --overwrite" if overwrite is not None else "choose another --out"
        raise ConfigError(f"{out} already holds {what}; {fix}")
    check_writable(out)


def check_writable(out: Path) -> None:
    """``out`` exists and is writable, or could be created: probed with a temporary folder
    in it (or in its nearest existing parent) that is removed at once."""
    parent = out
    while not parent.exists():
        if parent.parent == parent:
            break
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"cannot create --out {out}: {parent} is a file; choose another --out")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".seed-agents-probe-", dir=parent))
    except OSError as e:
        raise ConfigError(f"--out {out} is not writable ({e.strerror or e} in {parent}); choose a folder you can "
                          f"write to") from None


@contextlib.contextmanager
def replace_run(out: Path, files: Iterable[str]) -> Iterator[Path | None]:
    """Give the run a clean ``out``: the ``files`` (names, files or folders) already there
    move to ``<out>.old-<timestamp>/`` (yielded; None when there were none), deleted
    when the block finishes, moved back if it raises (the new ones are removed first).
    Call it after every check, right before the first write."""
    files = list(files)
    names = [n for n in files if (out / n).exists() or (out / n).is_symlink()]
    out.mkdir(parents=True, exist_ok=True)
    if not names:
        yield None
        return
    old = _aside_name(out)
    old.mkdir()
    for n in names:
        os.replace(out / n, old / n)
    print(f"moved the previous run's files to {old}; they are deleted when this run finishes", flush=True)
    try:
        yield old
    except BaseException:
        for n in files:
            _remove(out / n)
        for n in names:
            os.replace(old / n, out / n)
        shutil.rmtree(old, ignore_errors=True)
        raise
    shutil.rmtree(old, ignore_errors=True)


def _aside_name(out: Path) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for k in range(1000):
        path = out.with_name(f"{out.name}.old-{stamp}" + (f"-{k}" if k else ""))
        if not path.exists():
            return path
    raise ConfigError(f"too many {out.name}.old-* folders beside {out}; delete them")


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)


@contextlib.contextmanager
def remove_if_unused(out: Path, keep: Iterable[str] = ("config.json",)) -> Iterator[None]:
    """For commands without ``--overwrite``: if ``out`` did not exist and the block fails
    before anything but ``keep`` was written into it, remove ``out`` again."""
    fresh, keep = not out.exists(), set(keep)
    try:
        yield
    except BaseException:
        if fresh and out.is_dir():
            written = [p for p in out.rglob("*") if p.is_file() and p.relative_to(out).as_posix() not in keep]
            if not written:
                shutil.rmtree(out, ignore_errors=True)
        raise


# -- models and servers ----------------------------------------------------------------------


def check_backend(b: BackendConfig, *, weights: str | None = None, flag: str = "--model",
                  may_start: bool = False) -> None:
    """The backend's model, tokenizer (and, for training, ``weights``) exist here, and a
    vLLM server answers at ``base_url``; with no ``base_url``, a command that starts its own
    server (``may_start``: train, eval) finds vLLM installed, any other says it needs a URL.
    Nothing is loaded: folders are looked at, the alias converted once into the cache if needed."""
    from seed_agents.models import ModelNotAvailable, check_model_folder, resolve_model

    if b.tokenizer:
        check_model_folder(resolve_model(b.tokenizer), "tokenizer")
    if b.kind == "local":
        check_model_folder(resolve_model(b.model))
    elif not b.tokenizer:  # the served name doubles as the tokenizer source
        try:
            check_model_folder(resolve_model(b.model))
        except ModelNotAvailable:
            raise ConfigError(f"{flag} {b.model!r} (the name vLLM serves) is not a local model folder or alias, so "
                              f"the tokenizer cannot be loaded from it; pass --tokenizer with the model's folder") from None
    if weights is not None and not (b.kind == "local" and weights == b.model):  # the trainer's local copy
        check_model_folder(resolve_model(weights))
    if b.kind == "vllm" and b.base_url is None:
        if not may_start:
            raise ConfigError(f"{flag.rsplit('model', 1)[0]}base_url is unset: this command samples from a vLLM server "
                              f"already running; give its URL (start one with `seed-agents serve --model {b.model}`)")
        from seed_agents.serve import check_vllm_installed

        check_vllm_installed()
    elif b.kind == "vllm":
        check_server(b.base_url, b.model)


def check_server(base_url: str, model: str = "MODEL", timeout_s: float = 5.0) -> None:
    """Raise ``BackendUnavailable`` (with the URL and the fix) unless ``GET /health`` gives 200."""
    import httpx

    from seed_agents.backends.base import BackendUnavailable
    from seed_agents.redact import redact

    url = base_url.rstrip("/")
    try:
        r = httpx.get(f"{url}/health", timeout=timeout_s)
    except httpx.HTTPError as e:
        raise BackendUnavailable(f"no vLLM server answers at {url} ({type(e).__name__}: {redact(str(e)) or 'no reply'}); "
                                 f"start one with `seed-agents serve --model {model}` or fix --base-url") from None
    if r.status_code != 200:
        raise BackendUnavailable(f"the server at {url} answers GET /health with HTTP {r.status_code}, not 200; wait "
                                 f"until it has started, or fix --base-url to point at a vLLM server")


# -- tasks ---------------------------------------------------------------------------------


def load_suite(name: str, *, seed: int, options: dict[str, Any]) -> Any:
    """``load_env_suite``, with options the suite does not take reported as one line."""
    from seed_agents.envs import load_env_suite

    try:
        return load_env_suite(name, seed=seed, **options)
    except TypeError as e:
        if "argument" not in str(e):
            raise
        raise ConfigError(f"env {name!r} does not accept env_options {sorted(options)}: {e}; fix env_options") from None


def suite_tasks(suite: Any, env: str, split: str, n: int) -> list[Task]:
    """``suite.tasks(split, n)``, with a suite's ``ValueError``/``LookupError`` (an unknown
    split, fewer tasks than asked for) turned into a one-line ``ConfigError``."""
    try:
        return suite.tasks(split, n)
    except ConfigError:
        raise
    except (ValueError, LookupError) as e:
        raise ConfigError(f"env {env!r} cannot give {n} tasks of split {split!r}: {e}; choose a split it has "
                          f"and at most as many tasks as the split holds") from None
