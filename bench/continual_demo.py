"""The continual-learning demo end to end on CPU, with its figures.

What runs, all on loopback, all started and stopped by this script:

1. **production**: the demo library service (``examples.library_service``), whose request log
   counts every request by method and by origin (``X-Demo-Origin``: the traffic generator
   marks its requests ``traffic``, the members returning books ``members``; anything else,
   i.e. the loop's live reads, arrives ``unmarked``);
2. **serving**: the real CPU vLLM server (``seed_agents.serve.VLLMServer``, LoRA enabled)
   behind the capture gateway, which follows the store's promoted version
   (``GatewayConfig.registry``); the loop loads each candidate into the same server as
   ``{name}-v{N}`` (``VLLMServing``). ``--serving local`` (or a vLLM that cannot start)
   serves in process instead (``LocalServing``, calls captured by ``StoreSink``), and the
   output says so;
3. **traffic**: users' library tasks with verifiable outcomes played through the agent
   (``examples.library_service.play_traffic``): calls, HTTP recordings, verifier rewards and the
   task go into the store; a round of traffic before every cycle;
4. **the loop**: ``ContinualLoop.step`` per cycle (claim, shadow replays, one SEED update,
   load, canary, gate). One cycle is a **forced regression**: the bench claims its
   sessions and registers, through the store's own ``finish_training``, an adapter whose
   LoRA weights are random (std ``--regression-std``), so the loop resumes that cycle at
   ``trained`` and loads, evaluates and decides it exactly as it does a trained one;
5. **figures**: traffic success per serving version, candidates promoted and rejected with
   the gate's evidence, the forced regression's verdict, mutating requests that reached
   production from anything but traffic (must be 0), and the time from a session's reward
   to the promotion of a version trained on it. Printed, and written with
   ``bench.results.write_result("continual_demo", ...)``.

``--smoke``: a tiny random Llama (SmolLM2's tokenizer) instead of SmolLM2, small sizes; a
couple of minutes. A random model scores 0 on every task, and a gate comparing 0 with 0
rightly promotes anything (not worse), so a forced regression could not be seen; the smoke
therefore first teaches the tiny model the tasks' first turn (~25 s of supervised steps,
``teach_tiny_model``): it then succeeds, and a destroyed copy does not. The same holds for
SmolLM2-135M, which solved 0 of 12 canary episodes when measured here: on it the demo
runs, but every version scores 0 and the forced regression is promoted as "not worse"
(``--model taught-tiny`` keeps the full sizes with the taught tiny model).

**The atlas** (``--family atlas``, issue 22's continual demo): the same loop on the atlas tool
family (``configs/continual_atlas.yaml``: level 0, the first turn forced to call a tool),
SmolLM2-135M itself, the learning curve's settings (4 sessions x G=8 per cycle, LoRA r8,
lr 3e-4 without decay, T 0.5). Production is the atlas service (reads only, so "0 mutating
requests" holds by construction there; the library shows it with writes); users' sessions
are atlas training tasks, 4 at once; the canary is the 80 level-0 held-out tasks, greedy,
so v0's canary score is the curve's start. Nine cycles: eight trained (the curve's eight
updates) and the forced regression (cycle 2). At the end the last promoted version plays
the canary again beside v0: the paired difference with its 95% bootstrap interval over
tasks, the three levels per side (a call parsed, the right calls, the right answer), and
the gate's power at that size (``gate.gate_power``). Written to
``docs/results/continual_demo_atlas.json``.

    .venv/bin/python bench/continual_demo.py                 # SmolLM2-135M, vLLM + LoRA
    .venv/bin/python bench/continual_demo.py --model taught-tiny
    .venv/bin/python bench/continual_demo.py --smoke --results-dir runs/demo-results
    .venv/bin/python bench/continual_demo.py --family atlas --note "nothing else ran"
    .venv/bin/python bench/continual_demo.py --family atlas --smoke --serving local --results-dir runs/demo-results

Everything is written in a temporary folder that is removed at the end, except the results
JSON (and, with ``--report FILE``, the store's HTML report).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Self

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results
from seed_agents.app.continual_config import ContinualConfig
from seed_agents.store import RewardPolicy, TraceStore

ROOT = Path(__file__).resolve().parents[1]
UNMARKED = "unmarked"
# issue 12 asks for SmolLM2 on CPU; the paper trains Qwen2.5 models on GPUs with G=8
PAPER = {"model": "Qwen2.5-3B-Instruct", "group_size": 8}
LABELS = {"model": "model", "group_size": "G"}
GOAL_GAIN = 0.10  # issue 22: the last promoted version's canary success >= v0's + 10 points, CI excluding 0


# ----------------------------------------------------------------------------- families


@dataclass(frozen=True)
class Family:
    """What the demo needs of a task family: its loop config, its production service (an
    app whose ``state.log`` counts requests by origin), the users' tasks and their verifier."""

    config: Path
    production: Callable[[], Any]  # a FastAPI app with ``app.state.log``
    traffic_tasks: Callable[[], list[dict[str, Any]]]
    reward: Callable[[], Callable[[Any, dict[str, Any]], float]]
    writes: bool  # the service has mutating operations (so "0 mutating requests" is evidence)
    return_loans: bool  # the library's members bring borrowed books back between sessions
    traffic_concurrency: int
    cycles: int
    traffic: int | None  # None: the config's sessions_per_cycle
    smoke_traffic: int
    smoke_model: str


