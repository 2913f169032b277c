"""``seed-agents``: the composition root, the one place that wires backends, env suites,
graphs and (later) trainers together. Everything here is thin; the pieces are importable."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from seed_agents.aio import run_sync
from seed_agents.config import ConfigError, EvalConfig, TrainConfig, load_config, with_suite_defaults


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


def cmd_eval(args: argparse.Namespace) -> int:
    import torch

    from seed_agents.backends import BackendUnavailable, make_backend
    from seed_agents.capture import JsonlSink, capture
    from seed_agents.chat_model import SeedChatModel
    from seed_agents.envs import load_env_suite
    from seed_agents.metrics import format_table, summarize
    from seed_agents.runner import EpisodeRunner

    cfg = build_eval_config(args)
    out = Path(cfg.out)
    if (out / "trajectories.jsonl").exists() and not args.overwrite:
        raise ConfigError(f"{out} already holds a run (trajectories.jsonl); choose another --out or pass --overwrite")
    out.mkdir(parents=True, exist_ok=True)
    for name in ("trajectories.jsonl", "calls.jsonl"):
        (out / name).unlink(missing_ok=True)
    (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    torch.manual_seed(cfg.seed)

    suite = load_env_suite(cfg.env, seed=cfg.seed, **cfg.env_options)
    if cfg.split is None:  # each benchmark names its held-out split its own way
        cfg = cfg.model_copy(update={"split": getattr(suite, "eval_split", "eval_seen")})
        (out / "config.json").write_text(cfg.model_dump_json(indent=2))
    tasks = suite.tasks(cfg.split, cfg.num_tasks)
    if hasattr(suite, "prepare"):
        print(f"preparing {len(tasks)} {cfg.env} tasks ({cfg.split}) ...", flush=True)
        suite.prepare(tasks)
    print(f"loading {cfg.backend.kind} backend for {cfg.backend.model} ...", flush=True)
    backend, tokenizer = make_backend(cfg.backend)
    if hasattr(backend, "health") and not backend.health():
        raise BackendUnavailable(f"no vLLM server answers at {cfg.backend.base_url}; start one with `seed-agents serve --model {cfg.backend.model}`")
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=cfg.sampling, model_name=cfg.backend.model)
    agent = with_suite_defaults(cfg.agent, getattr(suite, "agent_defaults", None), agent_fields_given(cfg))
    graph = suite.build_graph(llm, **agent.model_dump())

    with JsonlSink(out / "trajectories.jsonl") as traj_sink, JsonlSink(out / "calls.jsonl") as call_sink:
        runner = EpisodeRunner(graph, cfg.runner, make_env=suite.make_env, sink=traj_sink)
        t0 = time.perf_counter()
        with capture(sink=call_sink, run=out.name, split=cfg.split):
            trajs = run_sync(runner.run(tasks))
        wall = time.perf_counter() - t0
    backend.close()
    summary = summarize(trajs, wall)
    if hasattr(suite, "extra_metrics"):  # a benchmark's own headline figure (WebShop: score)
        summary.update(suite.extra_metrics(summary))
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(format_table(summary))
    print(f"wrote {out / 'trajectories.jsonl'}, {out / 'calls.jsonl'}, {out / 'summary.json'}")
    return 0


_TRAIN_FLAGS = {"out": "out", "iterations": "iterations", "seed": "seed", "backend": "backend.kind",
                "model": "backend.model", "base_url": "backend.base_url"}


def cmd_train(args: argparse.Namespace) -> int:
    from seed_agents.cli_train import run_train

    cfg = load_config(TrainConfig, args.config, {f: getattr(args, k, None) for k, f in _TRAIN_FLAGS.items()})
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


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="seed-agents", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

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
    e.add_argument("--overwrite", action="store_true", help="Replace an existing run in --out.")
    e.set_defaults(func=cmd_eval)

    t = sub.add_parser("train", help="Train with SEED (or an ablation) from a YAML config.")
    t.add_argument("--config", help="YAML with TrainConfig fields (see configs/).")
    t.add_argument("--out", help="Run directory.")
    t.add_argument("--iterations", type=int, help="Optimizer updates.")
    t.add_argument("--seed", type=int)
    t.add_argument("--backend", choices=["local", "vllm"])
    t.add_argument("--model")
    t.add_argument("--base-url", dest="base_url")
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
    ksub = k.add_subparsers(dest="skills_command", required=True)
    from seed_agents.stage1 import collect, sft, usefulness

    for module in (collect, sft, usefulness):
        module.add_parser(ksub)
    return p


def main(argv: list[str] | None = None) -> int:
    from seed_agents.backends import BackendError
    from seed_agents.envs import UnknownEnvError

    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (ConfigError, UnknownEnvError, BackendError, FileNotFoundError) as e:
        print(f"seed-agents {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
