"""ALFWorld (text): household tasks played through the real ALFWorld/TextWorld engine.

An ALFWorld game is a PDDL problem (``game.tw-pddl``: domain, grammar, problem) played by
TextWorld's ``PddlEnv`` behind ALFWorld's ``AlfredDemangler`` (readable names such as
"mug 1") and ``AlfredInfos`` wrappers: the env that ``AlfredTWEnv`` builds, here one game
per episode instead of a batched gym env. Games come from ``alfworld-download``:
``$ALFWORLD_DATA/json_2.1.1/{train,valid_seen,valid_unseen}/<task>/<trial>/``. Like
``AlfredTWEnv``, we keep the games whose ``game.tw-pddl`` is marked solvable and skip
movable-receptacle and sliced tasks.

The paper's protocol is the default: the admissible actions in every prompt, a history
window of 5, at most 30 steps (``AlfWorldSuite.agent_defaults``), reward 10 on a win and
-0.1 per invalid action. An invalid action (not admissible) never reaches the game: the
state stays put and the observation says ``invalid=True``. "help" is left out of the
admissible actions: it only prints the command list, which the prompt already shows.
Actions keep ALFWorld's (sorted) order, as in the paper's prompt.

Manifest: task ids come from the trial folder relative to the split folder, so they are
the same on every machine. Order: round-robin over the task types (pick, look, clean,
heat, cool, pick2), each type's games sorted and then shuffled with a fixed per-(split,
type) seed, so the first ``n`` tasks cover every type and several scenes, and
``tasks(split, n)`` is a prefix of ``tasks(split, n + 1)``.

Thread safety: TextWorld's PDDL engine parses grammar text with module-global TatSu
parsers on every load *and every step*, and fast-downward's translator rewrites module
options, ``sys.argv`` and ``sys.stdout`` while loading. So every call into a game holds
``_GAME_LOCK`` (the engine is pure Python, so under the GIL this costs little
throughput). Each engine owns a copy of fast-downward's ``libdownward.so`` that is never
unloaded; engines are therefore pooled and reused across episodes (as ``AlfredTWEnv``
reuses its batch slots) instead of leaking one library copy per episode.
"""

from __future__ import annotations

import importlib.util
import json
import os
import random
import re
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from seed_agents.envs import EnvObservation, EnvSuite
from seed_agents.errors import ConfigError
from seed_agents.types import Task

if TYPE_CHECKING:
    from seed_agents.skills import Analyzer

SPLITS = ("train", "valid_seen", "valid_unseen")
DATA_SUBDIR = "json_2.1.1"
GAME_FILE = "game.tw-pddl"
# ALFWorld's task types (traj_data.json "task_type") -> the short names we report.
TASK_TYPES = {
    "pick_and_place_simple": "pick",
    "look_at_obj_in_light": "look",
    "pick_clean_then_place_in_recep": "clean",
    "pick_heat_then_place_in_recep": "heat",
    "pick_cool_then_place_in_recep": "cool",
    "pick_two_obj_and_place": "pick2",
}
TYPE_ORDER = tuple(TASK_TYPES.values())
WIN_REWARD = 10.0
INVALID_PENALTY = 0.1
INVALID_ACTION_TEXT = "Nothing happens. That is not an admissible action: choose one from the list."
TASK_ANCHOR = "Your task is to:"
_HIDDEN_ACTIONS = frozenset({"help"})
_BANNER = "-= Welcome to TextWorld, ALFRED! =-"


# ---------------------------------------------------------------- data and manifest


class AlfWorldDataError(FileNotFoundError):
    """ALFWorld (the package or its games) is missing; the message says how to get it."""


def data_error(problem: str) -> AlfWorldDataError:
    return AlfWorldDataError(
        f"{problem}\n"
        "Get the ALFWorld games with:\n"
        "    pip install alfworld==0.4.2     # or: pip install 'seed-agents[alfworld]'\n"
        "    alfworld-download               # into ~/.cache/alfworld; --data-dir DIR for another folder\n"
        "then point ALFWORLD_DATA (or env_options.data_dir in the config) at that folder; it must "
        f"hold {DATA_SUBDIR}/{{{','.join(SPLITS)}}}/<task>/<trial>/{GAME_FILE}."
    )


