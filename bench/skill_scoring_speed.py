"""How fast `skills eval` scores, before and after it stopped recomputing what prompts share.

`skills eval` re-scores every recorded policy call twice per analyzer (with and without the
skill) under the fp32 policy. On the atlas a call's prompt is ~500-700 tokens, of which the
system prompt and tool schemas (~400) are the same in every skill-free prompt, and one
episode's turns extend each other; its completion is ~20-60. The scorer used to run each
sequence whole, right-padded, with the 49k-word vocabulary projection at every position.
It now (``Scorer`` in ``seed_agents/stage1/usefulness.py``) computes logits only where a
completion token is predicted, and batches prompts in token order so the tokens a batch
shares run once (``scoring.completion_logprobs``). This script scores the same pairs three
ways, side by side in one process, the arms' order rotated each repeat:

- ``whole``: the former scorer (``batch_sequence_logprobs``, length-sorted, batches of 4);
- ``completion_logits``: the new scorer with ``share_prefix`` off;
- ``shared_prefix``: the new scorer as `skills eval` runs it.

Printed per arm: seconds (median over repeats), tokens run, the speed-up over ``whole``,
and how far its numbers are from ``whole``'s (per sequence sum of log-probs, and the
per-token Delta the eval reports). The pairs are real: the base policy plays atlas level-0
training tasks with the learning curve's rollout settings (``bench/atlas_skills.py``'s
``play``), or ``--episodes`` names a trajectories file; each episode's skill is the oracle
skill naming its task's calls (what ``atlas_skills``' ``oracle-specific`` analyzer writes).

    .venv/bin/python bench/skill_scoring_speed.py --note "nothing else ran"
    .venv/bin/python bench/skill_scoring_speed.py --tasks 1 --group 2 --repeats 1 \\
        --work runs/sss-smoke --results-dir runs/sss-smoke/results               # smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ and examples/ are on the path
from bench.results import add_results_args, config_of, now, write_result  # noqa: E402

ARMS = ("whole", "completion_logits", "shared_prefix")
Pair = tuple[list[int], list[int]]


def whole_sums(model: Any, pairs: Sequence[Pair], *, pad_token_id: int, batch_size: int = 4) -> list[float]:
    """The former scorer: length-sorted batches of whole sequences, logits everywhere; like
    it, each distinct pair is scored once (its cache)."""
    import torch

    from seed_agents.scoring import batch_sequence_logprobs

    distinct = list(dict.fromkeys((tuple(p), tuple(c)) for p, c in pairs))
    order = sorted(distinct, key=lambda pc: len(pc[0]) + len(pc[1]))
    sums: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
    for i in range(0, len(order), batch_size):
        batch = order[i : i + batch_size]
        with torch.no_grad():
            logps, mask = batch_sequence_logprobs(model, [p for p, _ in batch], [c for _, c in batch], pad_token_id=pad_token_id)
        sums.update(zip(batch, (logps.double() * mask).sum(-1).tolist()))
    return [sums[(tuple(p), tuple(c))] for p, c in pairs]


def distinct_tokens(pairs: Sequence[Pair]) -> int:
    """The tokens of the distinct pairs: what the former scorer ran."""
    return sum(len(p) + len(c) for p, c in dict.fromkeys((tuple(p), tuple(c)) for p, c in pairs))


def scorer_sums(model: Any, pairs: Sequence[Pair], *, pad_token_id: int, batch_size: int,
                share_prefix: bool) -> tuple[list[float], int]:
    """The new scorer's numbers for ``pairs`` and the tokens its forwards ran."""
    from seed_agents.stage1.usefulness import Scorer

    scorer = Scorer(model, pad_token_id=pad_token_id, batch_size=batch_size, share_prefix=share_prefix)
    scorer.prefetch(pairs)
    return [scorer(p, c) for p, c in pairs], scorer.forward_tokens


def build_pairs(episodes: Path, tokenizer: Any) -> tuple[list[Pair], list[tuple[list[int], list[int], int]]]:
    """Every call's (prompt, completion) without and with its episode's oracle skill, and per
    episode the indices of its skill-free pairs, its skilled pairs and its completion tokens."""
    from bench.atlas_skills import oracle_skill
    from examples.atlas_tasks import make_tasks
    from seed_agents.capture import read_jsonl
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.skills import SystemBlockInjector, teacher_prompt_ids
    from seed_agents.types import Trajectory

    data = {t.task_id: t.data for split in ("train", "heldout") for t in make_tasks(split)}
    llm, injector = SeedChatModel(backend=None, tokenizer=tokenizer), SystemBlockInjector()
    pairs: list[Pair] = []
    per_episode = []
    for traj in read_jsonl(episodes, Trajectory):
        calls = [c for c in traj.policy_calls if c.completion_ids]
        if not calls or traj.task_id not in data:
            continue
        skill = oracle_skill(data[traj.task_id], "specific")
        without = list(range(len(pairs), len(pairs) + len(calls)))
        pairs += [(list(c.prompt_ids), list(c.completion_ids)) for c in calls]
        with_ = list(range(len(pairs), len(pairs) + len(calls)))
        pairs += [(teacher_prompt_ids(llm, c, skill, injector), list(c.completion_ids)) for c in calls]
        per_episode.append((without, with_, sum(len(c.completion_ids) for c in calls)))
    return pairs, per_episode


