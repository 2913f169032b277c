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
from pathlib import Path

from seed_agents.aio import run_sync
from seed_agents.config import EvalConfig, TrainConfig, load_config, with_suite_defaults


# CLI flag -> EvalConfig field. Flags left unset keep the config's defaults.
_EVAL_FLAGS = {
    "env": "env", "split": "split", "episodes": "episodes", "seed": "seed", "out": "out",
    "group": "runner.group_size", "concurrency": "runner.concurrency",
    "episode_timeout": "runner.episode_timeout_s",
    "backend": "backend.kind", "model": "backend.model", "tokenizer": "backend.tokenizer",
    "base_url": "backend.base_url",
    "temperature": "sampling.temperature", "max_tokens": "sampling.max_tokens",
    "max_turns": "agent.max_turns", "history": "agent.history", "history_window": "agent.history_window",
}


def build_eval_config(args: argparse.Namespace) -> EvalConfig:
    return load_config(EvalConfig, args.config, {field: getattr(args, flag, None) for flag, field in _EVAL_FLAGS.items()})


def agent_fields_given(cfg: EvalConfig | TrainConfig) -> set[str]:
    """The agent fields the user set (YAML or flags); the rest may take suite defaults."""
    return set(cfg.agent.model_fields_set) if "agent" in cfg.model_fields_set else set()


EVAL_FILES = ("config.json", "trajectories.jsonl", "calls.jsonl", "summary.json")
"""What `eval` writes into --out: what --overwrite replaces (nothing else there is touched)."""


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from seed_agents.backends import make_backend
    from seed_agents.capture import JsonlSink, capture
    from seed_agents.chat_model import SeedChatModel
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
        cfg = cfg.model_copy(update={"split": getattr(suite, "eval_split", "eval_seen")})
    tasks = suite_tasks(suite, cfg.env, cfg.split, cfg.num_tasks)
    check_backend(cfg.backend)
    torch.manual_seed(cfg.seed)
    if hasattr(suite, "prepare"):
        print(f"preparing {len(tasks)} {cfg.env} tasks ({cfg.split}) ...", flush=True)
        suite.prepare(tasks)
    print(f"loading {cfg.backend.kind} backend for {cfg.backend.model} ...", flush=True)
    backend, tokenizer = make_backend(cfg.backend)
    try:
        llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=cfg.sampling, model_name=cfg.backend.model)
        agent = with_suite_defaults(cfg.agent, getattr(suite, "agent_defaults", None), agent_fields_given(cfg))
        graph = suite.build_graph(llm, **agent.model_dump())

        # -- the run: --overwrite's old files are deleted only once it has finished -------
        with replace_run(out, EVAL_FILES):
            (out / "config.json").write_text(cfg.model_dump_json(indent=2))
            with JsonlSink(out / "trajectories.jsonl") as traj_sink, JsonlSink(out / "calls.jsonl") as call_sink:
                runner = EpisodeRunner(graph, cfg.runner, make_env=suite.make_env, sink=traj_sink)
                t0 = time.perf_counter()
                with capture(sink=call_sink, run=out.name, split=cfg.split):
                    trajs = run_sync(runner.run(tasks))
                wall = time.perf_counter() - t0
            summary = summarize(trajs, wall)
            if hasattr(suite, "extra_metrics"):  # a benchmark's own headline figure (WebShop: score)
                summary.update(suite.extra_metrics(summary))
            (out / "summary.json").write_text(json.dumps(summary, indent=2))
    finally:
        backend.close()
    print(format_table(summary))
    print(f"wrote {out / 'trajectories.jsonl'}, {out / 'calls.jsonl'}, {out / 'summary.json'}")
    # The run is kept either way (every episode is recorded); too many faults fail the command.
    check_fault_budget(trajs, cfg.runner.max_fault_fraction, what="eval episodes")
    return 0


_TRAIN_FLAGS = {"out": "out", "iterations": "iterations", "seed": "seed", "from_store": "store.url", "backend": "backend.kind",
                "model": "backend.model", "base_url": "backend.base_url"}


