"""What a finished row leaving the decode's forward saves, on one recorded iteration's calls.

``bench/demo_speed.py`` times whole iterations, and a lever that rounds differently makes the
two sides sample other episodes, so a second's change is lost in what the episodes happen to
be. This replays one iteration of a recorded run instead: the LLM calls of its episodes
(``trajectories.jsonl``, token ids and sampling settings as the run sent them), batched as the
run batched them (turn k of every episode together, each episode its own turn-cache owner,
then every episode's hindsight prompt together), through one ``LocalBackend`` with
``drop_finished`` (``seed_agents.backends.engine``) on and off, alternating, the same seeds. Both sides compute the same
prompts; what differs is only whether a finished row stays in the forward.

Prints, per way, the seconds of the agent turns and of the hindsight batch (median of
``--repeats``), the ratio, and how many rows sampled the same ids both ways (float rounding
may part a few). Writes ``docs/results/decode_drop.json``.

    .venv/bin/python bench/decode_drop.py --run runs/train --model <the run's stage-1 model folder>
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ is on the path
from bench.results import add_results_args, config_of, now, write_result

WAYS = {"generate": False, "drop": True}  # way: LocalEngineOptions.drop_finished


class _Episode:
    """A turn-cache owner: one per recorded episode and replay."""


Batch = tuple[str, list[tuple[int, dict[str, Any]]]]  # (kind, [(episode index, call)])


def recorded_batches(trajectories: list[dict[str, Any]], iteration: int) -> tuple[list[Batch], int]:
    """(batches, episodes): the agent calls of turn k of every clean episode of ``iteration``,
    turn by turn, then the analyzer (hindsight) calls."""
    episodes = [t for t in trajectories if t["calls"] and t["calls"][0]["scope"].get("iteration") == iteration
                and t.get("fault") is None]
    if not episodes:
        raise SystemExit(f"error: no clean episode of iteration {iteration} in the trajectories")
    agent = [[c for c in t["calls"] if c.get("purpose") != "analyzer"] for t in episodes]
    batches = [("agent", [(i, calls[k]) for i, calls in enumerate(agent) if len(calls) > k])
               for k in range(max(len(calls) for calls in agent))]
    hindsight = [(i, c) for i, t in enumerate(episodes) for c in t["calls"] if c.get("purpose") == "analyzer"]
    return batches + ([("hindsight", hindsight)] if hindsight else []), len(episodes)


def replay(backend: Any, batches: list[Batch], episodes: int) -> tuple[dict[str, float], list[list[int]]]:
    """One replay: seconds by kind and every row's sampled ids, in batch order."""
    from seed_agents.types import SamplingParams

    owners = [_Episode() for _ in range(episodes)]
    seconds = {"agent": 0.0, "hindsight": 0.0}
    ids = []
    for kind, rows in batches:
        params = SamplingParams.model_validate({**rows[0][1]["sampling"], "seed": None})
        t0 = time.perf_counter()
        got = backend._generate_batch([c["prompt_ids"] for _, c in rows], params,
                                      seeds=[c["sampling"].get("seed") for _, c in rows],
                                      owners=[owners[i] for i, _ in rows])
        seconds[kind] += time.perf_counter() - t0
        ids += [g.token_ids for g in got]
    return seconds, ids


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True, help="A `seed-agents train` run folder (config.json, trajectories.jsonl).")
    p.add_argument("--model", default=None, help="The policy the run sampled from (default: the run's backend.model).")
    p.add_argument("--iteration", type=int, default=0, help="Which recorded iteration to replay.")
    p.add_argument("--repeats", type=int, default=3, help="Replays a way, alternating the ways' order.")
    p.add_argument("--note", default="", help="What else ran on the machine (written into the result).")
    p.add_argument("--result-name", default="decode_drop")
    add_results_args(p)
    args = p.parse_args(argv)
    if args.repeats < 1:
        p.error("--repeats must be at least 1")
    try:
        config = json.loads((args.run / "config.json").read_text())
        trajectories = [json.loads(line) for line in (args.run / "trajectories.jsonl").read_text().splitlines() if line]
    except (OSError, ValueError) as e:
        raise SystemExit(f"error: {args.run} is not a readable train run ({e})") from None

    from seed_agents.backends import local_kwargs
    from seed_agents.backends.engine import LocalEngineOptions
    from seed_agents.backends.local import LocalBackend
    from seed_agents.config import TrainConfig
    from seed_agents.config.core import LOCAL_ENGINE_KEYS

    # a run recorded while the engine options were backend keys replays with the engine it ran
    recorded = {key: config["backend"].pop(key) for key in LOCAL_ENGINE_KEYS if key in config.get("backend", {})}
    cfg = TrainConfig.model_validate(config)
    started = now()
    batches, episodes = recorded_batches(trajectories, args.iteration)
    engine = LocalEngineOptions(**recorded).backend_kwargs() if recorded else {}
    backend = LocalBackend(args.model or cfg.backend.model, max_batch_size=max(len(rows) for _, rows in batches),
                           **{**local_kwargs(cfg.backend), **engine})
    runs: dict[str, list[dict[str, float]]] = {way: [] for way in WAYS}
    ids: dict[str, list] = {}
    try:
        for r in range(args.repeats):
            for way in (list(WAYS) if r % 2 == 0 else list(WAYS)[::-1]):
                backend.drop_finished = WAYS[way]
                seconds, ids[way] = replay(backend, batches, episodes)
                runs[way].append(seconds)
                print(f"repeat {r} {way}: agent turns {seconds['agent']:.2f} s, hindsight {seconds['hindsight']:.2f} s",
                      flush=True)
    finally:
        backend.close()
    med = {way: {kind: statistics.median(s[kind] for s in runs[way]) for kind in ("agent", "hindsight")}
           for way in WAYS}
    for way in WAYS:
        med[way]["total"] = med[way]["agent"] + med[way]["hindsight"]
    same = sum(a == b for a, b in zip(ids["generate"], ids["drop"]))
    lengths = {kind: [len(c["completion_ids"]) for k, rows in batches if k == kind for _, c in rows]
               for kind in ("agent", "hindsight")}
    results = {"seconds": med, "runs": runs, "ratio": {k: med["drop"][k] / med["generate"][k] for k in med["drop"]},
               "rows": len(ids["drop"]), "rows_same_ids": same, "batches": [[k, len(rows)] for k, rows in batches],
               "recorded_completion_tokens": lengths}
    print(f"\none recorded iteration ({len(batches)} batches, {len(ids['drop'])} rows), median of {args.repeats}:")
    for kind in ("agent", "hindsight", "total"):
        print(f"  {kind:<9} generate {med['generate'][kind]:6.2f} s   drop {med['drop'][kind]:6.2f} s   "
              f"ratio {results['ratio'][kind]:.3f}")
    print(f"  rows with the same ids both ways: {same}/{len(ids['drop'])}")
    write_result(args.result_name, {k: (str(v) if isinstance(v, Path) else v) for k, v in config_of(args).items()
                                    if k not in ("run", "model")}, results, started_at=started,
                 results_dir=args.results_dir)


if __name__ == "__main__":
    main()