def resolve_data_dir(data_dir: str | Path | None = None) -> Path:
    """``data_dir``, else ``$ALFWORLD_DATA``, else ``~/.cache/alfworld`` (alfworld's default)."""
    return Path(data_dir or os.environ.get("ALFWORLD_DATA") or Path.home() / ".cache" / "alfworld").expanduser()


@dataclass(frozen=True, order=True)
class Game:
    """One playable game: its trial folder relative to the split folder, and its type."""

    path: str
    game_type: str


def scan_split(split_dir: Path) -> list[Game]:
    """The playable games under ``split_dir``, sorted by path; the same filter as
    ``AlfredTWEnv.collect_game_files``. Raises ``AlfWorldDataError`` when there are none."""
    games, trials, missing = [], 0, 0
    for traj_file in sorted(split_dir.rglob("traj_data.json")):
        trials += 1
        trial = traj_file.parent
        rel = trial.relative_to(split_dir).as_posix()
        if "movable" in rel or "Sliced" in rel:
            continue
        game_type = TASK_TYPES.get(json.loads(traj_file.read_text()).get("task_type", ""))
        if game_type is None:
            continue
        game_file = trial / GAME_FILE
        if not game_file.is_file():
            missing += 1
            continue
        if json.loads(game_file.read_text()).get("solvable"):
            games.append(Game(rel, game_type))
    if not games:
        if not trials:
            raise data_error(f"no ALFWorld tasks (traj_data.json) under {split_dir}.")
        if missing:
            raise data_error(f"{missing} ALFWorld tasks under {split_dir} have no {GAME_FILE} (the game files).")
        raise data_error(f"none of the {trials} ALFWorld tasks under {split_dir} is a solvable game of a known type.")
    return games


def task_id(split: str, path: str) -> str:
    """A stable id that is also a safe file name: ``alfworld-<split>-<task>-<trial>``."""
    return "alfworld-" + re.sub(r"[^A-Za-z0-9_.-]", "_", f"{split}-{path.replace('/', '-')}")


def order_games(games: list[Game], split: str) -> list[Game]:
    """Round-robin over ``TYPE_ORDER``; within a type, a seeded shuffle of the sorted games."""
    queues = []
    for game_type in TYPE_ORDER:
        of_type = sorted(g for g in games if g.game_type == game_type)
        random.Random(f"alfworld:{split}:{game_type}").shuffle(of_type)
        queues.append(of_type)
    ordered = []
    for k in range(max(map(len, queues), default=0)):
        ordered += [q[k] for q in queues if k < len(q)]
    return ordered


def manifest(games: list[Game], split: str, n: int) -> list[Task]:
    """The first ``n`` tasks of ``split`` (see the module docstring for the order)."""
    ordered = order_games(games, split)
    if not 0 <= n <= len(ordered):

        raise ConfigError(f"split {split!r} has {len(ordered)} ALFWorld games; asked for {n}; "
                          f"ask for a number in [0, {len(ordered)}]")
    ids = [task_id(split, g.path) for g in ordered]
    if len(set(ids)) != len(ids):
        raise ValueError(f"two games of split {split!r} map to the same task id")
    return [Task(task_id=i, split=split, data={"path": g.path, "game_type": g.game_type})
            for i, g in zip(ids[:n], ordered[:n])]


# ---------------------------------------------------------------- the environment

_GAME_LOCK = threading.Lock()
_IDLE_ENGINES: list[Any] = []  # loaded engines free for the next episode; guarded by _GAME_LOCK


@contextmanager
def _game_calls() -> Iterator[None]:
    """Hold the game lock and undo fast-downward's overwrite of ``sys.argv``."""
    with _GAME_LOCK:
        argv = sys.argv
        try:
            yield
        finally:
            sys.argv = argv