def _library_app() -> Any:
    from examples.library_service import create_app

    return create_app()


def _library_tasks() -> list[dict[str, Any]]:
    from examples.library_service import LIBRARY_TASKS

    return list(LIBRARY_TASKS)


def _library_reward() -> Callable[[Any, dict[str, Any]], float]:
    from examples.library_service import library_reward

    return library_reward


def _atlas_app() -> Any:
    from examples.atlas_service import create_app
    from examples.library_service import log_requests

    return log_requests(create_app())


def _atlas_tasks() -> list[dict[str, Any]]:
    """The level-0 training tasks (places disjoint from the canary's), in the generator's order."""
    from examples.atlas_tasks import make_tasks

    return [t.model_dump(mode="json") for t in make_tasks("train", levels=[0])]


def _atlas_reward() -> Callable[[Any, dict[str, Any]], float]:
    from examples.atlas_service import atlas_reward

    return atlas_reward


FAMILIES = {
    "library": Family(config=ROOT / "configs" / "continual_demo.yaml", production=_library_app,
                      traffic_tasks=_library_tasks, reward=_library_reward, writes=True, return_loans=True,
                      traffic_concurrency=1, cycles=3, traffic=6, smoke_traffic=4, smoke_model="taught-tiny"),
    # 8 trained cycles of 4 tasks x 8 replays: the learning curve's 8 updates, plus the forced regression;
    # its users never write (every atlas operation is a read), so traffic plays 4 sessions at once
    "atlas": Family(config=ROOT / "configs" / "continual_atlas.yaml", production=_atlas_app,
                    traffic_tasks=_atlas_tasks, reward=_atlas_reward, writes=False, return_loans=False,
                    traffic_concurrency=4, cycles=9, traffic=None, smoke_traffic=2, smoke_model="tiny"),
}


# ----------------------------------------------------------------------------- settings


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--family", choices=tuple(FAMILIES), default="library",
                   help="library: the demo library (reads and writes; SmolLM2 solves none of it); atlas: the atlas tool "
                        "family (reads only), SmolLM2-135M itself, the learning curve's settings (configs/continual_atlas.yaml).")
    p.add_argument("--smoke", action="store_true", help="A tiny model and small sizes (~2-4 min).")
    p.add_argument("--config", type=Path, help="ContinualConfig YAML the run starts from (default: the family's).")
    p.add_argument("--serving", choices=("vllm", "local"), default="vllm",
                   help="vllm: the CPU vLLM server with runtime LoRA behind the capture gateway; local: in process.")
    p.add_argument("--model", choices=("smollm2", "taught-tiny", "tiny"),
                   help="smollm2: SmolLM2-135M-Instruct (default); taught-tiny (library only): the smoke's tiny model "
                        "taught the tasks (default with --smoke). SmolLM2-135M solves ~none of the library's tasks, and a "
                        "gate cannot tell a destroyed model from one that scores 0; tiny: an untaught tiny random model "
                        "(the atlas smoke's: it scores 0, so the forced regression is inconclusive, not rejected).")
    p.add_argument("--cycles", type=int, help="Loop cycles, the forced regression included (default: library 3, atlas 9; "
                                              "atlas smoke 3).")
    p.add_argument("--regression-cycle", type=int, default=2, help="Which cycle (1-based) is the forced regression.")
    p.add_argument("--regression-std", type=float, default=0.5, help="Std of the forced regression's random LoRA weights.")
    p.add_argument("--traffic", type=int, help="Traffic sessions per round, one round before each cycle (default: library "
                                               "6, smoke 4; atlas the config's sessions_per_cycle, smoke 2).")
    p.add_argument("--canary", type=int, help="Only the first N canary tasks of the config's set (default: all; atlas "
                                              "smoke 8).")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report", type=Path, help="Also write the store's HTML report (seed-agents report) here.")
    p.add_argument("--note", default="", help="What else ran on the machine (it shapes the wall times).")
    bench_results.add_results_args(p)
    args = p.parse_args(argv)
    family = FAMILIES[args.family]
    args.config = args.config or family.config
    args.model = args.model or (family.smoke_model if args.smoke else "smollm2")
    if args.model == "taught-tiny" and args.family != "library":
        p.error("--model taught-tiny teaches the library's tasks; use --model tiny with --family atlas")
    args.cycles = args.cycles or (3 if args.smoke else family.cycles)
    args.traffic = args.traffic or (family.smoke_traffic if args.smoke else family.traffic)
    args.canary = args.canary or (8 if args.smoke and args.family == "atlas" else None)
    if not 1 <= args.regression_cycle <= args.cycles:
        p.error(f"--regression-cycle must be within 1..{args.cycles}")
    if args.canary is not None and args.canary < 1:
        p.error("--canary must be >= 1")
    if not args.config.is_file():
        p.error(f"--config {args.config}: no such file")
    return args


