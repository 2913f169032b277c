"""TextWorld games as the offline default environment suite.

TextWorld generates small text adventures from a seed, so a fixed manifest of
(game type, seed) pairs is a benchmark that runs anywhere without downloads. Games are
built once with ``tw-make`` and cached by task id; building takes seconds, playing a step
takes milliseconds.

What this module smooths over for the agent:
- ``step`` reports the cumulative score; we return per-step differences as the reward.
- Observations carry an ASCII banner, a ``> -= Room =-0/3`` status line and a
  "RESTART, RESTORE ..." footer; we strip them and put the objective first.
- Admissible commands come sorted, which rewards a first-item bias; we shuffle them per
  step with a seeded RNG, so an episode is reproducible.
- A command outside the admissible list never reaches the game: the state stays put and
  the observation says ``invalid=True``.

Thread safety: each game runs in its own copy of jericho's ``libfrotz.so`` (jericho
copies the library before ``dlopen``), so stepping needs no lock. Loading parses the game
logic with a module-global TatSu parser, which is not re-entrant, so ``textworld.start``
and ``reset`` run under ``_LOAD_LOCK``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seed_agents.envs import EnvObservation, EnvSuite
from seed_agents.errors import ConfigError, TwMakeError
from seed_agents.types import Task

if TYPE_CHECKING:
    from seed_agents.skills import Analyzer

SPLITS = ("train", "eval_seen", "eval_unseen")
MAX_TASKS_PER_SPLIT = 100_000
INVALID_ACTION_TEXT = "That is not a valid action. Choose one command from the list."
TW_MAKE_TIMEOUT_S = 300


@dataclass(frozen=True)
class GameType:
    """A family of games: the ``tw-make`` arguments minus ``--seed``/``--output``."""

    name: str
    make_args: tuple[str, ...]


def _custom(world: int, objects: int, quest: int) -> GameType:
    args = ("custom", "--world-size", str(world), "--nb-objects", str(objects), "--quest-length", str(quest))
    return GameType(f"custom-w{world}-o{objects}-q{quest}", args)


def _challenge(kind: str, level: int) -> GameType:
    return GameType(f"{kind}-l{level}", (f"tw-{kind}", "--level", str(level)))


# Seen types appear in train and eval_seen; unseen types only in eval_unseen.
SEEN_TYPES = (*(_challenge("treasure_hunter", lvl) for lvl in (1, 2, 3)), _custom(2, 3, 2))
UNSEEN_TYPES = (_challenge("coin_collector", 2), _custom(2, 3, 3))
_SPLIT_TYPES = {"train": SEEN_TYPES, "eval_seen": SEEN_TYPES, "eval_unseen": UNSEEN_TYPES}
# Disjoint seed ranges, so no train game is ever evaluated.
_SPLIT_SEED_BASE = {"train": 100_000, "eval_seen": 200_000, "eval_unseen": 300_000}


def manifest(split: str, n: int) -> list[Task]:
    """The first ``n`` tasks of ``split``. Types are interleaved, so a small ``n`` still
    covers several of them; task ``k`` gets seed ``base + k``."""

    if split not in _SPLIT_TYPES:
        raise ConfigError(f"unknown TextWorld split {split!r}; valid splits: {', '.join(SPLITS)}; "
                          f"choose one with --split (or split: in the config)")
    if not 0 <= n <= MAX_TASKS_PER_SPLIT:
        raise ConfigError(f"TextWorld split {split!r} has {MAX_TASKS_PER_SPLIT} tasks; asked for {n}; "
                          f"ask for a number in [0, {MAX_TASKS_PER_SPLIT}]")
    types = _SPLIT_TYPES[split]
    tasks = []
    for k in range(n):
        game_type, seed = types[k % len(types)], _SPLIT_SEED_BASE[split] + k
        data = {"game_type": game_type.name, "make_args": list(game_type.make_args), "seed": seed}
        tasks.append(Task(task_id=f"tw-{game_type.name}-s{seed}", split=split, data=data))
    return tasks


# ---------------------------------------------------------------- game generation


def _run_tw_make(make_args: list[str], seed: int, out_dir: Path, home: Path) -> None:
    """Build one game as ``out_dir/game.z8`` (+ ``.json``, ``.ni``). HOME is redirected
    because Inform writes ``~/Inform``."""
    tw_make = Path(sys.executable).parent / "tw-make"
    cmd = [str(tw_make), *make_args, "--seed", str(seed), "--output", str(out_dir / "game.z8"), "-f", "--silent"]
    env = {**os.environ, "HOME": str(home)}
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TW_MAKE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TwMakeError(f"could not run {' '.join(cmd)}: {e}") from e
    if proc.returncode != 0 or not (out_dir / "game.z8").is_file():
        tail = (proc.stderr.strip() or proc.stdout.strip())[-2000:]
        raise TwMakeError(f"{' '.join(cmd)} exited with {proc.returncode}:\n{tail}")


def ensure_game(task: Task, cache_dir: Path) -> Path:
    """Path of the task's ``game.z8``, generated on first use.

    A game appears in the cache only by an atomic directory rename of a finished build,
    so an interrupted build never leaves a half-written game; a per-task ``flock`` keeps
    two processes from building the same game twice.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", task.task_id):
        raise ValueError(f"task id {task.task_id!r} is not a safe file name")
    root = Path(cache_dir).expanduser() / "textworld"
    final = root / "games" / task.task_id
    game = final / "game.z8"
    if game.is_file():
        return game
    for sub in ("games", "locks", "tmp"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    with open(root / "locks" / f"{task.task_id}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if game.is_file():  # built by someone else while we waited
            return game
        work = Path(tempfile.mkdtemp(prefix=f"{task.task_id}.", dir=root / "tmp"))
        try:
            (work / "out").mkdir()
            (work / "home").mkdir()
            _run_tw_make(list(task.data["make_args"]), int(task.data["seed"]), work / "out", work / "home")
            shutil.rmtree(final, ignore_errors=True)  # only a hand-damaged entry can be here
            os.rename(work / "out", final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return game


# ---------------------------------------------------------------- the environment

_LOAD_LOCK = threading.Lock()
_BANNER_LINE = re.compile(r"^[ \t_|\\/$<>]+$", re.M)  # the ASCII-art "TextWorld" logo
_STATUS_LINE = re.compile(r"\n?>[ \t]*(?:-= [^\n]*=-[ \t]*-?\d+/\d+)?[ \t]*\Z")
_FOOTER = "Would you like to RESTART, RESTORE a saved game, QUIT or UNDO the last command?"


def clean_feedback(text: str) -> str:
    """Drop the banner, status line, prompt and end-of-game footer; squeeze blank lines."""
    text = _BANNER_LINE.sub("", text).replace(_FOOTER, "")
    text = _STATUS_LINE.sub("", text.rstrip())
    return re.sub(r"\n[ \t]*(?:\n[ \t]*)+", "\n\n", text).strip()


class TextWorldEnv:
    """One episode of one TextWorld game (``TextEnv``)."""

    def __init__(self, game_path: str | Path, seed: int = 0, task_id: str | None = None,
                 game_type: str | None = None) -> None:
        self.game_path = Path(game_path)
        self.game_type = game_type
        self.seed = seed
        self.task_id = task_id
        self._env: Any = None
        self._score = 0
        self._steps = 0
        self._done = False
        self._admissible: list[str] = []
        self._info: dict[str, Any] = {}

    @property
    def walkthrough(self) -> list[str]:
        """A winning command sequence from the game's metadata (for tests and demos)."""
        meta = json.loads(self.game_path.with_suffix(".json").read_text())["metadata"]
        return list(meta["walkthrough"])

    def reset(self) -> EnvObservation:
        import textworld  # optional dependency: the manifest works without it

        self.close()
        infos = textworld.EnvInfos(
            admissible_commands=True, won=True, lost=True, score=True, max_score=True, objective=True, moves=True
        )
        with _LOAD_LOCK:
            self._env = textworld.start(str(self.game_path), request_infos=infos)
            state = self._env.reset()
        self._score, self._steps, self._done = int(state["score"] or 0), 0, False
        text = clean_feedback(state.feedback)
        objective = (state["objective"] or "").strip()
        if objective and objective in text:  # move it to the front
            text = text.replace(objective, "").strip()
        text = f"{objective}\n\n{text}".strip()
        return self._observe(state, text, reward=0.0)

    def step(self, action: str) -> EnvObservation:
        if self._env is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; make a new env for the next one")
        by_key = {c.strip().lower(): c for c in self._admissible}
        command = by_key.get(action.strip().lower())
        if command is None:
            return EnvObservation(
                text=INVALID_ACTION_TEXT, admissible_actions=list(self._admissible), invalid=True, info=dict(self._info)
            )
        state, _, _ = self._env.step(command)
        self._steps += 1
        score = int(state["score"] or 0)
        reward, self._score = float(score - self._score), score
        return self._observe(state, clean_feedback(state.feedback), reward)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None

    def _observe(self, state: Any, text: str, reward: float) -> EnvObservation:
        won, lost = bool(state["won"]), bool(state["lost"])
        self._done = won or lost or bool(state.get("done"))
        # Seeded by (episode seed, step): reproducible, and independent of other episodes.
        rng = random.Random(f"{self.seed}:{self._steps}")
        self._admissible = list(state["admissible_commands"] or [])
        rng.shuffle(self._admissible)
        self._info = {"score": self._score, "max_score": state["max_score"], "moves": state["moves"]}
        if self.task_id is not None:
            self._info["task_id"] = self.task_id
        if self.game_type is not None:
            self._info["game_type"] = self.game_type
        return EnvObservation(
            text=text,
            admissible_actions=list(self._admissible),
            reward=reward,
            done=self._done,
            won=won,
            lost=lost,
            info=dict(self._info),
        )


# ---------------------------------------------------------------- the suite


def default_cache_dir() -> Path:
    from seed_agents.models import (
        cache_dir,  # $SEED_AGENTS_CACHE, resolved in one place
    )

    return cache_dir()


class TextWorldSuite(EnvSuite):
    """The ``textworld`` env suite: manifest, cached games, and the env-agent graph.

    ``options`` are defaults for ``build_graph`` (e.g. ``max_steps``); options given to
    ``build_graph`` itself win.
    """

    name = "textworld"

    def __init__(self, cache_dir: str | Path | None = None, seed: int = 0, **options: Any) -> None:
        self.cache_dir = Path(cache_dir).expanduser() if cache_dir is not None else default_cache_dir()
        self.seed = seed
        self.options = options

    def tasks(self, split: str, n: int) -> list[Task]:
        return manifest(split, n)

    def prepare(self, tasks: list[Task]) -> None:
        """Build every game now, so the first episodes don't wait on ``tw-make``."""
        for task in tasks:
            ensure_game(task, self.cache_dir)

    def make_env(self, task: Task, seed: int | None = None) -> TextWorldEnv:
        """A fresh env for one episode. Without ``seed``, the command shuffle is seeded
        from (suite seed, task id), so every episode of a task sees the same orders."""
        if seed is None:
            digest = hashlib.sha256(f"{self.seed}:{task.task_id}".encode()).digest()
            seed = int.from_bytes(digest[:4], "big")
        return TextWorldEnv(ensure_game(task, self.cache_dir), seed=seed, task_id=task.task_id,
                            game_type=task.data.get("game_type"))

    def build_graph(self, llm: Any, **options: Any) -> Any:
        from seed_agents.graphs.env_agent import build_env_agent

        return build_env_agent(llm, **{**self.options, **options})

    def offline_analyzer(self) -> Analyzer:
        """Rule-based skills from the episode's structured turns (``tools.textworld_analyzer``)."""
        from seed_agents.tools.textworld_analyzer import TextWorldAnalyzer

        return TextWorldAnalyzer()