def _load_engine(game_file: Path) -> Any:
    """An idle engine (or a new one) with ``game_file`` loaded; call under ``_game_calls``."""
    if _IDLE_ENGINES:
        engine = _IDLE_ENGINES.pop()
        engine.load(str(game_file))
        return engine
    import textworld
    from alfworld.agents.environment.alfred_tw_env import AlfredDemangler, AlfredInfos

    infos = textworld.EnvInfos(won=True, admissible_commands=True, moves=True, extras=["gamefile"])
    return textworld.start(str(game_file), request_infos=infos, wrappers=[AlfredDemangler, AlfredInfos])


def shaped_reward(*, won: bool, invalid: bool, win_reward: float = WIN_REWARD,
                  invalid_penalty: float = INVALID_PENALTY) -> float:
    """One step's reward: ``win_reward`` on the winning step, ``-invalid_penalty`` for an
    action the game did not accept, 0 otherwise."""
    if invalid:
        return -invalid_penalty
    return win_reward if won else 0.0


def split_intro(feedback: str) -> tuple[str, str]:
    """(observation text without the welcome banner, the "Your task is to: ..." line)."""
    text = feedback.replace(_BANNER, "").strip()
    objective = next((ln.strip() for ln in text.splitlines() if ln.strip().startswith(TASK_ANCHOR)), "")
    return text, objective


class AlfWorldEnv:
    """One episode of one ALFWorld game (``TextEnv``)."""

    def __init__(self, game_file: str | Path, *, task_id: str | None = None, game_type: str | None = None,
                 win_reward: float = WIN_REWARD, invalid_penalty: float = INVALID_PENALTY) -> None:
        self.game_file = Path(game_file)
        self.task_id = task_id
        self.game_type = game_type
        self.win_reward = win_reward
        self.invalid_penalty = invalid_penalty
        self._engine: Any = None
        self._done = False
        self._admissible: list[str] = []
        self._info: dict[str, Any] = {}

    @property
    def walkthrough(self) -> list[str]:
        """The winning command sequence stored in the game file (for tests and demos)."""
        return list(json.loads(self.game_file.read_text()).get("walkthrough") or [])

    def reset(self) -> EnvObservation:
        self.close()
        with _game_calls():
            self._engine = _load_engine(self.game_file)
            state = self._engine.reset()
        self._done = False
        text, objective = split_intro(state.feedback)
        self._info = {"objective": objective}
        if self.task_id is not None:
            self._info["task_id"] = self.task_id
        if self.game_type is not None:
            self._info["game_type"] = self.game_type
        return self._observe(state, text, reward=0.0)

    def step(self, action: str) -> EnvObservation:
        if self._engine is None:
            raise RuntimeError("call reset() before step()")
        if self._done:
            raise RuntimeError("the episode is over; make a new env for the next one")
        by_key = {" ".join(c.lower().split()): c for c in self._admissible}
        command = by_key.get(" ".join(action.lower().split()))
        if command is None:
            return EnvObservation(
                text=INVALID_ACTION_TEXT, admissible_actions=list(self._admissible), invalid=True,
                reward=shaped_reward(won=False, invalid=True, invalid_penalty=self.invalid_penalty),
                info=dict(self._info),
            )
        with _game_calls():
            if self._engine is None:  # closed by another thread while we waited
                raise RuntimeError("the env was closed")
            state, _, _ = self._engine.step(command)
        won = bool(state["won"])
        reward = shaped_reward(won=won, invalid=False, win_reward=self.win_reward)
        return self._observe(state, state.feedback.strip(), reward)

    def close(self) -> None:
        """Hand the engine back to the pool (it is reused, never unloaded)."""
        with _GAME_LOCK:
            engine, self._engine = self._engine, None
            if engine is not None:
                _IDLE_ENGINES.append(engine)

    def _observe(self, state: Any, text: str, reward: float) -> EnvObservation:
        won = bool(state["won"])
        self._done = won or bool(state.get("done"))
        self._admissible = [c for c in state["admissible_commands"] or [] if c not in _HIDDEN_ACTIONS]
        self._info["moves"] = state["moves"]
        return EnvObservation(text=text, admissible_actions=list(self._admissible), reward=reward,
                              done=self._done, won=won, info=dict(self._info))


