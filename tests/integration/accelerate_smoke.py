"""SEEDTrainer under ``accelerate launch``: a tiny model, a few real optimizer steps per rank.

Run by ``test_accelerate.py`` (not collected itself: no ``test_`` prefix). By hand, from the
repo root on a CPU-only machine::

    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \
        --dynamo_backend no tests/integration/accelerate_smoke.py OUT.json [--model-dir DIR] \
        [--steps N] [--broken-rank R]

``--multi_gpu`` only picks accelerate's torchrun launcher; with ``use_cpu=True`` every rank
joins a gloo group (MULTI_CPU). ``--cpu`` would pick the simple launcher, which starts a
single process unless it is given an mpirun hostfile.

Each rank gets its own slice of TRL's generation batch, collapses it into tasks and plays
G episodes per task on its own ``LocalBackend`` (sharing that rank's model), so groups are
complete per rank; DDP averages the gradients. Ranks sample with different seeds, so their
rollouts differ and identical weights afterwards show the gradient all-reduce, not luck.
Rank 0 writes OUT.json with per-rank digests gathered from every rank.

``--broken-rank R`` makes every env on rank R fail at reset (all faults, over the budget):
the run must then fail fast on R's error, never leave the other ranks hanging.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from datetime import timedelta
from pathlib import Path

import datasets
import torch
import torch.distributed as dist
from accelerate.utils import gather_object
from transformers import AutoModelForCausalLM, AutoTokenizer

from seed_agents.backends.local import LocalBackend
from seed_agents.chat_model import SeedChatModel
from seed_agents.envs import EnvObservation
from seed_agents.graphs.env_agent import build_env_agent
from seed_agents.graphs.hindsight import with_hindsight
from seed_agents.models import build_tiny_model
from seed_agents.runner import EpisodeRunner, RunnerConfig
from seed_agents.testing import SKILL_JSON, FakeBackend, ParityEnv
from seed_agents.trainers.rollout import GraphRollout
from seed_agents.trainers.seed_trainer import RolloutBatch, SEEDConfig, SEEDTrainer
from seed_agents.types import SamplingParams, Task

G = 4  # episodes per task
TASKS_PER_RANK = 2
COLLECTIVE_TIMEOUT_S = 120  # a rank stuck in a collective fails the run instead of hanging


class BrokenEnv(ParityEnv):
    def reset(self) -> EnvObservation:
        raise RuntimeError("this rank's environment is down")


class RecordingRollout:
    """Wraps a rollout and remembers what this rank played, for the report."""

    def __init__(self, inner: GraphRollout) -> None:
        self.inner = inner
        self.iterations: list[dict] = []

    def collect(self, tasks: list[Task], group_size: int, iteration: int) -> RolloutBatch:
        batch = self.inner.collect(tasks, group_size, iteration)
        tokens = json.dumps([r.completion_ids for r in batch.rows]).encode()
        self.iterations.append({"iteration": iteration, "tasks": sorted(t.task_id for t in tasks),
                                "episodes": len(batch.trajectories), "rows": len(batch.rows),
                                "groups": len({r.group_id for r in batch.rows}),
                                "completions_sha256": hashlib.sha256(tokens).hexdigest()})
        return batch


def param_digest(model: torch.nn.Module) -> dict[str, object]:
    h = hashlib.sha256()
    total = 0.0
    for name, p in sorted(model.named_parameters()):
        t = p.detach().to("cpu", torch.float32).contiguous()
        h.update(name.encode())
        h.update(t.numpy().tobytes())
        total += t.double().sum().item()
    return {"sha256": h.hexdigest(), "sum": total}


def main(out_json: str, model_dir: str | None = None, steps: int = 2, broken_rank: int | None = None) -> None:
    out = Path(out_json).parent
    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        # Our own group, only for its timeout: on CPU, TrainingArguments drops ddp_timeout
        # and gloo would wait 30 min. Accelerate adopts an existing group.
        dist.init_process_group("gloo", timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    args = SEEDConfig(
        output_dir=str(out / "trainer"), per_device_train_batch_size=TASKS_PER_RANK * G, num_generations=G,
        max_steps=steps, learning_rate=1e-2, use_cpu=True, bf16=False, report_to=[], logging_steps=1,
        save_strategy="no", disable_tqdm=True, seed=0,
    )
    state = args.distributed_state  # the process group exists from here on
    rank, world = state.process_index, state.num_processes

    if model_dir is None:
        model_dir = str(out / "tiny-model")
        with state.main_process_first():  # rank 0 writes it, the others then read it
            if not (Path(model_dir) / "config.json").is_file():
                build_tiny_model(model_dir, seed=0)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)

    # -- rollouts: this rank's own backend on this rank's copy of the policy ----------------
    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=8)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=SamplingParams(max_tokens=6, temperature=1.0))
    analyzer = SeedChatModel(backend=FakeBackend(tokenizer, SKILL_JSON), tokenizer=tokenizer)
    graph = with_hindsight(build_env_agent(llm, max_turns=1), analyzer)
    env_cls = BrokenEnv if rank == broken_rank else ParityEnv
    runner = EpisodeRunner(graph, RunnerConfig(progress=False, concurrency=8), make_env=lambda t: env_cls())
    rollout = RecordingRollout(GraphRollout(runner, llm, skills="external", merge_rows=False,
                                            out_dir=out / f"run-rank{rank}"))  # one writer per file

    # enough distinct tasks for every rank to get TASKS_PER_RANK new ones on every step
    n_tasks = TASKS_PER_RANK * world * steps
    ds = datasets.Dataset.from_list([{"prompt": Task(task_id=f"t{i}").model_dump_json()} for i in range(n_tasks)])
    trainer = SEEDTrainer(model=model, args=args, train_dataset=ds, rollout=rollout, processing_class=tokenizer)
    # Trainer seeded every rank alike; the prompts are alike too, so sample per rank.
    torch.manual_seed(1000 + rank)

    before = param_digest(model)
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    after = param_digest(trainer.model)

    mine = {"rank": rank, "steps": trainer.state.global_step, "params_changed": after["sha256"] != before["sha256"],
            "param_sha256": after["sha256"], "param_sum": after["sum"], "train_s": round(train_s, 2),
            "iterations": rollout.iterations}
    ranks = gather_object([mine])  # every rank calls it: a collective
    if trainer.accelerator.is_main_process:
        logs = [e for e in trainer.state.log_history if "loss" in e or "reward" in e]
        report = {"world_size": world, "distributed_type": str(state.distributed_type), "backend": state.backend,
                  "steps": trainer.state.global_step, "params_changed": all(r["params_changed"] for r in ranks),
                  "param_sha256": [r["param_sha256"] for r in ranks], "param_sum": [r["param_sum"] for r in ranks],
                  "ranks": ranks, "log_history": logs}
        Path(out_json).write_text(json.dumps(report, indent=2))
    trainer.accelerator.wait_for_everyone()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out_json", help="Report written by rank 0.")
    p.add_argument("--model-dir", help="A tiny model folder (default: built next to OUT.json).")
    p.add_argument("--steps", type=int, default=2, help="Optimizer steps.")
    p.add_argument("--broken-rank", type=int, help="Rank whose envs all fail (no trainable rows).")
    a = p.parse_args()
    main(a.out_json, a.model_dir, a.steps, a.broken_rank)