def demo_config(args: argparse.Namespace, work: Path, model_dir: str, prod_url: str, vllm_url: str | None) -> ContinualConfig:
    """The YAML's loop, pointed at this run's store, folders, production and server."""
    raw = yaml.safe_load(args.config.read_text())
    raw.update(store=f"sqlite:///{work / 'traces.db'}", out=str(work / "run"), seed=args.seed)
    backend = {**raw.get("backend", {}), "tokenizer": model_dir, "weights": model_dir}
    if vllm_url is not None:
        backend.update(kind="vllm", model="base", base_url=vllm_url, timeout_s=600)
    else:
        backend.update(kind="local", model=model_dir)
    raw["backend"] = backend
    raw["agent"]["tools"]["base_url"] = prod_url
    raw["agent"]["spec"] = None
    canary = Path(raw["canary"]["tasks"])
    canary = canary if canary.is_absolute() else ROOT / canary
    if args.canary is not None:  # the first N tasks of the set
        lines = [line for line in canary.read_text(encoding="utf-8").splitlines() if line.strip()][:args.canary]
        canary = work / "canary.jsonl"
        canary.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    raw["canary"]["tasks"] = str(canary)
    if args.smoke:  # same loop, smaller: tiny completions, G=2, one seed per canary task
        raw.update(sessions_per_cycle=2, group_size=2)
        raw["sampling"] = {**raw.get("sampling", {}), "max_tokens": 64}
        raw["skills"] = {**raw.get("skills", {}), "max_tokens": 24}
        raw["trainer"] = {**raw.get("trainer", {}), "gradient_checkpointing": False}
        raw["canary"]["seeds"] = 1
        raw["agent"]["max_turns"] = 2
    return ContinualConfig.model_validate(raw)


# --------------------------------------------------------------------------- the model


def answer_text(task: dict[str, Any]) -> str:
    """The first turn that solves a library task: the expected tool call, or the answer."""
    from seed_agents.tool_calls import format_tool_call

    expect = task["data"]["expect"]
    if "answer_contains" in expect:
        return f"The answer is {expect['answer_contains']}."
    return format_tool_call(expect["operation"], expect["args"])


def teach_tiny_model(model_dir: str, tools: list[Any], system_prompt: str | None, tasks: list[dict[str, Any]], *,
                     steps: int = 40, lr: float = 1e-2, seed: int = 0) -> dict[str, float]:
    """Supervised steps on (rendered first prompt -> ``answer_text``) for every task, saved
    in place: a stand-in for a pretrained model that can do the tasks (smoke only). The
    prompt is rendered as the agent renders it (``render_chat``, tools included). One
    right-padded batch, the LM head only on the completion positions, one thread (on a
    busy 2-core machine a second thread makes each step slower, not faster)."""
    import torch
    from langchain_core.messages import HumanMessage, SystemMessage
    from langchain_core.utils.function_calling import convert_to_openai_tool
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seed_agents.chat_model import render_chat

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    schemas = [convert_to_openai_tool(t) for t in tools]
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    rows = []
    for task in tasks:
        messages = [*([SystemMessage(system_prompt)] if system_prompt else []), HumanMessage(task["data"]["question"])]
        prompt, _ = render_chat(tokenizer, messages, schemas)
        rows.append((prompt, tokenizer(answer_text(task), add_special_tokens=False)["input_ids"] + [eos]))
    width = max(len(p) + len(c) for p, c in rows)
    ids_B_T = torch.full((len(rows), width), eos)
    mask_B_T = torch.zeros((len(rows), width), dtype=torch.long)
    where, targets = [], []  # (row, position predicting a completion token), that token
    for b, (prompt, completion) in enumerate(rows):
        seq = prompt + completion
        ids_B_T[b, :len(seq)] = torch.tensor(seq)
        mask_B_T[b, :len(seq)] = 1
        where += [(b, len(prompt) - 1 + i) for i in range(len(completion))]
        targets += completion
    rows_N, cols_N = (torch.tensor(x) for x in zip(*where, strict=True))
    targets_N = torch.tensor(targets)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss = torch.tensor(0.0)
    try:
        for _ in range(steps):
            optimizer.zero_grad()
            hidden_B_T_H = model.model(input_ids=ids_B_T, attention_mask=mask_B_T).last_hidden_state
            loss = torch.nn.functional.cross_entropy(model.lm_head(hidden_B_T_H[rows_N, cols_N]), targets_N)
            loss.backward()
            optimizer.step()
    finally:
        torch.set_num_threads(threads)
    model.save_pretrained(model_dir)
    return {"steps": steps, "final_loss": float(loss.detach())}


