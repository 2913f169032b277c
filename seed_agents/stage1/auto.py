"""Stage 1 on demand: the cached stage-1 model a SEED training run starts from.

``seed-agents train`` calls ``stage1_model(cfg)``. When stage 1 applies (``stage1.run:
auto``, SEED's own skills, an env suite that offers an offline analyzer, the local
backend) it returns the folder of a model that is ``backend.model`` after skill SFT,
building it first when no cached copy exists: ``skills collect`` with the suite's offline
analyzer (``EnvSuite.offline_analyzer()``: TextWorld's and ALFWorld's are rule-based) on
the base policy's episodes, then ``skills sft``. The cache key covers every setting that changes the result, so a
changed setting builds a new model instead of reusing a stale one. A finished build is
marked by a ``DONE`` file written last; an interrupted build resumes (collect is
resumable) or restarts its SFT, and a file lock keeps two runs from building it twice.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from seed_agents.config import TrainConfig
from seed_agents.envs import EnvSuite
from seed_agents.models import cache_dir

STAGE1_RECIPE = 3  # bump when the recipe changes in a way the settings below do not show
# (2: the offline analyzer's failure rules stopped quoting the failed commands; 3: the SFT's loss
# sums over the completion rows only, the same loss in another rounding order)


def applies(cfg: TrainConfig, suite: EnvSuite | None = None) -> tuple[bool, str]:
    """(stage 1 runs, why or why not). ``suite``: the run's env suite (default: loaded
    from ``cfg.env``, only when every other condition holds)."""
    if cfg.stage1.run == "off":
        return False, "stage1.run is off"
    if cfg.skills.source != "self":
        return False, f"skills.source is {cfg.skills.source!r} (stage 1 trains the policy's own analyzer)"
    if cfg.store is not None:
        return False, "training on stored sessions starts from the weights that served them (backend.weights)"
    if cfg.graph is not None:
        return False, ("a graph has no env suite to analyze its episodes offline; build a stage-1 model with "
                       "`seed-agents skills collect --analyzer openai ...` and `skills sft`, then set backend.weights")
    if cfg.backend.kind != "local":
        return False, ("a vLLM server serves its own weights; build the stage-1 model with `seed-agents skills collect` "
                       "+ `skills sft` and serve it")
    if cfg.backend.weights is not None:
        return False, "backend.weights is set (the run starts from those weights)"
    if suite is None:
        from seed_agents.preflight import load_suite

        suite = load_suite(cfg.env, seed=cfg.seed, options=cfg.env_options)
    if suite.offline_analyzer() is None:
        return False, (f"the env {cfg.env!r} offers no offline analyzer (EnvSuite.offline_analyzer); build a stage-1 "
                       f"model with `seed-agents skills collect --analyzer openai ...` and `skills sft`, then set "
                       f"backend.weights")
    return True, f"SEED on {cfg.env} with its offline analyzer and the local backend"


def cache_key(cfg: TrainConfig, base: str) -> str:
    s = cfg.stage1
    settings = {
        "recipe": STAGE1_RECIPE, "base": os.path.realpath(base), "env": cfg.env, "split": cfg.split,
        "env_options": cfg.env_options, "num_tasks": s.num_tasks, "group_size": s.group_size,
        "temperature": s.temperature, "seed": s.seed, "max_tokens": cfg.sampling.max_tokens, "agent": cfg.agent.model_dump(),
        "epochs": s.epochs, "learning_rate": s.learning_rate, "lora_r": s.lora_r,
        "skill_words": [cfg.skills.min_words, cfg.skills.max_words], "skill_tokens": cfg.skills.max_tokens,
    }
    # the number format and the engine options change the collected episodes and the SFT by float
    # rounding; keyed only when not the default, so the models cached before keep their keys.
    # The format as resolved here: `auto` on a CPU without bf16 is fp32 and shares fp32's model.
    import torch

    from seed_agents.backends.engine import LocalEngineOptions
    from seed_agents.precision import resolve_attention, resolve_served

    dtype = resolve_served(cfg.backend.precision, "local")[0]  # stage 1's rollouts are a local backend's
    if dtype != torch.float32:
        settings["precision"] = str(dtype).removeprefix("torch.")
    if not s.completion_head:  # TRL's head: the same loss, another rounding
        settings["completion_head"] = False
    if cfg.skills.answer_format != "paper":  # stage 1 trains on the analyzer prompt the run will ask with
        settings["answer_format"] = cfg.skills.answer_format
    if cfg.skills.failures != "write":  # and only on the episodes it will be asked about
        settings["failures"] = cfg.skills.failures
    # a benchmark's engine options (seed_agents.backends.engine), under the keys the config gave
    # them; concat holds the dynamic cache's numbers bit for bit, so it shares its model
    engine = LocalEngineOptions.from_env().changed()
    settings.update({key: value for key, value in engine.items() if (key, value) != ("kv_cache", "concat")})
    # as resolved too: `auto` keys with the explicit choice it makes on this machine
    if resolve_attention(cfg.backend.attention, dtype)[0]:
        settings["attention"] = "float32"
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def default_cache_dir() -> Path:
    return cache_dir() / "stage1"


def stage1_model(cfg: TrainConfig, log: Any = print, suite: EnvSuite | None = None) -> Path | None:
    """The stage-1 model folder for ``cfg``, built if needed; None when stage 1 does not
    apply. ``suite``: the run's env suite (default: loaded from ``cfg.env``)."""
    ok, why = applies(cfg, suite)
    if not ok:
        if cfg.stage1.run == "auto" and cfg.skills.source == "self":
            log(f"stage 1 skipped: {why}")
        return None
    from filelock import FileLock

    from seed_agents.models import resolve_model

    base = resolve_model(cfg.backend.model)
    root = (cfg.stage1.cache_dir or default_cache_dir()) / cache_key(cfg, base)
    model_dir = root / "sft" / "model"
    if (root / "DONE").exists():
        log(f"stage 1: using the cached stage-1 model {model_dir}")
        return model_dir
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / ".lock")):
        if (root / "DONE").exists():  # built by another run while we waited
            return model_dir
        log(f"stage 1: no cached stage-1 model; collecting skills ({cfg.env}'s offline analyzer) and running SFT in {root}")
        summary = build(cfg, base, root, suite)
        (root / "DONE").write_text(json.dumps(summary, indent=2, default=str))
    return model_dir


