"""seed-agents: LLM agents that improve from their own experience (SEED: GRPO plus
on-policy distillation from the policy's own hindsight skills).

Start with `seed-agents train` (the embedded demo: SmolLM2 on TextWorld games, on the CPU)
or `seed-agents eval` (play an environment and record every call). For a deployed agent:
`serve` a model, put the `gateway` in front of it, and let `continual` learn from the
rewarded traffic behind a gate; `status`, `report` and `versions` show and steer it.
`COMMAND --help` lists every flag (one per field of the command's config) with its meaning and
default; eval, train, skills, gateway and continual also read a YAML --config (flags win).

Errors you can fix end with one line on stderr naming the problem and the fix (exit 2);
`seed-agents --debug COMMAND ...` shows the traceback instead. Model names resolve offline
unless --online (or SEED_AGENTS_ONLINE=1) allows downloads.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from seed_agents.aio import run_sync
from seed_agents.app.flags import PRECEDENCE, add_config_flags, error_line
from seed_agents.config import PRESETS, BackendConfig, EvalConfig, RenamedConfigKey, TrainConfig, load_config
from seed_agents.config.loading import laid_over, named_keys
from seed_agents.config.presets import MAIN_JOB, TASK_SOURCES
from seed_agents.errors import UserError
from seed_agents.memory import limit_heap_growth
from seed_agents.shadowing import ShadowedDependency, check_shadowing


def build_eval_config(args: argparse.Namespace) -> EvalConfig:
    """Defaults < ``--config`` YAML < flags."""
    return load_config(EvalConfig, args.config, args.config_flags(args))


def build_train_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults < the main job (where nothing names a task source) < ``--preset`` <
    ``--config`` YAML < flags."""
    flags = args.config_flags(args)
    base = {} if named_keys(args.config, flags) & set(TASK_SOURCES) else MAIN_JOB
    return load_config(TrainConfig, args.config, flags, preset=laid_over(base, PRESETS[args.preset] if args.preset else {}))


EVAL_FILES = ("config.json", "trajectories.jsonl", "calls.jsonl", "summary.json")
"""What `eval` writes into --out: what --overwrite replaces (nothing else there is touched)."""


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from seed_agents.app.own_server import served
    from seed_agents.models import resolve_model
    from seed_agents.preflight import check_backend, check_out, load_suite, suite_tasks
    from seed_agents.runner import check_fault_budget

    # -- checks: nothing in --out is written or moved until all of them pass --------------
    cfg = build_eval_config(args)
    out = Path(cfg.out)
    check_out(out, holds_run=(out / "trajectories.jsonl").exists(), overwrite=args.overwrite,
              what="a run (trajectories.jsonl)")
    suite = load_suite(cfg.env, seed=cfg.seed, options=cfg.env_options)
    if cfg.split is None:  # each benchmark names its held-out split its own way
        cfg = cfg.model_copy(update={"split": suite.eval_split})
    tasks = suite_tasks(suite, cfg.env, cfg.split, cfg.num_tasks)
    check_backend(cfg.backend, may_start=True)
    torch.manual_seed(cfg.seed)
    print(f"preparing {len(tasks)} {cfg.env} tasks ({cfg.split}) ...", flush=True)
    suite.prepare(tasks)
    with served(cfg.backend, resolve_model(cfg.backend.tokenizer or cfg.backend.model)) as backend:
        print(f"loading {backend.kind} backend for {backend.model} ...", flush=True)
        trajs = _play(cfg, backend, suite, tasks, out)
    # The run is kept either way (every episode is recorded); too many faults fail the command.
    check_fault_budget(trajs, cfg.runner.max_fault_fraction, what="eval episodes")
    return 0


def _play(cfg: EvalConfig, backend: BackendConfig, suite: Any, tasks: list[Any], out: Path) -> list[Any]:
    """``eval``'s episodes with the model at ``backend``: trajectories, calls and summary written."""
    from seed_agents.app.builders import agent_config, open_chat_model, rollout_seed
    from seed_agents.capture import JsonlSink, capture
    from seed_agents.metrics import format_table, summarize
    from seed_agents.preflight import replace_run
    from seed_agents.runner import EpisodeRunner

    llm = open_chat_model(backend, cfg.sampling)
    try:
        graph = suite.build_graph(llm, **agent_config(cfg, suite).model_dump())

        # -- the run: --overwrite's old files are deleted only once it has finished -------
        with replace_run(out, EVAL_FILES):
            (out / "config.json").write_text(cfg.model_dump_json(indent=2))
            with JsonlSink(out / "trajectories.jsonl") as traj_sink, JsonlSink(out / "calls.jsonl") as call_sink:
                runner = EpisodeRunner(graph, cfg.runner, make_env=suite.make_env, sink=traj_sink,
                                       seed=rollout_seed(cfg.seed, cfg.backend))
                t0 = time.perf_counter()
                with capture(sink=call_sink, run=out.name, split=cfg.split):
                    trajs = run_sync(runner.run(tasks))
                wall = time.perf_counter() - t0
            summary = summarize(trajs, wall)
            summary.update(suite.extra_metrics(summary))  # a benchmark's own headline figure (WebShop: score)
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
    finally:
        llm.backend.close()
    print(format_table(summary))
    print(f"wrote {out / 'trajectories.jsonl'}, {out / 'calls.jsonl'}, {out / 'summary.json'}")
    return trajs