def destructive_adapter(weights: str, trainer: Any, out: Path, *, std: float, seed: int) -> Path:
    """A LoRA adapter shaped like the loop's (same rank, alpha, targets) whose weights are
    drawn at random: a deliberately destructive update for the gate to catch."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=trainer.lora_r, lora_alpha=trainer.lora_alpha,
                                             target_modules="all-linear", task_type="CAUSAL_LM"))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * std)
    model.save_pretrained(out)
    return out.resolve()


# --------------------------------------------------------------------------- serving


class ThreadedApp:
    """An ASGI app under uvicorn on a loopback port, in a daemon thread of this process."""

    def __init__(self, app: Any) -> None:
        import uvicorn

        from seed_agents.serve import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning",
                                                    access_log=False))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the gateway did not start")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_vllm(model_dir: str, work: Path, lora_rank: int) -> tuple[Any, str | None]:
    """(server, None) once the server answers and has loaded a LoRA adapter, else
    (None, why): the caller falls back to in-process serving and prints why."""
    from seed_agents.serve import (
        VLLMServer,
        VLLMServerError,
        vllm_available,
        vllm_python,
    )

    if not vllm_available():
        return None, f"vLLM is not importable from {vllm_python()} (scripts/setup.sh --with-vllm installs it)"
    server = VLLMServer(model_dir, served_model_name="base", work_dir=work / "vllm", max_lora_rank=max(16, lora_rank))
    server.start()
    try:
        server.wait_ready(timeout=900)
    except VLLMServerError as e:
        server.stop()
        return None, f"the vLLM server did not start: {str(e).splitlines()[0]}"
    return server, None


# --------------------------------------------------------------------------- figures


def traffic_by_version(store: TraceStore, sids: list[str]) -> dict[str, dict[str, Any]]:
    """Traffic sessions grouped by the version that served them (the stamp on their calls)."""
    out: dict[str, list[float]] = {}
    for sid in sids:
        calls = store.calls(sid)
        versions = {c.policy_version for c in calls}
        key = f"v{min(versions)}" if len(versions) == 1 else "mixed"
        out.setdefault(key, []).append(store.session_reward(sid) or 0.0)
    return {k: {"sessions": len(v), "success": sum(r >= 1.0 for r in v) / len(v), "mean_reward": statistics.fmean(v)}
            for k, v in sorted(out.items())}


def decision_rows(store: TraceStore, name: str, forced: set[int]) -> list[dict[str, Any]]:
    """Every gate decision with its evidence, and which cycle made it."""
    by_decision = {c.decision_id: c for c in store.cycles(name) if c.decision_id is not None}
    rows = []
    for d in store.decisions(name):
        if d.actor != "gate":
            continue
        cycle = by_decision.get(d.decision_id)
        gate = d.evidence.get("gate", {})
        rows.append({"decision_id": d.decision_id, "cycle": cycle.cycle_id if cycle else None, "version": d.version,
                     "baseline": d.evidence.get("baseline"), "action": d.action,
                     "forced_regression": d.version in forced, "verdict": gate.get("verdict"),
                     "mean_diff": gate.get("mean_diff"), "ci_low": gate.get("ci_low"), "n_tasks": gate.get("n_tasks"),
                     "n_pairs": gate.get("n_pairs"), "candidate_mean": gate.get("candidate_mean"),
                     "promoted_mean": gate.get("promoted_mean"), "per_task": gate.get("per_task"),
                     "faults": gate.get("faults"), "reasons": gate.get("reasons"), "summary": d.summary,
                     "at": d.created_at})
    return rows


def reward_to_promotion(store: TraceStore, name: str, policy: RewardPolicy) -> list[dict[str, Any]]:
    """Per session trained into a promoted version: seconds from its (winning source's
    first) reward to the promotion decision."""
    decisions = {d.decision_id: d for d in store.decisions(name)}
    out = []
    for cycle in store.cycles(name):
        d = decisions.get(cycle.decision_id) if cycle.decision_id is not None else None
        if d is None or d.action != "promote":
            continue
        for sid in store.cycle_sessions(cycle.cycle_id, "trained"):
            rewards = [r for r in store.rewards(sid) if r.source == policy.precedence[0]] or store.rewards(sid)
            if rewards:
                out.append({"session": sid, "cycle": cycle.cycle_id, "version": d.version,
                            "seconds": d.created_at - min(r.created_at for r in rewards)})
    return out


def canary_by_version(decisions: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each version's canary means, in decision order: as the candidate of its own decision
    and as the baseline of later ones (a greedy canary should give one number per version;
    a spread is the serving's batch-dependent numerics)."""
    out: dict[str, list[float]] = {}
    for d in decisions:
        for version, mean in ((d["baseline"], d["promoted_mean"]), (d["version"], d["candidate_mean"])):
            if version is not None and mean is not None:
                out.setdefault(f"v{version}", []).append(mean)
    return dict(sorted(out.items(), key=lambda kv: int(kv[0][1:])))