def build(cfg: TrainConfig, base: str, root: Path, suite: EnvSuite | None = None) -> dict[str, Any]:
    """Collect with the offline analyzer, then SFT; returns both summaries."""
    import shutil

    from seed_agents.stage1.collect import CollectConfig, run_collect
    from seed_agents.stage1.sft import SFTRunConfig, run_sft

    s = cfg.stage1
    collect = CollectConfig.model_validate({
        "env": cfg.env, "split": cfg.split, "num_tasks": s.num_tasks, "seed": s.seed, "out": str(root / "collect"),
        "env_options": cfg.env_options,
        "backend": {"kind": "local", "model": base, "max_batch_size": cfg.backend.max_batch_size,
                    "precision": cfg.backend.precision, "attention": cfg.backend.attention},
        "sampling": {"max_tokens": cfg.sampling.max_tokens, "temperature": s.temperature},
        "runner": {"group_size": s.group_size, "concurrency": cfg.runner.concurrency, "progress": cfg.runner.progress},
        "agent": cfg.agent.model_dump(), "analyzer": {"kind": "rule_based"},
        "min_words": cfg.skills.min_words, "max_words": cfg.skills.max_words, "answer_format": cfg.skills.answer_format,
        "failures": cfg.skills.failures, "opening": cfg.skills.opening,  # a rule-based analyzer writes words either way
    })
    collected = run_collect(collect, suite=suite)
    shutil.rmtree(root / "sft", ignore_errors=True)  # a half-finished SFT starts over
    sft = SFTRunConfig.model_validate({
        "examples": [str(root / "collect" / "examples.jsonl")], "model": base, "out": str(root / "sft"),
        "epochs": s.epochs, "learning_rate": s.learning_rate, "lora_r": s.lora_r, "seed": s.seed,
        # the parse check generates under the same budget the analyzer gets in training
        "eval_max_tokens": cfg.skills.max_tokens, "max_eval_examples": 8, "precision": cfg.backend.precision,
        "completion_head": s.completion_head,
    })
    trained = run_sft(sft)
    return {"collect": collected, "sft": trained}