def cmd_train(args: argparse.Namespace) -> int:
    from seed_agents.app.train import run_train
    from seed_agents.preflight import remove_if_unused

    cfg = build_train_config(args)
    with remove_if_unused(Path(cfg.out)):  # a run that failed before its first record leaves no folder behind
        summary = run_train(cfg, resume=args.resume)
    print(f"done: {summary['iterations']} iterations, policy v{summary['policy_version']}; run dir {cfg.out}")
    return 0


class _Parser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (its default prints the usage block too)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}; see {self.prog} --help\n")


def _parser() -> argparse.ArgumentParser:
    root = _Parser(prog="seed-agents", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    root.add_argument("--debug", action="store_true", help="Show the full traceback of an error (before the command).")
    root.add_argument("--online", action="store_true",
                      help="Allow downloading hub models (default: offline; same as SEED_AGENTS_ONLINE=1).")
    sub = root.add_subparsers(dest="command", required=True, metavar="COMMAND")

    play = sub.add_parser("eval", help="Play an environment with a model; write trajectories and a summary.",
                          description=f"{EvalConfig.__doc__}\n\n{PRECEDENCE}", conflict_handler="resolve",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    play.add_argument("--config", metavar="YAML", help="YAML file with EvalConfig fields (see configs/eval_*.yaml).")
    play.add_argument("--overwrite", action="store_true",
                      help="Replace the run in --out: its files move to <out>.old-<time>/, deleted when this run "
                           "finishes and moved back if it fails.")
    play.set_defaults(func=cmd_eval, config_flags=add_config_flags(play, EvalConfig))

    train = sub.add_parser("train", help="Train with SEED (or an ablation) from a YAML config.",
                           description=f"{TrainConfig.__doc__}\n\n{PRECEDENCE}", conflict_handler="resolve",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--config", metavar="YAML", help="YAML file with TrainConfig fields (see configs/).")
    train.add_argument("--preset", choices=sorted(PRESETS),
                       help="Start from a named set of settings, under --config and the flags. paper: the SEED paper's "
                            "method (configs/paper.yaml) in place of the defaults a learning run here chose.")
    train.add_argument("--resume", action="store_true", help="Continue from the last checkpoint in --out.")
    train.set_defaults(func=cmd_train, config_flags=add_config_flags(train, TrainConfig))

    # the other commands, one module each under seed_agents.app.commands (flags from their configs)
    from seed_agents.app.commands import continual, gateway, observe, serve, skills, traces

    for command in (serve, skills, gateway, continual, observe, traces):
        command.add_parser(sub)
    return root


# What a user can fix: every project error subclasses UserError (seed_agents.errors); a path
# that does not exist, is not a folder, or may not be written is the user's to fix too.
USER_ERRORS = (UserError, FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def _one_line_config_warnings(show: Callable[..., None]) -> Callable[..., None]:
    """``warnings.showwarning`` that prints a renamed config key as one line (its source
    location would point into pydantic; the user needs the key) and passes on the rest."""

    def show_warning(message: Warning | str, category: type[Warning], *args: Any, **kwargs: Any) -> None:
        if issubclass(category, RenamedConfigKey):
            print(f"seed-agents: warning: {message}", file=sys.stderr)
        else:
            show(message, category, *args, **kwargs)

    return show_warning


def main(argv: list[str] | None = None) -> int:
    # A native abort leaves no Python trace; with this, stderr gets every thread's stack.
    # (The one seen, "terminate called without an active exception" at the end of a long
    # `skills collect`, was a daemon worker freeing tensors during finalization, caught
    # under gdb; seed_agents.aio now waits for the workers at exit.)
    if not faulthandler.is_enabled():
        try:
            faulthandler.enable()
        except (AttributeError, ValueError, OSError):  # a stderr without a file descriptor (a notebook's)
            pass
    limit_heap_growth()  # before anything allocates much: a training process's heap otherwise fills with holes
    try:  # before the parser: building it imports langgraph and langchain_core
        check_shadowing()
    except ShadowedDependency as err:
        named = [a for a in (sys.argv[1:] if argv is None else argv) if not a.startswith("-")][:1]
        print(f"{' '.join(['seed-agents', *named])}: error: {error_line(err)}", file=sys.stderr)
        return err.exit_code
    args = _parser().parse_args(argv)  # a usage error: one line, then SystemExit(2), as argparse does
    from seed_agents.models import ONLINE_ENV, online

    if args.online:
        os.environ[ONLINE_ENV] = "1"
    if not online():  # transformers and huggingface_hub never reach for the network
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    nested = [v for k, v in vars(args).items() if k.endswith("_command") and isinstance(v, str)]  # skills collect, ...
    command = " ".join(["seed-agents", args.command, *nested])
    try:
        with warnings.catch_warnings():  # restores the process's warning display afterwards
            warnings.showwarning = _one_line_config_warnings(warnings.showwarning)
            return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except Exception as err:
        if args.debug or not isinstance(err, USER_ERRORS):
            raise  # a bug: the traceback is what a report needs
        print(f"{command}: error: {error_line(err)}", file=sys.stderr)
        return int(getattr(err, "exit_code", 2))


if __name__ == "__main__":
    sys.exit(main())