def power_of(decisions: list[dict[str, Any]], n_tasks: int, gate: Any) -> dict[str, Any] | None:
    """The gate's resolution at this canary's size (``gate_power``), with the per-task paired
    differences' sd pooled over the trained candidates' decisions (the forced regression's
    would inflate it); None while no such difference was ever non-zero."""
    from seed_agents.continual.gate import gate_power

    diffs = [x for d in decisions if not d["forced_regression"] for x in (d["per_task"] or {}).values()]
    if len(diffs) < 2 or statistics.stdev(diffs) == 0:  # no discordant pair: nothing to size the noise by
        return None
    sd = statistics.stdev(diffs)
    return {**gate_power(sd, n_tasks, gate).model_dump(), "pooled_differences": len(diffs)}


def final_check(loop: Any, store: TraceStore, cfg: ContinualConfig, version: int) -> dict[str, Any]:
    """The last promoted version against v0 on the whole canary (both played again, nothing
    stored): the mean paired difference over tasks with its two-sided 95% percentile
    bootstrap interval (``decide`` at confidence 0.975 gives its 2.5% and 97.5% quantiles),
    and for the atlas the three levels per side, so a format gain reads apart from a
    competence gain."""
    from seed_agents.continual.canary import split_sides
    from seed_agents.continual.gate import GateConfig, decide

    versions = {v.version: v for v in store.model_versions(cfg.name)}
    decision, episodes = loop.evaluate(versions[0], versions[version])
    ci = decide(*split_sides(episodes), GateConfig(confidence=0.975, margin=0.0, min_tasks=2, floor=None,
                                                    metric=cfg.gate.metric, seed=cfg.gate.seed))
    out: dict[str, Any] = {"version": version, "baseline": 0, "n_tasks": ci.n_tasks, "v0_mean": ci.promoted_mean,
                           "final_mean": ci.candidate_mean, "mean_diff": ci.mean_diff, "ci95": [ci.ci_low, ci.ci_high],
                           "faults": ci.faults, "gate_verdict": decision.verdict}
    tasks = {t.task_id: t for t in loop.canary_tasks}
    if all(t.data.get("calls") is not None for t in tasks.values()):  # the atlas: score the three levels
        out["levels"] = {side: atlas_levels([e for e in episodes if e.side == side and e.fault is None], tasks)
                         for side in ("promoted", "candidate")}
    return out


def atlas_levels(episodes: list[Any], tasks: dict[str, Any]) -> dict[str, float | int]:
    """``score_levels``' three rates over canary episodes, from what their traces kept: a
    call parsed (format), the calls the task needs made (tools), the right answer."""
    from examples.atlas_tasks import made_the_calls

    parsed = right_calls = right_answer = 0
    for e in episodes:
        made = []
        for call in e.trace.tool_calls:
            try:
                args = json.loads(call.args)
            except ValueError:  # cut by the trace's length limit: not comparable
                args = {}
            made.append({"name": call.name, "args": args if isinstance(args, dict) else {}})
        parsed += bool(made)
        right_calls += made_the_calls(tasks[e.task_id], made)
        right_answer += e.reward >= 1.0
    n = len(episodes)
    return {"episodes": n, "parsed": parsed / n if n else 0.0, "right_calls": right_calls / n if n else 0.0,
            "right_answer": right_answer / n if n else 0.0}


def summarize(values: list[float]) -> dict[str, float] | None:
    return {"min": min(values), "median": statistics.median(values), "max": max(values)} if values else None


# --------------------------------------------------------------------------- the run


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    started = bench_results.now()
    t_start = time.perf_counter()
    work = Path(tempfile.mkdtemp(prefix="continual-demo-"))
    say = lambda line: print(line, flush=True)
    try:
        results = run(args, work, say)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    results["wall_s"]["total"] = time.perf_counter() - t_start
    config_file = args.config.resolve()
    models = {"taught-tiny": "tiny random Llama, taught the tasks", "tiny": "tiny random Llama, untaught",
              "smollm2": "SmolLM2-135M-Instruct"}
    config = {**bench_results.config_of(args),
              "config": str(config_file.relative_to(ROOT)) if config_file.is_relative_to(ROOT) else config_file.name,
              "model": models[args.model], "group_size": results["loop_config"]["group_size"]}
    # the library demo keeps its file; the atlas's is issue 22's continual demo
    name = "continual_demo" if args.family == "library" else f"continual_demo_{args.family}"
    bench_results.write_result(name, config, results, paper=PAPER, labels=LABELS, started_at=started,
                               results_dir=args.results_dir)
    return results