# ---------------------------------------------------------------- the suite


class AlfWorldSuite(EnvSuite):
    """The ``alfworld`` env suite: manifest, one ``AlfWorldEnv`` per episode, the agent graph.

    ``data_dir`` defaults to ``$ALFWORLD_DATA``, then ``~/.cache/alfworld``; nothing is
    read until the first ``tasks``/``make_env``. ``seed`` is accepted for the suite
    protocol; ALFWorld episodes are deterministic. ``options`` are defaults for
    ``build_graph``; options given to ``build_graph`` itself win.
    """

    name = "alfworld"
    #: The paper's agent settings; the CLI applies them to fields the user did not set.
    agent_defaults = {"max_turns": 30, "history": "window", "history_window": 5}
    eval_split = "valid_seen"

    def __init__(self, data_dir: str | Path | None = None, seed: int = 0, *, win_reward: float = WIN_REWARD,
                 invalid_penalty: float = INVALID_PENALTY, **options: Any) -> None:
        self.data_dir = resolve_data_dir(data_dir)
        self.seed = seed
        self.win_reward = win_reward
        self.invalid_penalty = invalid_penalty
        self.options = options
        self._games: dict[str, list[Game]] = {}

    def split_dir(self, split: str) -> Path:
        if split not in SPLITS:

            raise ConfigError(f"unknown ALFWorld split {split!r}; valid splits: {', '.join(SPLITS)}; "
                              f"choose one with --split (or split: in the config)")
        root = self.data_dir / DATA_SUBDIR
        if not root.is_dir():
            where = "does not exist" if not self.data_dir.exists() else f"has no {DATA_SUBDIR} folder"
            raise data_error(f"ALFWorld data not found: {self.data_dir} {where}.")
        if not (root / split).is_dir():
            raise data_error(f"ALFWorld data incomplete: {root / split} does not exist.")
        return root / split

    def games(self, split: str) -> list[Game]:
        """The split's playable games (scanned once per suite)."""
        if split not in self._games:
            self._games[split] = scan_split(self.split_dir(split))
        return self._games[split]

    def tasks(self, split: str, n: int) -> list[Task]:
        return manifest(self.games(split), split, n)

    def prepare(self, tasks: list[Task]) -> None:
        """Fail before any episode starts when alfworld or a game file is missing."""
        if importlib.util.find_spec("alfworld") is None or importlib.util.find_spec("textworld") is None:
            raise data_error("the alfworld package is not installed.")
        for task in tasks:
            self.game_file(task)

    def game_file(self, task: Task) -> Path:
        path = self.split_dir(task.split) / task.data["path"] / GAME_FILE
        if not path.is_file():
            raise data_error(f"ALFWorld game {path} of task {task.task_id} is missing.")
        return path

    def make_env(self, task: Task) -> AlfWorldEnv:
        return AlfWorldEnv(self.game_file(task), task_id=task.task_id, game_type=task.data.get("game_type"),
                           win_reward=self.win_reward, invalid_penalty=self.invalid_penalty)

    def build_graph(self, llm: Any, **options: Any) -> Any:
        from seed_agents.graphs.alfworld import build_alfworld_agent

        return build_alfworld_agent(llm, **{**self.options, **options})

    def offline_analyzer(self) -> Analyzer:
        """Rule-based skills from the goal and the commands of each episode (``tools.alfworld_analyzer``)."""
        from seed_agents.tools.alfworld_analyzer import AlfWorldAnalyzer

        return AlfWorldAnalyzer()
