"""The ``webshop`` env suite: a catalog (original files or synthetic), tasks, envs, graph."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from seed_agents.envs import EnvSuite
from seed_agents.errors import ConfigError
from seed_agents.tools.webshop.catalog import (
    Catalog,
    Goal,
    WebShopDataError,
    cached,
    find_webshop_files,
    load_webshop_files,
)
from seed_agents.tools.webshop.env import WebShopEnv
from seed_agents.tools.webshop.synthetic import synthetic_catalog
from seed_agents.types import Task

CATALOGS = ("webshop", "synthetic")
_GRAPH_OPTIONS = ("max_turns", "history", "history_window", "system_prompt")


def _file_key(path: Path) -> tuple[str, int, int]:
    st = path.stat()
    return str(path.resolve()), st.st_size, st.st_mtime_ns


class WebShopSuite(EnvSuite):
    """WebShop: shop for an instruction with ``search[...]`` and ``click[...]``.

    ``catalog``: ``webshop`` (the original files in ``data_dir``; the default when
    ``data_dir`` is given) or ``synthetic`` (built in, the default otherwise; ids and
    categories say so). ``products_file``/``attributes_file``/``human_goals_file``
    override the file names (absolute, or relative to ``data_dir``). ``server_url``
    plays against a running original WebShop server instead of in-process; its data
    must be this catalog's, so that goal indices agree. Other ``options`` are defaults
    for ``build_graph``. The env is deterministic: ``seed`` changes nothing.
    """

    name = "webshop"
    agent_defaults = {"max_turns": 15, "history": "window", "history_window": 2}
    eval_split = "test"

    def extra_metrics(self, summary: dict[str, Any]) -> dict[str, float]:
        """WebShop's score: mean final reward x 100 (the per-step rewards sum to it)."""
        return {"score": 100.0 * summary["mean_reward"]}

    def __init__(self, seed: int = 0, catalog: str | None = None, data_dir: str | Path | None = None,
                 products_file: str | None = None, attributes_file: str | None = None,
                 human_goals_file: str | None = None, synthetic_seed: int = 0,
                 server_url: str | None = None, **options: Any) -> None:
        unknown = sorted(set(options) - set(_GRAPH_OPTIONS))
        if unknown:
            raise ConfigError(f"unknown webshop env_options {unknown}; valid: catalog, data_dir, products_file, "
                              f"attributes_file, human_goals_file, synthetic_seed, server_url, "
                              f"{', '.join(_GRAPH_OPTIONS)}")
        source = catalog or ("webshop" if data_dir is not None else "synthetic")
        if source not in CATALOGS:
            raise ConfigError(f"unknown webshop catalog {source!r}; valid: {', '.join(CATALOGS)}")
        if source == "synthetic" and data_dir is not None:
            raise ConfigError("webshop: catalog 'synthetic' ignores data_dir; drop one of them")
        if source == "webshop" and data_dir is None:
            raise WebShopDataError("catalog 'webshop' needs the original data: no data_dir given.")
        self.seed = seed
        self.server_url = server_url
        self.options = options
        self.catalog: Catalog
        if source == "synthetic":
            self.catalog = cached(("synthetic", synthetic_seed), lambda: synthetic_catalog(synthetic_seed))
        else:
            self.catalog = self._load(Path(data_dir).expanduser(), products_file, attributes_file, human_goals_file)

    @staticmethod
    def _load(data_dir: Path, *files: str | None) -> Catalog:
        paths = find_webshop_files(data_dir, *files)

        def load() -> Catalog:
            print(f"loading WebShop data: {', '.join(map(str, paths))} ...", flush=True)
            return load_webshop_files(*paths)

        return cached(("webshop", *(_file_key(p) for p in paths)), load)

    def tasks(self, split: str, n: int) -> list[Task]:
        """The first ``n`` goals of ``split`` in the catalog's fixed order; goal ``i`` has
        id ``webshop-{i}`` (``webshop-synthetic-{i}`` for the synthetic catalog)."""
        indices = self.catalog.split_range(split)
        if not 0 <= n <= len(indices):
            raise ConfigError(f"WebShop split {split!r} of the {self.catalog.source} catalog has {len(indices)} goals; "
                              f"asked for {n}; ask for a number in [0, {len(indices)}]")
        prefix = "webshop-synthetic-" if self.catalog.source == "synthetic" else "webshop-"
        out = []
        for i in indices[:n]:
            goal = self.catalog.goals[i]
            data = {"goal_index": i, "game_type": goal.category, "catalog": self.catalog.source, **goal.to_data()}
            out.append(Task(task_id=f"{prefix}{i:05d}", split=split, data=data))
        return out

    def prepare(self, tasks: list[Task]) -> None:
        """Build the search index now rather than in the first episode's first search."""
        _ = self.catalog.index

    def make_env(self, task: Task) -> Any:
        goal = Goal.from_data(task.data)
        if self.server_url is not None:
            from seed_agents.tools.webshop.remote import WebShopServerEnv

            return WebShopServerEnv(self.server_url, int(task.data["goal_index"]), task_id=task.task_id,
                                    game_type=goal.category)
        return WebShopEnv(self.catalog, goal, task_id=task.task_id)

    def build_graph(self, llm: Any, **options: Any) -> Any:
        from seed_agents.graphs.webshop import build_webshop_agent

        return build_webshop_agent(llm, **{**self.options, **options})