def run(args: argparse.Namespace, work: Path, say: Any) -> dict[str, Any]:
    from examples.library_service import (
        LIBRARY_TASKS,
        DemoServer,
        OriginTransport,
        ViaGateway,
        play_traffic,
    )
    from seed_agents.app.continual import ContinualLoop
    from seed_agents.app.serving import LocalServing, VLLMServing
    from seed_agents.models import build_tiny_model, resolve_model
    from seed_agents.tools.openapi import OpenAPIToolsConfig, load_spec, openapi_tools

    wall: dict[str, float] = {}
    tick = time.perf_counter()
    family = FAMILIES[args.family]
    prod = DemoServer(family.production()).start()
    say(f"production {args.family} service on {prod.url}")
    server = gateway = gateway_store = None
    try:
        raw = yaml.safe_load(args.config.read_text())
        system_prompt = raw["agent"].get("system_prompt")
        teach: dict[str, float] | None = None
        if args.model == "taught-tiny":
            model_dir = build_tiny_model(work / "tiny-model", seed=args.seed)
            spec = load_spec(f"{prod.url}/openapi.json", allow_hosts=["127.0.0.1"], transport=OriginTransport("bench"))
            tools_cfg = OpenAPIToolsConfig.model_validate({**raw["agent"]["tools"], "base_url": prod.url})
            teach = teach_tiny_model(model_dir, openapi_tools(spec, tools_cfg), system_prompt, list(LIBRARY_TASKS),
                                     seed=args.seed)
            say(f"tiny model taught the tasks' first turn ({teach['steps']} steps, loss {teach['final_loss']:.3f})")
        elif args.model == "tiny":
            model_dir = build_tiny_model(work / "tiny-model", seed=args.seed)
            say("tiny random model, untaught: it solves nothing, so no version can be told from another")
        else:
            model_dir = resolve_model("smollm2-135m")
        wall["model"] = time.perf_counter() - tick

        tick = time.perf_counter()
        serving_note = None
        if args.serving == "vllm":
            server, serving_note = start_vllm(model_dir, work, int(raw.get("trainer", {}).get("lora_r") or 8))
            if serving_note:
                say(f"FALLBACK to in-process serving (LocalServing, no gateway): {serving_note}")
        else:
            serving_note = "--serving local"
        wall["serving_start"] = time.perf_counter() - tick
        cfg = demo_config(args, work, model_dir, prod.url, server.url if server else None)
        store = TraceStore.open(cfg.store)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        serving: Any = (VLLMServing(cfg.backend, tokenizer) if server
                        else LocalServing(model_dir, tokenizer, max_batch_size=cfg.backend.max_batch_size))
        lines: list[str] = []
        loop = ContinualLoop(cfg, store=store, serving=serving, log=say)
        name = cfg.name
        if server:
            from seed_agents.gateway.app import build_app
            from seed_agents.gateway.config import GatewayConfig, RegistryConfig, SecurityConfig
            from seed_agents.gateway.upstream import Upstream

            gateway_store = TraceStore.open(cfg.store)
            # The verifier's rewards need a verifier key (a reward's source is what its key
            # allows); the keys live in this process only, never in a file.
            keys = {role: secrets.token_urlsafe(24) for role in ("client", "verifier", "feedback")}
            gw_cfg = GatewayConfig(upstream=server.url, model=name, upstream_model="base", tokenizer=model_dir,
                                   registry=RegistryConfig(name=name, refresh_s=0.0), upstream_timeout_s=600,
                                   security=SecurityConfig(client_keys=[keys["client"]], verifier_keys=[keys["verifier"]],
                                                           feedback_keys=[keys["feedback"]]))
            app = build_app(gw_cfg, gateway_store, Upstream(server.url, "base", retries=1, timeout_s=600),
                            tokenizer=tokenizer)
            gateway = ThreadedApp(app).__enter__()
            say(f"vLLM {server.url} (LoRA) behind the capture gateway {gateway.url}; agents call {name!r}")

        def users() -> Any:
            """The agent's model for one traffic round: through the gateway (which serves the
            promoted version), or in process on the promoted version's backend."""
            if gateway is not None:
                return ViaGateway(gateway.url, name, temperature=cfg.sampling.temperature,
                                  max_tokens=cfg.sampling.max_tokens, client_key=keys["client"],
                                  verifier_key=keys["verifier"], feedback_key=keys["feedback"])
            from seed_agents.chat_model import SeedChatModel

            promoted = store.promoted_version(name)
            return SeedChatModel(backend=serving.backend(promoted), tokenizer=tokenizer, sampling=cfg.sampling,
                                 model_name=name)

        traffic_sids: list[str] = []
        traffic_tasks, reward = family.traffic_tasks(), family.reward()
        per_round = args.traffic or cfg.sessions_per_cycle
        rounds: list[dict[str, Any]] = []
        forced_versions: set[int] = set()
        outcomes: list[dict[str, Any]] = []
        wall.update(traffic=0.0, cycles=0.0)
        for k in range(1, args.cycles + 1):
            tick = time.perf_counter()
            serving_version = store.promoted_version(name).version  # type: ignore[union-attr]
            sids = asyncio.run(play_traffic(store, users(), prod.url, work / "recordings", sessions=per_round,
                                            max_turns=cfg.agent.max_turns, system_prompt=cfg.agent.system_prompt,
                                            start=(k - 1) * per_round, tasks=traffic_tasks, reward=reward,
                                            tool_choices=cfg.agent.tool_choices(), return_loans=family.return_loans,
                                            concurrency=family.traffic_concurrency))
            traffic_sids += sids
            wins = sum((store.session_reward(s) or 0.0) >= 1.0 for s in sids)
            rounds.append({"round": k, "promoted": serving_version, "played": per_round, "sessions": len(sids),
                           "successes": wins,
                           "wall_s": time.perf_counter() - tick})
            wall["traffic"] += time.perf_counter() - tick
            faulted = f" ({per_round - len(sids)} faulted: not rewarded)" if len(sids) < per_round else ""
            say(f"traffic round {k}: {len(sids)} sessions{faulted} served by v{serving_version}, {wins} succeeded")

            tick = time.perf_counter()
            forced_cycle = k == args.regression_cycle
            outcome = forced_regression(loop, store, cfg, model_dir, args, forced_versions) if forced_cycle else loop.step()
            if outcome is not None:
                lines.append(("FORCED REGRESSION " if forced_cycle else "") + outcome.line())
                say(lines[-1])
            wall["cycles"] += time.perf_counter() - tick
            if outcome is not None:
                outcomes.append({"cycle": outcome.cycle_id, "forced_regression": outcome.candidate_version in forced_versions,
                                 "state": outcome.state, "sessions": outcome.sessions, "unusable": outcome.unusable,
                                 "replays": outcome.replays, "replay_reward": outcome.replay_reward,
                                 "base_version": outcome.base_version, "candidate_version": outcome.candidate_version,
                                 "verdict": outcome.decision.verdict if outcome.decision else None,
                                 "serving_after": outcome.serving, "wall_s": outcome.wall_s})

        # ---- figures, from the store and the production service's own log
        decisions = decision_rows(store, name, forced_versions)
        latency = reward_to_promotion(store, name, loop.policy)
        by_origin = prod.log.by_origin()
        users_and_setup = ("traffic", "members", "bench")
        mutating_from_training = prod.log.mutating(exclude=users_and_setup)
        forced = [d for d in decisions if d["forced_regression"]]
        final_version = store.promoted_version(name).version  # type: ignore[union-attr]
        tick = time.perf_counter()
        final = final_check(loop, store, cfg, final_version) if final_version != 0 else None
        wall["final_check"] = time.perf_counter() - tick
        results: dict[str, Any] = {
            "family": args.family,
            "service_writes": family.writes,
            "serving": "vllm+gateway" if server else "local",
            "serving_note": serving_note,
            "teach": teach,
            "loop_config": {"sessions_per_cycle": cfg.sessions_per_cycle, "group_size": cfg.group_size,
                            "canary_tasks": len(loop.canary_tasks), "canary_seeds": cfg.canary.seeds,
                            "gate": cfg.gate.model_dump(), "learning_rate": cfg.trainer.learning_rate,
                            "lora_r": cfg.trainer.lora_r, "max_tokens": cfg.sampling.max_tokens,
                            "max_turns": cfg.agent.max_turns},
            "traffic_rounds": rounds,
            "traffic_by_version": traffic_by_version(store, traffic_sids),
            "cycles": outcomes,
            "decisions": decisions,
            "promoted": [d["version"] for d in decisions if d["action"] == "promote"],
            "rejected": [d["version"] for d in decisions if d["action"] == "reject"],
            "forced_regression": forced[0] if forced else None,
            "production_requests": {"by_origin": by_origin, "mutating_from_training": mutating_from_training,
                                    "mutating_from_traffic": prod.log.mutating(origin="traffic")},
            "reward_to_promotion_s": {"sessions": latency, "summary": summarize([x["seconds"] for x in latency])},
            "queue": store.queue_lengths(loop.policy).model_dump(),
            "final_promoted": final_version,
            "canary_by_version": canary_by_version(decisions),
            "gate_power": power_of(decisions, len(loop.canary_tasks), cfg.gate),
            "final_check": final,
            "loop_lines": lines,
            "wall_s": wall,
        }
        print_figures(results, say)
        if args.report:
            from seed_agents.observe.report import build_report, write_report

            write_report(build_report(store, store_label="continual demo"), args.report)
            say(f"report written to {args.report}")
        loop.close()
        if isinstance(serving, VLLMServing):
            serving.close()
        return results
    finally:
        if gateway is not None:
            gateway.__exit__(None, None, None)
        if gateway_store is not None:
            gateway_store.close()
        if server is not None:
            server.stop()
        prod.stop()


