"""``seed-agents``: the composition root, the one place that wires backends, env suites,
graphs and (later) trainers together. Everything here is thin; the pieces are importable.

Errors a user can fix (a bad config, split, model, path, env, server or sync) end the
command with one line on stderr that names the problem and the fix, and exit status 2;
``seed-agents --debug ...`` shows the traceback instead. Every command checks all of its
input before it writes into ``--out`` (``seed_agents.preflight``). Model names are
resolved offline unless ``--online`` (or ``SEED_AGENTS_ONLINE=1``) allows downloads.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import typing
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from seed_agents.aio import run_sync
from seed_agents.config import BackendConfig, ConfigError, EvalConfig, RenamedConfigKey, TrainConfig, load_config


# The short flags users already type (README, scripts), beside the generated dotted ones
# (`--group` is `--runner.group-size`). Keys are the generated names; a key that a command's
# config lacks is skipped. `--backend` is `--backend.kind` (added in `add_config_flags`: the
# generator gives that name to a JSON flag for the whole `backend` section).
SHORT_FLAGS = {
    "runner.group-size": "group", "runner.concurrency": "concurrency", "runner.episode-timeout-s": "episode-timeout",
    "backend.model": "model", "backend.tokenizer": "tokenizer", "backend.base-url": "base-url",
    "sampling.temperature": "temperature", "sampling.max-tokens": "max-tokens",
    "agent.max-turns": "max-turns", "agent.history": "history", "agent.history-window": "history-window",
    "store.url": "from-store",
}


def add_config_flags(parser: argparse.ArgumentParser, model: type[BaseModel]) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """Add a flag for every field of ``model`` (nested fields dotted: ``--runner.group-size``) to
    ``parser`` (made with ``conflict_handler="resolve"``, for ``--backend``),
    with the field's description and default as its help, and return the function that reads
    the given flags back from the parsed namespace as a nested dict (flags not given are absent).

    pydantic-settings' ``CliSettingsSource`` generates the flags on our own argparse parser, so
    the other commands (``skills``, ``gateway``, ...) keep their argparse subparsers. Values
    stay strings until the config validates them, so a bad value is the config's one-line
    error (exit 2) that names the field.
    """
    from pydantic_settings import CliSettingsSource, SettingsError

    fields = {name.replace("_", "-") for name in model.model_fields}
    shortcuts = {path: flag for path, flag in SHORT_FLAGS.items() if path.split(".")[0] in fields}
    source = CliSettingsSource(model, root_parser=parser, cli_kebab_case=True,
                               cli_hide_none_type=True, cli_implicit_flags=True, cli_use_class_docs_for_groups=True,
                               cli_shortcuts=shortcuts)
    if "backend" in model.model_fields:  # `--backend` was the generator's whole-section JSON flag (`--backend.kind` wins)
        kind = BackendConfig.model_fields["kind"]
        parser.add_argument("--backend", dest="backend.kind", choices=typing.get_args(kind.annotation), default=argparse.SUPPRESS,
                            help=f"Same as --backend.kind. {kind.description}")

    def given(args: argparse.Namespace) -> dict[str, Any]:
        try:
            return source(parsed_args=args)()
        except SettingsError as err:  # e.g. --env-options that is neither JSON nor key=value
            raise ConfigError(f"invalid arguments: {error_line(err)}; fix the flag (see --help)") from None

    return given


def build_eval_config(args: argparse.Namespace) -> EvalConfig:
    """Defaults < ``--config`` YAML < flags."""
    return load_config(EvalConfig, args.config, args.config_flags(args))


EVAL_FILES = ("config.json", "trajectories.jsonl", "calls.jsonl", "summary.json")
"""What `eval` writes into --out: what --overwrite replaces (nothing else there is touched)."""


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from seed_agents.capture import JsonlSink, capture
    from seed_agents.cli_train import agent_config, open_chat_model, rollout_seed
    from seed_agents.metrics import format_table, summarize
    from seed_agents.preflight import check_backend, check_out, load_suite, replace_run, suite_tasks
    from seed_agents.runner import EpisodeRunner, check_fault_budget

    # -- checks: nothing in --out is written or moved until all of them pass --------------
    cfg = build_eval_config(args)
    out = Path(cfg.out)
    check_out(out, holds_run=(out / "trajectories.jsonl").exists(), overwrite=args.overwrite,
              what="a run (trajectories.jsonl)")
    suite = load_suite(cfg.env, seed=cfg.seed, options=cfg.env_options)
    if cfg.split is None:  # each benchmark names its held-out split its own way
        cfg = cfg.model_copy(update={"split": suite.eval_split})
    tasks = suite_tasks(suite, cfg.env, cfg.split, cfg.num_tasks)
    check_backend(cfg.backend)
    torch.manual_seed(cfg.seed)
    print(f"preparing {len(tasks)} {cfg.env} tasks ({cfg.split}) ...", flush=True)
    suite.prepare(tasks)
    print(f"loading {cfg.backend.kind} backend for {cfg.backend.model} ...", flush=True)
    llm = open_chat_model(cfg.backend, cfg.sampling)
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
    # The run is kept either way (every episode is recorded); too many faults fail the command.
    check_fault_budget(trajs, cfg.runner.max_fault_fraction, what="eval episodes")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from seed_agents.cli_train import run_train
    from seed_agents.preflight import remove_if_unused

    cfg = load_config(TrainConfig, args.config, args.config_flags(args))  # defaults < --config YAML < flags
    with remove_if_unused(Path(cfg.out)):  # a run that failed before its first record leaves no folder behind
        summary = run_train(cfg, resume=args.resume)
    print(f"done: {summary['iterations']} iterations, policy v{summary['policy_version']}; run dir {cfg.out}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from seed_agents.models import resolve_model
    from seed_agents.serve import VLLMServer

    path = resolve_model(args.model)
    server = VLLMServer(path, served_model_name=args.model, port=args.port, host=args.host,
                        python=args.vllm_python, work_dir=args.work_dir, max_model_len=args.max_model_len)
    server.start()
    print(f"starting vLLM for {args.model} ({path}); log: {server.log_path}", flush=True)
    try:
        server.wait_ready(args.startup_timeout)
        print(f"vLLM ready at {server.url}  (seed-agents eval --backend vllm --base-url {server.url} --model {args.model})", flush=True)
        while server.process.poll() is None:
            time.sleep(1.0)
        print(f"vLLM exited with code {server.process.returncode}; see {server.log_path}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 0
    finally:
        server.stop()


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

    precedence = "Every field of the config is a flag; flags override the --config YAML, which overrides the defaults."
    play = sub.add_parser("eval", help="Play an environment with a model; write trajectories and a summary.",
                          description=f"{EvalConfig.__doc__}\n\n{precedence}", conflict_handler="resolve",
                          formatter_class=argparse.RawDescriptionHelpFormatter)
    play.add_argument("--config", metavar="YAML", help="YAML file with EvalConfig fields (see configs/eval_*.yaml).")
    play.add_argument("--overwrite", action="store_true",
                      help="Replace the run in --out: its files move to <out>.old-<time>/, deleted when this run "
                           "finishes and moved back if it fails.")
    play.set_defaults(func=cmd_eval, config_flags=add_config_flags(play, EvalConfig))

    train = sub.add_parser("train", help="Train with SEED (or an ablation) from a YAML config.",
                           description=f"{TrainConfig.__doc__}\n\n{precedence}", conflict_handler="resolve",
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    train.add_argument("--config", metavar="YAML", help="YAML file with TrainConfig fields (see configs/).")
    train.add_argument("--resume", action="store_true", help="Continue from the last checkpoint in --out.")
    train.set_defaults(func=cmd_train, config_flags=add_config_flags(train, TrainConfig))

    serve = sub.add_parser("serve", help="Start a vLLM server ready for hot reload (dev mode, LoRA).",
                           formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    serve.add_argument("--model", default="smollm2-135m", help="Alias, local folder or hub id to serve (also its served name).")
    serve.add_argument("--host", default="127.0.0.1", help="Interface to listen on.")
    serve.add_argument("--port", type=int, default=8000, help="Port to listen on.")
    serve.add_argument("--vllm-python", dest="vllm_python", help="Python of the venv with vLLM (default: $SEED_AGENTS_VLLM_PYTHON or .venv-vllm).")
    serve.add_argument("--work-dir", dest="work_dir", help="Folder for vLLM caches and the log.")
    serve.add_argument("--max-model-len", dest="max_model_len", type=int, default=4096, help="Context length vLLM allocates for.")
    serve.add_argument("--startup-timeout", dest="startup_timeout", type=float, default=600.0,
                       help="Seconds to wait for the server to answer /health.")
    serve.set_defaults(func=cmd_serve)

    skills = sub.add_parser("skills", help="Stage 1: collect hindsight skills, SFT the analyzer, check skill usefulness.")
    ksub = skills.add_subparsers(dest="skills_command", required=True, metavar="SUBCOMMAND")
    from seed_agents.stage1 import collect, sft, usefulness

    for module in (collect, sft, usefulness):
        module.add_parser(ksub)

    # the deployed-agent data plane: the capture gateway, and what the store holds
    from seed_agents import gateway
    from seed_agents.store import export

    from seed_agents.continual import cli as continual_cli
    from seed_agents.observe import cli as observe_cli

    gateway.add_parser(sub)
    continual_cli.add_parser(sub)
    observe_cli.add_parser(sub)
    tr = sub.add_parser("traces", help="The trace store: export sessions as trajectories.")
    export.add_parser(tr.add_subparsers(dest="traces_command", required=True, metavar="SUBCOMMAND"))
    return root


# Errors a user can fix, by (module, class): one line on stderr, no traceback. Looked up only
# in modules already imported (an error cannot come from a module that was never loaded), so
# the CLI does not import the trainer stack to recognise its errors.
_USER_ERRORS = (
    ("seed_agents.config", "UserError"),
    ("seed_agents.envs", "UnknownEnvError"),
    ("seed_agents.backends.base", "BackendError"),
    ("seed_agents.models", "ModelNotAvailable"),
    ("seed_agents.runner", "FaultBudgetExceeded"),
    ("seed_agents.serve", "VLLMServerError"),
    ("trainers.weight_sync", "WeightSyncError"),
    ("trainers.seed_trainer", "NoTrainableRows"),
    ("tools.textworld", "TwMakeError"),
)


def _user_error_types() -> tuple[type[BaseException], ...]:
    types: list[type[BaseException]] = [FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError]
    for module, name in _USER_ERRORS:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and issubclass(cls, BaseException):
            types.append(cls)
    return tuple(types)


def error_line(err: BaseException) -> str:
    """The message of ``err`` as one line, with anything shaped like a credential masked."""
    from seed_agents.redact import redact

    return redact(" ".join(str(err).split()) or type(err).__name__)


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
        if args.debug or not isinstance(err, _user_error_types()):
            raise  # a bug: the traceback is what a report needs
        print(f"{command}: error: {error_line(err)}", file=sys.stderr)
        return int(getattr(err, "exit_code", 2))


if __name__ == "__main__":
    sys.exit(main())