def deltas(sums: Sequence[float], per_episode: Sequence[tuple[list[int], list[int], int]]) -> list[float]:
    """Per episode, the per-token Delta `skills eval` reports (with minus without, per token)."""
    return [(sum(sums[i] for i in w) - sum(sums[i] for i in wo)) / n for wo, w, n in per_episode]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--episodes", type=Path, help="A trajectories file to score (default: play --tasks x --group).")
    p.add_argument("--tasks", type=int, default=4, help="Atlas level-0 training tasks to play.")
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--temperature", type=float, default=0.5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8, help="The new scorer's rows per forward (skills eval's default).")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "skill_scoring_speed")
    p.add_argument("--note", default="", help="What else ran on the machine.")
    add_results_args(p)
    args = p.parse_args(argv)
    if args.repeats < 1 or args.batch_size < 1:
        p.error("--repeats and --batch-size: at least 1")
    if args.episodes is not None and not args.episodes.is_file():
        p.error(f"--episodes: no file {args.episodes}")

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from bench.atlas_skills import play
    from seed_agents.models import resolve_model

    started = now()
    torch.set_num_threads(args.threads)
    episodes = args.episodes
    if episodes is None:
        args.work.mkdir(parents=True, exist_ok=True)
        episodes = args.work / "episodes.jsonl"
        play(args, episodes)
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id or 0)
    pairs, per_episode = build_pairs(episodes, tokenizer)
    if not pairs:
        raise SystemExit(f"error: no atlas policy calls with tokens in {episodes}")
    whole_tokens = distinct_tokens(pairs)
    print(f"{len(per_episode)} episodes, {len(pairs)} sequences ({whole_tokens} tokens in the distinct ones, "
          f"{sum(len(b) for _, b in pairs)} of them completions)", flush=True)

    run: dict[str, Callable[[], tuple[list[float], int]]] = {
        "whole": lambda: (whole_sums(model, pairs, pad_token_id=pad), whole_tokens),
        "completion_logits": lambda: scorer_sums(model, pairs, pad_token_id=pad, batch_size=args.batch_size,
                                                 share_prefix=False),
        "shared_prefix": lambda: scorer_sums(model, pairs, pad_token_id=pad, batch_size=args.batch_size,
                                             share_prefix=True),
    }
    seconds: dict[str, list[float]] = {a: [] for a in ARMS}
    sums: dict[str, list[float]] = {}
    tokens: dict[str, int] = {}
    for r in range(args.repeats):
        for arm in ARMS[r % len(ARMS):] + ARMS[: r % len(ARMS)]:  # rotate: no arm always runs first
            t0 = time.perf_counter()
            sums[arm], tokens[arm] = run[arm]()
            seconds[arm].append(time.perf_counter() - t0)
            print(f"repeat {r + 1} {arm:<18} {seconds[arm][-1]:7.1f} s", flush=True)

    base_delta = deltas(sums["whole"], per_episode)
    arms = {}
    for arm in ARMS:
        med = statistics.median(seconds[arm])
        arms[arm] = {
            "seconds": seconds[arm], "median_s": med, "tokens_run": tokens[arm],
            "speedup_vs_whole": statistics.median(seconds["whole"]) / med,
            "max_abs_diff_sum": max(abs(a - b) for a, b in zip(sums[arm], sums["whole"])),
            "max_abs_diff_delta": max(abs(a - b) for a, b in zip(deltas(sums[arm], per_episode), base_delta)),
        }
    print(f"\n{'arm':<18}{'median s':>10}{'tokens run':>12}{'speed-up':>10}{'max |d sum|':>13}{'max |d Delta|':>15}")
    for arm, a in arms.items():
        print(f"{arm:<18}{a['median_s']:>10.1f}{a['tokens_run']:>12}{a['speedup_vs_whole']:>9.2f}x"
              f"{a['max_abs_diff_sum']:>13.2e}{a['max_abs_diff_delta']:>15.2e}")
    spread = statistics.pstdev(base_delta) if len(base_delta) > 1 else None
    if spread is not None:
        print(f"(the Deltas themselves spread by {spread:.3f} nats/token across episodes)")
    write_result("skill_scoring_speed", {**config_of(args), "episodes": Path(episodes).name, "level": 0},
                 {"arms": arms, "episodes": len(per_episode), "sequences": len(pairs), "whole_tokens": whole_tokens,
                  "distinct_sequences": len(dict.fromkeys((tuple(a), tuple(b)) for a, b in pairs)),
                  "completion_tokens": sum(len(b) for _, b in pairs), "delta_spread": spread, "note": args.note},
                 started_at=started, results_dir=args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
