"""``seed-agents skills collect|sft|eval``: stage 1 from the command line.

The flags are the fields of each subcommand's config (``CollectConfig``, ``SFTRunConfig``,
``UsefulnessConfig``), with the short flags users already type kept as aliases; the work
is ``run_collect``, ``run_sft`` and ``run_usefulness`` in ``seed_agents.stage1``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from seed_agents.app.flags import config_command
from seed_agents.config import load_config
from seed_agents.stage1 import collect, sft, usefulness

# the short flags of `skills collect` beside the generated ones (generated name -> alias)
COLLECT_SHORTCUTS: dict[str, str | list[str]] = {
    "analyzer.model": "analyzer-model", "analyzer.name": "analyzer-name", "analyzer.base-url": "analyzer-base-url",
    "analyzer.api-key-env": "api-key-env", "analyzer.spec": "analyzer-spec",
    "analyzer.max-concurrency": "analyzer-concurrency", "analyzer.requests-per-minute": "requests-per-minute",
}
SFT_SHORTCUTS: dict[str, str | list[str]] = {"learning-rate": "lr", "heldout-fraction": "heldout"}
EVAL_SHORTCUTS: dict[str, str | list[str]] = {"rerun.env": "env", "rerun.episodes-per-task": "rerun-episodes",
                                              "rerun.max-tasks": "rerun-tasks"}


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``skills`` with ``collect``, ``sft`` and ``eval`` on ``sub``."""
    skills = sub.add_parser("skills", help="Stage 1: collect hindsight skills, SFT the analyzer, check skill usefulness.")
    ksub = skills.add_subparsers(dest="skills_command", required=True, metavar="SUBCOMMAND")

    p = config_command(ksub, "collect", collect.CollectConfig, cmd_collect, description=collect.__doc__,
                       help="Roll out the base policy and have an analyzer write a skill per episode (resumable).",
                       shortcuts=COLLECT_SHORTCUTS, switches={"analyzer": "analyzer.kind"})
    p.epilog = ("Exit status: 0 when every episode is analyzed; 1 when some analyzer requests failed (re-run the same "
                "command to retry them); 2 on a bad config or an unreachable backend.")

    p = config_command(ksub, "sft", sft.SFTRunConfig, cmd_sft, description=sft.__doc__, shortcuts=SFT_SHORTCUTS,
                       help="SFT the policy on analyzer prompt -> skill JSON (TRL); report held-out loss and parse rate.")
    p.add_argument("--overwrite", action="store_true",
                   help="Replace the run in --out: its model and summary move to <out>.old-<time>/, deleted when "
                        "this run finishes and moved back if it fails.")

    config_command(ksub, "eval", usefulness.UsefulnessConfig, cmd_eval, description=usefulness.__doc__,
                   help="Does inserting each analyzer's skill raise the policy's log-prob of better actions?",
                   shortcuts=EVAL_SHORTCUTS, switches={"rerun": "rerun.enabled"})


def cmd_collect(args: argparse.Namespace) -> int:
    """Exit 0 when every episode is analyzed; 1 when some requests failed (re-run to retry them)."""
    cfg = load_config(collect.CollectConfig, args.config, args.config_flags(args))
    summary = collect.run_collect(cfg)
    print(collect.format_summary(summary))
    out = Path(cfg.out)
    print(f"wrote {out / 'examples.jsonl'}, {out / 'trajectories.jsonl'}, {out / 'summary.json'}")
    if summary["failed_requests"]:
        print(f"{summary['failed_requests']} analyzer requests failed (first: {summary['first_errors'][0]}); "
              f"re-run the same command to retry them (finished episodes are kept).")
        return 1
    return 0


def cmd_sft(args: argparse.Namespace) -> int:
    cfg = load_config(sft.SFTRunConfig, args.config, args.config_flags(args))
    summary = sft.run_sft(cfg, overwrite=args.overwrite)
    print(sft.format_summary(summary))
    print(f"wrote {summary['model_dir']} (use it as backend.model of `seed-agents train`) and "
          f"{Path(cfg.out) / 'sft_summary.json'}")
    return 0


def cmd_eval(args: argparse.Namespace) -> int:
    cfg = load_config(usefulness.UsefulnessConfig, args.config, args.config_flags(args))
    result = usefulness.run_usefulness(cfg)
    print(usefulness.format_table(result["rows"]))
    print(f"wrote {Path(cfg.out) / 'usefulness.json'}")
    return 0