def cmd_train(args: argparse.Namespace) -> int:
    from seed_agents.cli_train import run_train
    from seed_agents.preflight import remove_if_unused

    cfg = load_config(TrainConfig, args.config, {f: getattr(args, k, None) for k, f in _TRAIN_FLAGS.items()})
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
    p = _Parser(prog="seed-agents", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--debug", action="store_true", help="Show the full traceback of an error (before the command).")
    p.add_argument("--online", action="store_true",
                   help="Allow downloading hub models (default: offline; same as SEED_AGENTS_ONLINE=1).")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")

    e = sub.add_parser("eval", help="Play an environment with a model; write trajectories and a summary.")
    e.add_argument("--config", help="YAML file with EvalConfig fields; flags override it.")
    e.add_argument("--env", help="Environment suite (default textworld).")
    e.add_argument("--split", help="Task split (textworld: train, eval_seen, eval_unseen).")
    e.add_argument("--episodes", type=int, help="Total episodes (tasks x group).")
    e.add_argument("--group", type=int, help="Episodes per task.")
    e.add_argument("--model", help="smollm2-135m, a local folder or a hub id; with vllm the served name.")
    e.add_argument("--tokenizer", help="Tokenizer path/alias if it differs from --model.")
    e.add_argument("--backend", choices=["local", "vllm"])
    e.add_argument("--base-url", dest="base_url", help="vLLM server URL.")
    e.add_argument("--temperature", type=float)
    e.add_argument("--max-tokens", dest="max_tokens", type=int)
    e.add_argument("--max-turns", dest="max_turns", type=int)
    e.add_argument("--history", choices=["window", "chat"])
    e.add_argument("--history-window", dest="history_window", type=int)
    e.add_argument("--concurrency", type=int)
    e.add_argument("--episode-timeout", dest="episode_timeout", type=float)
    e.add_argument("--seed", type=int)
    e.add_argument("--out", help="Output directory (default runs/eval).")
    e.add_argument("--overwrite", action="store_true",
                   help="Replace the run in --out: its files move to <out>.old-<time>/, deleted when this run "
                        "finishes and moved back if it fails.")
    e.set_defaults(func=cmd_eval)

    t = sub.add_parser("train", help="Train with SEED (or an ablation) from a YAML config.")
    t.add_argument("--config", help="YAML with TrainConfig fields (see configs/).")
    t.add_argument("--out", help="Run directory.")
    t.add_argument("--iterations", type=int, help="Optimizer updates.")
    t.add_argument("--seed", type=int)
    t.add_argument("--backend", choices=["local", "vllm"])
    t.add_argument("--model")
    t.add_argument("--base-url", dest="base_url")
    t.add_argument("--from-store", dest="from_store", metavar="URL",
                   help="Train on the rewarded sessions recorded in this trace store (sqlite:///... or postgresql://...) instead of playing episodes.")
    t.add_argument("--resume", action="store_true", help="Continue from the last checkpoint in --out.")
    t.set_defaults(func=cmd_train)

    s = sub.add_parser("serve", help="Start a vLLM server ready for hot reload (dev mode, LoRA).")
    s.add_argument("--model", default="smollm2-135m")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--vllm-python", dest="vllm_python", help="Python of the venv with vLLM (default: $SEED_AGENTS_VLLM_PYTHON or .venv-vllm).")
    s.add_argument("--work-dir", dest="work_dir", help="Folder for vLLM caches and the log.")
    s.add_argument("--max-model-len", dest="max_model_len", type=int, default=4096)
    s.add_argument("--startup-timeout", dest="startup_timeout", type=float, default=600.0)
    s.set_defaults(func=cmd_serve)

    k = sub.add_parser("skills", help="Stage 1: collect hindsight skills, SFT the analyzer, check skill usefulness.")
    ksub = k.add_subparsers(dest="skills_command", required=True, metavar="SUBCOMMAND")
    from seed_agents.stage1 import collect, sft, usefulness

    for module in (collect, sft, usefulness):
        module.add_parser(ksub)

    # the deployed-agent data plane: the capture gateway, and what the store holds
    from seed_agents import gateway
    from seed_agents.store import export

    from seed_agents.continual import cli as continual_cli

    gateway.add_parser(sub)
    continual_cli.add_parser(sub)
    tr = sub.add_parser("traces", help="The trace store: export sessions as trajectories.")
    export.add_parser(tr.add_subparsers(dest="traces_command", required=True, metavar="SUBCOMMAND"))
    return p


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


def error_line(e: BaseException) -> str:
    """The message of ``e`` as one line, with anything shaped like a credential masked."""
    from seed_agents.redact import redact

    return redact(" ".join(str(e).split()) or type(e).__name__)


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
        return args.func(args)
    except KeyboardInterrupt:
        if args.debug:
            raise
        print(f"{command}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:
        if args.debug or not isinstance(e, _user_error_types()):
            raise  # a bug: the traceback is what a report needs
        print(f"{command}: error: {error_line(e)}", file=sys.stderr)
        return int(getattr(e, "exit_code", 2))


if __name__ == "__main__":
    sys.exit(main())