def forced_regression(loop: Any, store: TraceStore, cfg: ContinualConfig, model_dir: str, args: argparse.Namespace,
                      forced_versions: set[int]) -> Any:
    """Claim this cycle's sessions, register a random adapter as its candidate through
    ``finish_training`` (the sessions marked unusable: nothing was learned from them), and
    let the loop resume the cycle at ``trained``: load, canary, gate, as for any candidate."""
    promoted = store.promoted_version(cfg.name)
    assert promoted is not None
    started = store.start_cycle(cfg.name, base_version=promoted.version, limit=cfg.sessions_per_cycle,
                                policy=loop.policy, metadata={"forced_regression": True})
    if started is None:
        print("forced regression: no session waiting, skipped", flush=True)
        return None
    cycle, sids = started
    path = destructive_adapter(model_dir, cfg.trainer, cfg.out / "adapters" / f"cycle-{cycle.cycle_id}",
                               std=args.regression_std, seed=args.seed)
    why = "the demo's forced regression: a random adapter, not trained on this session"
    _, version = store.finish_training(cycle.cycle_id, path=str(path), unusable={s: why for s in sids},
                                       metadata={"forced_regression": f"random LoRA weights, std {args.regression_std}"})
    forced_versions.add(version.version)
    return loop.step()


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f}"


def print_figures(r: dict[str, Any], say: Any) -> None:
    say("")
    say(f"== continual demo: {r['serving']}" + (f" ({r['serving_note']})" if r["serving_note"] else ""))
    say("traffic served, by the version that served it:")
    for v, s in r["traffic_by_version"].items():
        say(f"  {v:>6}: {s['sessions']:3d} sessions, success {s['success']:.0%}")
    say("gate decisions:")
    for d in r["decisions"]:
        tag = " [forced regression]" if d["forced_regression"] else ""
        say(f"  v{d['version']} vs v{d['baseline']}: {d['action'].upper()}{tag}: canary {_num(d['candidate_mean'])} vs "
            f"{_num(d['promoted_mean'])}; {d['summary'].split(': ', 2)[-1]}")
    say("canary mean per version (each time it was played): " + ", ".join(
        f"{v} {'/'.join(f'{m:.3f}' for m in ms)}" for v, ms in r["canary_by_version"].items()))
    gp = r["gate_power"]
    if not gp:
        say("gate power: not estimable (no trained candidate's canary differed from its baseline on any task)")
    else:
        say(f"gate power at {gp['n_tasks']} canary tasks (per-task difference sd {gp['sd']:.3f}, pooled over "
            f"{gp['pooled_differences']}): promotes with {gp['power']:.0%} probability a candidate better than "
            f"{gp['promotes_above']:+.3f}, rejects one worse than {gp['rejects_below']:+.3f}; a gain of "
            f"{gp['detectable_gain']:.3f} or more would show as an improvement")
    pr = r["production_requests"]
    say(f"production requests by origin: {json.dumps(pr['by_origin'])}")
    lat = r["reward_to_promotion_s"].get("summary")
    say("reward -> promoted version trained on it: " + (
        f"median {lat['median']:.0f} s (min {lat['min']:.0f}, max {lat['max']:.0f}) over "
        f"{len(r['reward_to_promotion_s']['sessions'])} sessions" if lat else "no promotion"))
    fc = r["final_check"]
    if fc and fc.get("levels"):
        for side, label in (("promoted", "v0"), ("candidate", f"v{fc['version']}")):
            lv = fc["levels"][side]
            say(f"canary levels {label}: call parsed {lv['parsed']:.0%}, right calls {lv['right_calls']:.0%}, "
                f"right answer {lv['right_answer']:.0%} ({lv['episodes']} episodes)")
    # the targets, last
    say("")
    if fc:
        lo, hi = fc["ci95"]
        met = fc["mean_diff"] is not None and fc["mean_diff"] >= GOAL_GAIN and lo is not None and lo > 0
        say(f"last promoted v{fc['version']} vs v0 on the canary ({fc['n_tasks']} tasks): {fc['v0_mean']:.3f} -> "
            f"{fc['final_mean']:.3f}, {fc['mean_diff']:+.3f}, 95% CI [{lo:+.3f}, {hi:+.3f}]; goal (>= +{GOAL_GAIN:.2f}, "
            f"CI excluding 0): {'met' if met else 'MISSED'}")
    else:
        say(f"last promoted vs v0: no version was promoted; goal (>= +{GOAL_GAIN:.2f}, CI excluding 0): MISSED")
    fr = r["forced_regression"]
    say(f"forced regression: {'v' + str(fr['version']) + ' ' + fr['action'] + 'ed' if fr else 'not run'}"
        + ("" if fr and fr["action"] == "reject" else " (MISSED: it must be rejected)"))
    writes = "" if r["service_writes"] else " (this service has no mutating operation: 0 by construction)"
    say(f"mutating requests from training replays and canaries at production: {pr['mutating_from_training']}{writes}")


if __name__ == "__main__":
    main()
