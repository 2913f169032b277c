"""Does the agent get better? Held-out success over updates: the untrained policy, GRPO and SEED.

From one start (SmolLM2-135M-Instruct, a LoRA adapter), each method trains on the same atlas
tool tasks (``examples/atlas_tasks.py``, one level; the first turn forced to a tool call)
with the same seeds and budget, through ``seed-agents train`` itself (a graph run with a
periodic held-out evaluation), so the curve is the product's, not a re-implementation:

- ``grpo``: ``skills.source none`` (outcome RL only);
- ``seed``: the policy writes its own hindsight skills and the gated distillation term is on
  (the paper's lambda);
- ``seed-oracle``: SEED whose skills name the call the task needed, with its arguments, read
  from the task manifest (``bench.atlas_skills:OracleSkills`` as ``skills.chat_model``): not a
  method (no analyzer in training has the manifest) but the bound on what the distillation
  term can do at this scale with a skill the model can copy (its margin: +0.11 nat/token,
  docs/results/atlas_skills.json);
- ``seed-episode``: SEED whose skills are read off each episode by rule
  (``bench.atlas_skills:EpisodeSkills``): on a success the calls it made, on a failure the calls
  that did not answer. No manifest and no model: what one episode's hindsight can carry when
  it is written well, between the oracle and the policy's own skills;
- ``seed-success``: ``seed-episode`` with nothing on a failure (``failures: none``: the
  empty skill is rejected, so a failed episode's rows get no teacher). A failure's skill
  naming the failed call raises that call in a 135M teacher (docs/results/atlas_skills_episode.json),
  so this is the same hindsight without the half that pushes the wrong way. Its "skills parsed"
  counts each failure's empty skill as not parsed: read it as the share of episodes that got a teacher.
- ``seed-success-generic``: ``seed-success`` with one fixed sentence on every success, naming no
  tool, argument or answer (``atlas_skills.GENERIC_SUCCESS``): a control that tells the skill's
  content from distilling on successes at all.
- ``seed-success-imitate``: ``seed-success-generic`` with the gate off (``gate_sharpness`` 0:
  0.5 on every token, no teacher pass), so the term raises every sampled token of a successful
  episode at half the OPD weight: plain imitation of successes beside GRPO, the control that
  tells what the gate's per-token shape adds.

Every ``--eval-every`` updates (and before the first) the whole held-out set is played
greedily (disjoint places: a gain is a gain in using the tools, not a remembered fact) and
scored at three levels: a call parses (format), the right tool with the right arguments,
the right answer (what the reward pays for), so a format gain cannot pass for a competence
gain. Per update it keeps training success, the fraction of GRPO groups with zero reward
variance (no outcome gradient), the skill parse rate and the KL to the start.

Runs live under ``--work``; a killed benchmark resumes without redoing finished runs
(``seed-agents train --resume`` continues a run from its last checkpoint). A run starts with
the initial policy's held-out evaluation a run beside it already played, when nothing that
reaches it differs (``initial_eval_key``; ``--initial-eval own`` plays it in every run). Each finished
run's held-out scores (per task, per level, per evaluation) and per-update metrics are also
kept in the result file, keyed by a digest of its settings, tasks and the method's code
revision (``REVISIONS``: a fix that changes what a method does retires its runs): a later
invocation (another machine, a fresh checkout without ``runs/``) reads a run from there instead of
training it again, so SEED's seeds can be added beside GRPO's in another session and still
be paired with them. The result file is written after each run that trains (``pending`` in it
names the runs still to come), so a session that ends mid-invocation keeps its finished runs.
A run with the same digest in another ``learning_curve*.json`` of the results folder serves
as well (a variant pairs with the GRPO seeds the main curve trained; ``read_from`` in the file
names where each came from). It prints last:
each method's held-out answer success from start to end with 95% bootstrap CIs over seeds
and held-out tasks (tasks resampled within each seed, which the goal reads, and crossed: the
same task indices for every seed, the wider and right one when seeds share their tasks) and the
t interval over the seeds, GRPO's gain against the goal (>= +10 points, CI excluding 0), each
SEED variant minus GRPO paired by seed with its crossed CI, its tests, its Holm-adjusted p over
every SEED variant against GRPO in the results folder (``comparison_family``) and the seeds a
paired test needs. Writes
``docs/results/learning_curve.json`` and ``docs/results/learning_curve.png`` (``--result-name``
for another name, so a variant does not replace the main curve).

``--first-turn auto`` leaves the agent free to call a tool or answer; ``--guide-share``
then steers that share of each group's training episodes into a call at their first free
choice (guided openings, docs/training.md) while held-out episodes stay free: whether the
steering transfers to an agent left to choose is what the held-out curve then shows.
For ``--level 1`` (a lookup, then ``add``), where one forced turn is followed by an answer
in every episode (docs/results/atlas_band_levels12.json), ``--first-turn forced-two`` forces
the first two turns to a tool call and ``lookup-add`` to ``lookup`` then ``add`` (the
sequence scripted, the arguments and the answer the model's), training and held-out alike.

``--split validation`` plays the evaluations on the places every setting is chosen on, ``--split
test`` on those nothing was tuned on (seed_agents.tools.atlas); the default ``heldout`` is the set
past figures were both tuned and reported on. A headline comparison runs from a committed file
under bench/preregistered/ (``--preregistered``, bench/preregistration.py), which gives every
setting and whose commit the result file records.

    .venv/bin/python bench/learning_curve.py --note "nothing else ran"
    .venv/bin/python bench/learning_curve.py --preregistered bench/preregistered/seed_success_vs_grpo_test.yaml
    .venv/bin/python bench/learning_curve.py --seeds 0 --methods grpo --updates 2 --tasks-per-update 1 \\
        --group 2 --heldout 4 --eval-every 1 --work runs/lc-smoke --results-dir runs/lc-smoke/results  # smoke
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, get_args

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: bench/ and examples/ are on the path
from bench.children import run_logged, stop_children_on_sigterm  # noqa: E402
from bench.preregistration import PREREGISTRATION_KEY, PreregistrationError, split_argv  # noqa: E402
from bench.preregistration import load as load_preregistration  # noqa: E402
from bench.results import add_results_args, config_of, now, write_result  # noqa: E402
from bench.stats import (claim_words, compare, crossed_bootstrap_ci, family_claims, paired_t,  # noqa: E402
                         paired_tests, seeds_needed)
from examples.atlas_tasks import BUILDERS  # noqa: E402
from seed_agents.types import AnswerFormat, SkillFailures, SkillOpening  # noqa: E402

METHODS = ("grpo", "seed", "seed-oracle", "seed-episode", "seed-success", "seed-success-generic", "seed-success-imitate")
ORACLE = {"source": "external", "chat_model": "bench.atlas_skills:OracleSkills", "chat_model_kwargs": {"style": "specific"}}
EPISODE = {"source": "external", "chat_model": "bench.atlas_skills:EpisodeSkills", "chat_model_kwargs": {"failures": "name"}}
SUCCESSES = {**EPISODE, "chat_model_kwargs": {"failures": "none"}}
GENERIC = {**EPISODE, "chat_model_kwargs": {"failures": "none", "successes": "generic"}}
SKILLS = {"seed-oracle": ORACLE, "seed-episode": EPISODE, "seed-success": SUCCESSES, "seed-success-generic": GENERIC,
          "seed-success-imitate": GENERIC, "seed": {"source": "self"}}
UNGATED = {"seed-success-imitate"}  # gate_sharpness 0: the teacher cannot move the gradient
# A digest names a run's settings and tasks, not the code that trained it. When a change of
# code changes what a method's runs do, its revision goes up: the digest then carries it, so
# runs trained before are not read back (here or from another file) as this code's.
#   seed 2: the policy's analyzer sees each forced call whole (908393e: episode_steps puts the
#           prefill back; before, every atlas first turn reached it mid-JSON)
#   seed 3: the skill grammar's first five words are words (at 64 tokens, 43 of a run's first
#           96 skills were cut mid-"word" such as "string.1.1.1.1"; 70 -> 127 of 128 parse)
REVISIONS = {"seed": 3}
LEVELS = ("parsed", "right_calls", "right_answer")
MIN_SEEDS = 3  # the CI is over seeds as well as held-out tasks
AGENT_MAX_TURNS = 4  # examples.atlas_tasks.build_agent's default; `train` builds the graph with it
GOAL = 0.10  # GRPO: held-out answer success up by >= 10 points, 95% CI excluding 0 (issue 22)
PAPER = {"model": "Qwen2.5-3B-Instruct", "updates": 150, "tasks_per_update": 16, "group": 8, "max_turns": 30,
         "max_tokens": 512, "lr": 1e-6, "opd_coef": 0.01}
LABELS = {"model": "model", "updates": "updates", "tasks_per_update": "tasks/update", "group": "group size",
          "max_turns": "max turns", "max_tokens": "max response tokens", "lr": "learning rate",
          "opd_coef": "OPD weight (lambda)"}


# -- the runs ---------------------------------------------------------------------------

def write_tasks(work: Path, level: int, train: int | None, heldout: int | None,
                eval_split: str = "heldout") -> tuple[Path, Path, int, int]:
    """The level's training tasks and those of ``eval_split`` as JSONL (the generator's, which
    the committed manifests under bench/atlas/ are checked against)."""
    from examples.atlas_tasks import make_tasks

    files = []
    for split, n in (("train", train), (eval_split, heldout)):
        tasks = make_tasks(split, levels=[level])[:n]
        path = work / f"{split}-L{level}.jsonl"
        path.write_text("".join(t.model_dump_json() + "\n" for t in tasks), encoding="utf-8")
        files.append((path, len(tasks)))
    (train_path, n_train), (heldout_path, n_heldout) = files
    return train_path, heldout_path, n_train, n_heldout


def skill_opd_coef(args: argparse.Namespace) -> float:
    """The skill methods' OPD weight: ``--opd-coef``, else the paper's lambda."""
    from seed_agents.config.core import PAPER as COEF

    return COEF.lam if args.opd_coef is None else args.opd_coef


#: the key of a run's settings that holds the local backend's engine options
#: (seed_agents.backends.engine): part of the run's identity, given to `train` as its environment
ENGINE = "local_engine"


def train_config(args: argparse.Namespace, method: str, seed: int, tasks: Path, heldout: Path, n_train: int,
                 n_heldout: int, out: Path) -> dict[str, Any]:
    return {
        "num_tasks": n_train, "tasks_per_iteration": args.tasks_per_update, "iterations": args.updates, "seed": seed,
        "out": str(out),
        "graph": {"build": f"examples.atlas_tasks:{BUILDERS[args.first_turn]}",
                  "tasks": str(tasks), "reward": "examples.atlas_tasks:answer_reward"},
        "backend": {"kind": "local", "model": args.model, "max_batch_size": args.tasks_per_update * args.group,
                    # only when not fp32: the runs before keep their digests (and stored runs)
                    **({"precision": args.precision} if args.precision != "float32" else {}),
                    **({"attention": args.attention} if args.attention != "same" else {})},
        # the local backend's engine options (not config keys: run_one hands them to `train`
        # through the environment), only when asked for, so the digests stay
        **({ENGINE: {"kv_cache": args.kv_cache}} if args.kv_cache != "dynamic" else {}),
        "sampling": {"max_tokens": args.max_tokens, "temperature": args.temperature},
        "runner": {"group_size": args.group, "concurrency": args.tasks_per_update * args.group, "progress": False},
        "skills": {**SKILLS.get(method, {"source": "none"}),
                   "max_tokens": args.skill_tokens,
                   # only when moved: runs with the system block keep their digests (and stored runs)
                   **({"injector": args.injector} if args.injector != "system" and method != "grpo" else {}),
                   # only when not the paper's, and for the policy's own skills (the others read no prompt's example)
                   **({"answer_format": args.answer_format} if args.answer_format != "paper" and method == "seed" else {}),
                   **({"opening": args.skill_opening} if args.skill_opening != "words" and method == "seed" else {}),
                   **({"failures": args.skill_failures} if args.skill_failures != "write" and method == "seed" else {})},
        "trainer": {"learning_rate": args.lr, "lora_r": args.lora_r, "lora_alpha": 2 * args.lora_r,
                    "opd_coef": 0.0 if method == "grpo" else skill_opd_coef(args),
                    "kl_coef": args.kl_coef,
                    **({"gate_sharpness": 0.0} if method in UNGATED else {}),
                    # only when on: runs without it keep the digests (and stored runs) they had
                    **({"guide_share": args.guide_share} if args.guide_share else {}),
                    **({"lr_schedule": args.lr_schedule} if args.lr_schedule != "linear" else {}),
                    # only when on, and for the skill methods (GRPO has no teacher): digests stay
                    **({"fuse_teacher": True} if args.fuse_teacher and method != "grpo" else {})},
        "stage1": {"run": "off"},
        "eval": {"tasks": str(heldout), "num_tasks": n_heldout, "every": args.eval_every, "at_start": True,
                 "temperature": 0.0},
    }


#: settings whose default moved after runs were stored, at the default they had then. A run's
#: config names them only when not that default (its digest, and so the stored runs, stay);
#: the file `train` reads pins them, so a run computes what it computed when it was stored
#: (backend.precision and backend.attention became `auto`: bf16 on a CPU with bf16 instructions;
#: the schedule, guided openings and the failures' skills moved to what these curves found).
OLD_DEFAULTS: dict[str, dict[str, Any]] = {"backend": {"precision": "float32", "attention": "same"},
                                           "trainer": {"lr_schedule": "linear", "guide_share": 0.0},
                                           "skills": {"failures": "write"}}


def pinned(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` as `train` reads it: the moved defaults written out where it names none, the
    engine options left out (``engine_env``)."""
    config = {key: value for key, value in config.items() if key != ENGINE}
    return {**config, **{key: {**old, **config.get(key, {})} for key, old in OLD_DEFAULTS.items()}}


def engine_env(config: dict[str, Any]) -> dict[str, str]:
    """The environment that gives a run's `train` its engine options (the defaults too)."""
    from seed_agents.backends.engine import LocalEngineOptions

    return LocalEngineOptions(**config.get(ENGINE, {})).as_env()


def run_one(config: dict[str, Any], out: Path, log: Path, revision: int = 1) -> float:
    """Train one (method, seed) to the end, resuming a run a killed benchmark left; the
    seconds it took (this process's share). A finished run is not run again, unless its
    settings or its method's revision differ (then it is refused)."""
    identity = config if revision == 1 else {**config, "revision": revision}
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    done = out / "benchmark-done.json"
    if done.exists():
        record = json.loads(done.read_text())
        if record["config"] != digest:
            raise SystemExit(f"error: {out} finished with other settings or an older revision of its method; "
                             "move it away or use another --work")
        return float(record["wall_s"])
    cfg_path = out.parent / f"{out.name}.json"
    # `train` refuses a folder that holds a run unless resumed; a run killed before its first
    # checkpoint restarts at step 0 under --resume
    started = any((out / name).exists() for name in ("config.json", "metrics.jsonl", "trajectories.jsonl", "eval.jsonl"))
    written = pinned(config)
    if cfg_path.exists() and json.loads(cfg_path.read_text()) not in (config, written) and started:
        raise SystemExit(f"error: {out} was started with other settings; move it away or use another --work")
    cfg_path.write_text(json.dumps(written, indent=1))
    cmd = [sys.executable, "-m", "seed_agents", "train", "--config", str(cfg_path), "--out", str(out)]
    if started:
        cmd.append("--resume")
    returncode, wall = run_logged(cmd, log, engine_env(config))  # a stopped benchmark stops its training run
    if returncode != 0:
        raise SystemExit(f"error: training {out.name} failed (exit {returncode}); see {log}; rerun to resume")
    done.write_text(json.dumps({"config": digest, "wall_s": wall}))
    return wall


# The initial policy's held-out evaluation is the same in every run of a curve: the LoRA
# adapter starts as the identity (PEFT zeroes its B factor), the evaluation is greedy
# (temperature 0 draws no random number) and held-out episodes carry no skill, so a run's
# seed, method and training settings cannot reach it. Each run used to play it again (about 2
# of a run's ~22 min). A run whose sibling in --work already played it starts with a copy and
# `train --resume` keeps it (seed_agents.app.train.keep_initial_eval); every stored curve's
# runs agree at update 0 to the task, across seeds, methods and both CPUs, and
# tests/unit/test_train_cli.py checks two runs of other seeds and methods evaluate it alike.
INITIAL_EVAL_FROM = "initial-eval-from.json"


def initial_eval_key(config: dict[str, Any]) -> str | None:
    """What a run's initial held-out evaluation depends on: its settings without the seed,
    the folder, the update count, the trainer's and the skills' settings and the evaluation's
    period (model, backend, sampling, graph, tasks and runner stay). None when the evaluation
    samples (temperature above 0): then it is the run's own."""
    evaluation = config.get("eval") or {}
    if evaluation.get("temperature") != 0.0 or not evaluation.get("at_start"):
        return None
    same = {k: v for k, v in config.items() if k not in ("seed", "out", "iterations", "trainer", "skills")}
    same["eval"] = {k: v for k, v in evaluation.items() if k != "every"}
    return hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:16]


def _initial_lines(path: Path) -> list[str]:
    """The lines of a trace file that belong to the initial evaluation (iteration -1), as
    written; a line a running sibling is still writing is skipped."""
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if not isinstance(record, dict):
            continue
        if record.get("iteration", (record.get("metadata") or {}).get("iteration")) == -1:
            kept.append(line)
    return kept


def reuse_initial_eval(config: dict[str, Any], out: Path, work: Path) -> str | None:
    """Start the fresh run folder ``out`` with the initial evaluation a sibling under ``work``
    finished with the same ``initial_eval_key`` (its eval.jsonl row and the trajectories
    before it, copied line for line, the row last as `train` writes it); the sibling's name,
    or None (nothing to reuse, or ``out`` already holds something)."""
    key = initial_eval_key(config)
    if key is None or (out.exists() and any(out.iterdir())):
        return None
    for cfg_path in sorted(work.glob("*.json")):
        sibling = work / cfg_path.stem
        if sibling == out or not (sibling / "eval.jsonl").exists():
            continue
        try:
            other = json.loads(cfg_path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(other, dict) or initial_eval_key(other) != key:
            continue
        row, trajectories = _initial_lines(sibling / "eval.jsonl"), _initial_lines(sibling / "eval_trajectories.jsonl")
        if len(row) != 1 or len(trajectories) != json.loads(row[0]).get("episodes"):
            continue
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval_trajectories.jsonl").write_text("".join(x + "\n" for x in trajectories), encoding="utf-8")
        (out / "eval.jsonl").write_text(row[0] + "\n", encoding="utf-8")
        (out / INITIAL_EVAL_FROM).write_text(json.dumps({"run": sibling.name}))
        return sibling.name
    return None


# -- reading a run ----------------------------------------------------------------------

def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip()] if path.exists() else []


def heldout_scores(out: Path, heldout: Path) -> dict[int, dict[str, dict[str, bool]]]:
    """updates -> task id -> the three levels, from the run's held-out trajectories."""
    from examples.atlas_tasks import score_levels
    from seed_agents.types import Task, Trajectory

    tasks = {t["task_id"]: Task.model_validate(t) for t in read_jsonl(heldout)}
    scores: dict[int, dict[str, dict[str, bool]]] = {}
    for record in read_jsonl(out / "eval_trajectories.jsonl"):
        traj = Trajectory.model_validate(record)
        updates = int(traj.metadata["iteration"]) + 1
        levels = score_levels(tasks[traj.task_id], traj) if traj.fault is None else dict.fromkeys(LEVELS, False)
        scores.setdefault(updates, {})[traj.task_id] = {**levels, "fault": traj.fault is not None}
    return scores


def quoted_answers(out: Path) -> dict[str, float]:
    """updates -> share of the held-out episodes whose final answer is a tool's response
    copied whole (it opens with ``<tool_response>``, the wrapper the agent's prompt shows
    tool results in). A form no user asked for, which ``answer_reward`` scores 0; it counts any
    markup anywhere (``seed_agents.tool_calls.carries_markup``, as the summary of ``seed-agents
    train`` does), this share only answers that open with the tag."""
    from seed_agents.types import Trajectory

    quoted: dict[int, list[bool]] = {}
    for record in read_jsonl(out / "eval_trajectories.jsonl"):
        traj = Trajectory.model_validate(record)
        if traj.fault is None and traj.policy_calls:
            answer = (traj.policy_calls[-1].text or "").lstrip()
            quoted.setdefault(int(traj.metadata["iteration"]) + 1, []).append(answer.startswith("<tool_response>"))
    return {str(u): statistics.fmean(v) for u, v in sorted(quoted.items())}


def _says(text: str, value: Any) -> bool:
    """``value`` appears in ``text`` as a word of its own (not inside a longer word or number)."""
    return re.search(rf"(?<![\w.]){re.escape(str(value))}(?![\w])", text, flags=re.IGNORECASE) is not None


def skill_content(out: Path, tasks: Path) -> dict[str, float]:
    """What the run's valid skills name about the task they were written for
    (``skill_names``), read from its skills.jsonl."""
    by_id = {t["task_id"]: t["data"] for t in read_jsonl(tasks)}
    return skill_names(read_jsonl(out / "skills.jsonl"), by_id)


def skill_names(skills: list[dict[str, Any]], by_id: dict[str, dict[str, Any]]) -> dict[str, float]:
    """What valid skills (``task_id``, ``skill``, ``valid``) name about the atlas task they
    were written for: the tool its calls need, every argument of those calls, the answer. A
    135M model can copy a call a skill names (the oracle names it, in every skill); a skill
    that names none of them gives the teacher nothing about this task's action to carry.
    Shares of the valid skills; {} without any."""
    valid = [r for r in skills if r.get("valid") and r.get("task_id") in by_id]
    if not valid:
        return {}

    def names(r: dict[str, Any]) -> tuple[bool, bool, bool]:
        data, text = by_id[r["task_id"]], r.get("skill") or ""
        calls = data.get("calls", [])
        return (bool(calls) and all(_says(text, c["name"]) for c in calls),
                bool(calls) and all(_says(text, v) for c in calls for v in c["args"].values()),
                _says(text, data["answer"]))
    seen = [names(r) for r in valid]
    return {"valid": float(len(valid)), **{key: statistics.fmean(x[i] for x in seen)
                                           for i, key in enumerate(("names_tool", "names_args", "names_answer"))}}


def per_update(out: Path) -> list[dict[str, Any]]:
    """One row per update from metrics.jsonl: what the curve's diagnostics need."""
    keep = ("success_rate", "zero_variance_groups", "skill_parse_rate", "kl", "loss/opd", "opd/gate", "rows",
            "time/rollout_s", "time/score_s", "step_time", "faults", "guided_episodes", "guided_success_rate",
            "free_success_rate", "guide/first_logp", "guide/logp", "clip_frac", "time/step_s")
    return [{"update": int(m["iteration"]) + 1, **{k: m[k] for k in keep if k in m}} for m in read_jsonl(out / "metrics.jsonl")]


def run_digest(config: dict[str, Any], tasks: Path, heldout: Path, revision: int = 1) -> str:
    """A run's identity across machines: its settings without the paths (which name this
    checkout's folders), the contents of its task files instead, and its method's revision
    (``REVISIONS``; only past 1, so runs of an unchanged method keep their digests)."""
    portable = json.loads(json.dumps(config))
    if revision != 1:
        portable["revision"] = revision
    portable.pop("out", None)
    portable["graph"].pop("tasks", None)
    portable["eval"].pop("tasks", None)
    portable["task_files"] = [hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in (tasks, heldout)]
    return hashlib.sha256(json.dumps(portable, sort_keys=True).encode()).hexdigest()[:16]


def pack_run(run: dict[str, Any], digest: str, wall_s: float) -> dict[str, Any]:
    """A finished run as the result file keeps it: per evaluation, one 0/1 string per level
    over the held-out tasks in sorted order (``tasks``), and the per-update metrics."""
    ids = sorted({t for per_task in run["scores"].values() for t in per_task})
    return {"digest": digest, "wall_s": wall_s, "tasks": ids, "metrics": run["metrics"],
            "scores": {str(u): {lv: "".join("-" if t not in per_task else str(int(per_task[t][lv]))
                                            for t in ids) for lv in (*LEVELS, "fault")}
                       for u, per_task in sorted(run["scores"].items())}}


def unpack_run(packed: dict[str, Any]) -> dict[str, Any]:
    """``pack_run``'s inverse: the form ``analyse`` reads."""
    ids = packed["tasks"]
    scores = {int(u): {t: {lv: bits[lv][i] == "1" for lv in (*LEVELS, "fault")}
                       for i, t in enumerate(ids) if bits["right_answer"][i] != "-"}
              for u, bits in packed["scores"].items()}
    return {"scores": scores, "metrics": packed["metrics"]}


def stored_runs(path: Path) -> dict[str, dict[str, Any]]:
    """The finished runs an earlier invocation kept in ``path`` (name -> packed run)."""
    if not path.exists():
        return {}
    try:
        return dict(json.loads(path.read_text(encoding="utf-8"))["results"].get("runs", {}))
    except (ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"error: {path} is not a learning_curve result ({e}); move it away") from None


def stored_elsewhere(results_dir: Path, own: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Finished runs the other learning-curve files in ``results_dir`` keep: digest -> (file
    stem, packed run). A digest names the settings, the task files and the method's revision,
    so a run another variant trained (GRPO's seeds beside an oracle's) serves this one as it
    is; several files commonly hold one run, copied. Two files holding one digest with
    different scores mean the same settings trained twice and disagreed: neither is read
    (the run is trained here) and the line says which files. A file that is not a result is
    passed over here: it is not this invocation's to judge."""
    found: dict[str, tuple[str, dict[str, Any]]] = {}
    conflicts: set[str] = set()
    for path in sorted(results_dir.glob("learning_curve*.json")):
        if path.stem == own:
            continue
        try:
            runs = stored_runs(path)
        except SystemExit:
            continue
        for run in runs.values():
            if not (isinstance(run, dict) and isinstance(run.get("digest"), str)):
                continue
            first = found.setdefault(run["digest"], (path.stem, run))
            if first[1].get("scores") != run.get("scores") and run["digest"] not in conflicts:
                conflicts.add(run["digest"])
                print(f"note: {first[0]}.json and {path.stem}.json hold run {run['digest']} with different scores; "
                      "reading neither", flush=True)
    return {d: v for d, v in found.items() if d not in conflicts}


# -- analysis (pure) --------------------------------------------------------------------

def hierarchical_ci(per_seed: dict[int, dict[str, float]], *, confidence: float = 0.95, resamples: int = 10_000,
                    seed: int = 0) -> tuple[float, float] | None:
    """Bootstrap CI of a mean over seeds and held-out tasks: resample seeds, then tasks
    within each drawn seed. ``per_seed``: seed -> task -> value (a difference or a score).

    Seeds and tasks are put in sorted order before resampling: the same runs give the same
    interval whether their scores were read from a run folder (in the order the episodes
    finished) or from a result file (in its stored order)."""
    seeds = [np.asarray([v[t] for t in sorted(v)], dtype=float) for _, v in sorted(per_seed.items()) if v]
    if not seeds or sum(len(s) for s in seeds) < 2:
        return None
    rng = np.random.default_rng(seed)
    means = np.empty(resamples)
    for i in range(resamples):
        drawn = rng.integers(0, len(seeds), size=len(seeds))
        means[i] = np.mean([seeds[j][rng.integers(0, len(seeds[j]), size=len(seeds[j]))].mean() for j in drawn])
    tail = (1 - confidence) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def paired_matrices(a: dict[Any, dict[str, float]], b: dict[Any, dict[str, float]]) -> tuple[np.ndarray, np.ndarray]:
    """``a`` and ``b`` (seed -> task -> score) as two seeds x tasks arrays over the seeds both
    hold and the tasks every one of those runs scored, seeds and tasks sorted: the form
    ``crossed_bootstrap_ci`` pairs, whatever order the runs were read in."""
    seeds = sorted(set(a) & set(b))
    tasks = sorted(set.intersection(*(set(a[s]) & set(b[s]) for s in seeds))) if seeds else []
    return (np.asarray([[a[s][t] for t in tasks] for s in seeds], dtype=float).reshape(len(seeds), len(tasks)),
            np.asarray([[b[s][t] for t in tasks] for s in seeds], dtype=float).reshape(len(seeds), len(tasks)))


def crossed_ci(a: dict[Any, dict[str, float]], b: dict[Any, dict[str, float]], **kw: Any) -> tuple[float, float] | None:
    """The crossed bootstrap interval (bench/stats.py) of ``a`` minus ``b`` over their common
    seeds and held-out tasks; None with nothing to resample."""
    return crossed_bootstrap_ci(*paired_matrices(a, b), **kw)


def answers_at(by_seed: dict[Any, dict[str, Any]], which: str) -> dict[Any, dict[str, float]]:
    """seed -> held-out task -> right answer (1.0 or 0.0) at a run's ``first`` or ``last`` evaluation."""
    pick = min if which == "first" else max
    return {s: {t: float(v["right_answer"]) for t, v in run["scores"][pick(run["scores"])].items()}
            for s, run in by_seed.items() if run["scores"]}


def analyse(runs: dict[str, dict[int, dict[str, Any]]]) -> dict[str, Any]:
    """runs: method -> seed -> {"scores": updates -> task -> levels, "metrics": [...]}."""
    out: dict[str, Any] = {"methods": {}}
    finals: dict[str, dict[int, float]] = {}
    for method, by_seed in runs.items():
        curve: dict[int, dict[str, list[float]]] = {}
        gains: dict[int, dict[str, float]] = {}
        for s, run in by_seed.items():
            scores = run["scores"]
            if not scores:
                continue
            first, last = min(scores), max(scores)
            for updates, per_task in scores.items():
                for level in LEVELS:
                    curve.setdefault(updates, {}).setdefault(level, []).append(
                        statistics.fmean(v[level] for v in per_task.values()))
            common = set(scores[first]) & set(scores[last])
            gains[s] = {t: float(scores[last][t]["right_answer"]) - float(scores[first][t]["right_answer"]) for t in common}
            finals.setdefault(method, {})[s] = statistics.fmean(float(scores[last][t]["right_answer"]) for t in scores[last])
        metrics = [m for run in by_seed.values() for m in run["metrics"]]
        gain_means = {s: statistics.fmean(g.values()) for s, g in gains.items() if g}
        out["methods"][method] = {
            "curve": {str(u): {lv: statistics.fmean(v) for lv, v in levels.items()} for u, levels in sorted(curve.items())},
            "curve_per_seed": {str(u): levels for u, levels in sorted(curve.items())},
            "gain": statistics.fmean(gain_means.values()) if gain_means else None,
            "gain_per_seed": gain_means,
            "gain_ci": hierarchical_ci(gains),
            # the same seeds play the same held-out tasks: tasks resampled jointly, and the t
            # interval over the seeds' gains, which the bootstrap at three to six seeds undercuts
            "gain_crossed_ci": crossed_ci(answers_at(by_seed, "last"), answers_at(by_seed, "first")),
            "gain_t_ci": paired_t(list(gain_means.values()))[0],
            "seeds_needed_for_gain": seeds_needed(list(gain_means.values())),
            "zero_variance_groups": statistics.fmean(m["zero_variance_groups"] for m in metrics)
            if any("zero_variance_groups" in m for m in metrics) else None,
            "training_success": statistics.fmean(m["success_rate"] for m in metrics) if metrics else None,
            "updates": len(metrics),
        }
    for method in (m for m in METHODS if m != "grpo" and {m, "grpo"} <= finals.keys()):
        p = compare(finals[method], finals["grpo"])
        out[f"{method.replace('-', '_')}_minus_grpo"] = {
            "n": p.n, "mean": p.mean, "ci": p.ci, "seeds_needed": p.seeds_needed,
            "higher": p.higher, "lower": p.lower, "equal": p.equal, "t_ci": p.t_ci, "p_t": p.p_t, "p_sign": p.p_sign,
            "crossed_ci": crossed_ci(answers_at(runs[method], "last"), answers_at(runs["grpo"], "last"))}
    grpo = out["methods"].get("grpo", {})
    ci = grpo.get("gain_ci")
    seeds = len(grpo.get("gain_per_seed", {}))
    met = grpo.get("gain") is not None and grpo["gain"] >= GOAL and ci is not None and ci[0] > 0
    # the goal's CI is over seeds and tasks: with fewer than MIN_SEEDS it spans tasks only
    out["goal"] = {"gain_at_least": GOAL, "min_seeds": MIN_SEEDS, "seeds": seeds,
                   "verdict": ("met" if met else "missed") if seeds >= MIN_SEEDS else
                   f"not decided: {seeds} seed(s), the goal needs {MIN_SEEDS}"
                   + (" (the gain over these seeds clears it)" if met else "")}
    return out


# -- the family a claim is chosen from ---------------------------------------------------

def curve_rows(curves: dict[str, dict[str, Any]]) -> list[tuple[str, str]]:
    """(file stem, method) for each method a learning-curve file trained, files in name order.
    ``curves``: stem -> {"config", "results"} as the file holds them. A method whose runs all
    appear (by digest) in a row before is that row's: read back from another file, not tried again."""
    rows, shown = [], set()
    for stem in sorted(curves):
        config, results = curves[stem]["config"], curves[stem]["results"]
        kept = results.get("runs", {})
        for method in results["methods"]:
            digests = {kept[f"{method}-s{s}"]["digest"] for s in config["seeds"] if f"{method}-s{s}" in kept}
            if digests and digests <= shown:
                continue
            shown |= digests
            rows.append((stem, method))
    return rows


def stored_answers(results: dict[str, Any], method: str, which: str) -> dict[str, dict[str, float]]:
    """seed -> held-out task -> right answer (1.0 or 0.0) at the ``first`` or ``last`` evaluation
    of ``method``'s runs a result file keeps; a task an evaluation did not score is left out."""
    pick = min if which == "first" else max
    out = {}
    for name, run in (results.get("runs") or {}).items():
        m, _, seed = name.rpartition("-s")
        if m == method and run.get("scores"):
            bits = run["scores"][pick(run["scores"], key=int)]["right_answer"]
            ids = run.get("tasks") or [str(i) for i in range(len(bits))]
            out[seed] = {t: float(b == "1") for t, b in zip(ids, bits) if b != "-"}
    return out


def stored_gain(results: dict[str, Any], method: str) -> tuple[tuple[float, float] | None, tuple[float, float] | None]:
    """(the crossed bootstrap interval, the t interval over seeds) of ``method``'s held-out gain
    from the runs a result file keeps; (None, None) without them."""
    first, last = stored_answers(results, method, "first"), stored_answers(results, method, "last")
    gains = [statistics.fmean(last[s][t] - first[s][t] for t in set(first[s]) & set(last[s]))
             for s in sorted(set(first) & set(last)) if set(first[s]) & set(last[s])]
    return crossed_ci(last, first), paired_t(gains)[0]


def against_grpo(results: dict[str, Any], method: str) -> dict[str, Any] | None:
    """``method`` minus GRPO's final held-out answer success, paired by seed, recomputed from
    the runs a result file keeps (a file written before a figure existed gets it too): the
    paired tests (bench/stats.py ``compare``) and the crossed bootstrap interval over the
    seeds and tasks. None when the file holds no run of one of the two."""
    mine, grpo = stored_answers(results, method, "last"), stored_answers(results, "grpo", "last")
    if not mine or not grpo:
        return None
    p = compare({s: statistics.fmean(v.values()) for s, v in mine.items() if v},
                {s: statistics.fmean(v.values()) for s, v in grpo.items() if v})
    if not p.n:
        return None
    return {"n": p.n, "mean": p.mean, "ci": p.ci, "seeds_needed": p.seeds_needed, "higher": p.higher, "lower": p.lower,
            "equal": p.equal, "t_ci": p.t_ci, "p_t": p.p_t, "p_sign": p.p_sign, "crossed_ci": crossed_ci(mine, grpo)}


def comparison_family(curves: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Every SEED variant compared with GRPO in the learning-curve files: the family the atlas
    claims were chosen from. A member is one row of ``curve_rows`` whose method is not GRPO and
    whose file holds GRPO runs beside it: each skill source, OPD weight, placement, schedule,
    budget and level tried, retired code included (it was tried, and its result was read
    before a later variant was chosen). Its p is the paired t-test's on the seeds' final
    held-out answer success; a member with one seed has none and still counts among the
    variants. Each member ("stem:method") gets its comparison (``against_grpo``) and its
    ``Claim``: the raw p, the Holm-adjusted p over the family, the family's size. A
    preregistered file (bench/preregistration.py) is a family of its own: its comparisons were
    fixed before it ran, not chosen from the variants tried."""
    members = {f"{stem}:{method}": d for stem, method in curve_rows(curves) if method != "grpo"
               and (d := against_grpo(curves[stem]["results"], method)) is not None}
    groups: dict[str | None, list[str]] = {}
    for key in members:
        stem = key.rpartition(":")[0]
        groups.setdefault(stem if curves[stem]["config"].get(PREREGISTRATION_KEY) else None, []).append(key)
    claims = {k: c for keys in groups.values() for k, c in family_claims({k: members[k]["p_t"] for k in keys}).items()}
    return {key: {**d, "claim": claims[key]} for key, d in members.items()}


def family_in(results_dir: Path, own: str, config: dict[str, Any], results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``comparison_family`` over the learning-curve files in ``results_dir``, this invocation's
    ``own`` file taken as it is about to be written; a file that is not a result is passed over."""
    curves = {}
    for path in sorted(results_dir.glob("learning_curve*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            curves[path.stem] = {"config": data["config"], "results": data["results"]}
        except (OSError, ValueError, KeyError, TypeError):
            continue
    curves[own] = {"config": config, "results": results}
    return comparison_family(curves)


def plot(analysis: dict[str, Any], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4), dpi=110)
    for method, m in analysis["methods"].items():
        xs = [int(u) for u in m["curve"]]
        axes[0].plot(xs, [m["curve"][str(u)]["right_answer"] for u in xs], marker="o", label=f"{method}: right answer")
        axes[0].plot(xs, [m["curve"][str(u)]["right_calls"] for u in xs], ls="--", alpha=0.7,
                     label=f"{method}: right tool + arguments")
        for u in xs:
            for y in m["curve_per_seed"][str(u)]["right_answer"]:
                axes[0].scatter(u, y, s=8, alpha=0.35, color="grey")
    axes[0].set_xlabel("updates")
    axes[0].set_ylabel("held-out success (greedy)")
    axes[0].set_ylim(-0.02, 1.02)
    axes[0].legend(fontsize=7)
    for method, series in analysis.get("zero_variance_series", {}).items():
        axes[1].plot([p[0] for p in series], [p[1] for p in series], marker=".", label=f"{method}")
    axes[1].set_xlabel("update")
    axes[1].set_ylabel("GRPO groups with zero reward variance")
    axes[1].set_ylim(-0.02, 1.02)
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    """The curve's settings; bench/run_memory.py builds its training config from them too."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--methods", default="grpo,seed",
                   help=f"Comma list of {', '.join(METHODS)} (seed-oracle: the bound with manifest-written skills; "
                        "seed-episode: skills read off each episode by rule; seed-success: the same on successes only; "
                        "seed-success-generic: a fixed sentence on successes, the control; seed-success-imitate: "
                        "the same with the gate off, plain imitation of successes).")
    p.add_argument("--seeds", default="0,1,2", help="Comma list of seeds (each method runs every seed).")
    p.add_argument("--level", type=int, default=0, help="Atlas level (0: one lookup; docs/results/atlas_band.json).")
    p.add_argument("--first-turn", choices=list(BUILDERS), default="forced",
                   help="forced: the first turn calls a tool; auto: every turn chooses; forced-two: the first two "
                        "turns call a tool; lookup-add: the first calls lookup, the second add (level 1)")
    p.add_argument("--updates", type=int, default=30)
    p.add_argument("--tasks-per-update", type=int, default=4)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--train-tasks", type=int, default=None, help="Distinct training tasks (default: all of the level).")
    p.add_argument("--heldout", type=int, default=None, help="Held-out tasks (default: all of the level).")
    p.add_argument("--split", choices=["heldout", "validation", "test"], default="heldout",
                   help="Which places and phrasings the evaluations play (seed_agents.tools.atlas): heldout, the set "
                        "past figures were tuned and reported on; validation, for choosing settings; test, read once.")
    p.add_argument("--preregistered", type=Path, default=None,
                   help="A committed file under bench/preregistered/ that gives every setting (the command line "
                        "may add only --work, --results-dir, --note); the result file records its commit.")
    p.add_argument("--eval-every", type=int, default=5)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--skill-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.5,
                   help="Training sampling temperature. 0.5 puts level 0 inside the learnable band "
                        "(docs/results/atlas_band_temperature.json: 22%% training success against 12%% at 0.7); "
                        "the main curve (learning_curve.json) trained at 0.7, so pass --temperature 0.7 to resume it.")
    p.add_argument("--precision", choices=["float32", "auto", "bfloat16"], default="float32",
                   help="backend.precision of the runs (rollouts and updates; auto: bf16 where the CPU has it).")
    p.add_argument("--kv-cache", choices=["dynamic", "static"], default="dynamic",
                   help="The local backend's KV cache in the runs (seed_agents.backends.engine; static: decode into "
                        "preallocated buffers). Another choice "
                        "samples other float roundings: give it its own --result-name.")
    p.add_argument("--attention", choices=["same", "float32"], default="same",
                   help="backend.attention of the runs (float32: attention in fp32 under bf16; needs a bf16 "
                        "--precision to change anything).")
    p.add_argument("--lora-r", type=int, default=8)
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lr-schedule", choices=["linear", "constant"], default="linear",
                   help="linear (TRL's default, every stored curve): decays to 0 over --updates; constant: every "
                        "update at --lr.")
    p.add_argument("--opd-coef", type=float, default=None,
                   help="The skill methods' OPD weight (lambda; default the paper's 0.01). Another weight is "
                        "another run: give it its own --work and --result-name.")
    p.add_argument("--kl-coef", type=float, default=0.001, help="KL to the start (the LoRA's base); also logged.")
    p.add_argument("--work", type=Path, default=ROOT / "runs" / "learning_curve", help="Run folders (resumable).")
    p.add_argument("--injector", choices=["system", "task_line", "last_turn"], default="system",
                   help="Where the skill sits in the teacher's prompt (skills.injector; GRPO writes none). Another "
                        "placement is another run: give it its own --work and --result-name.")
    p.add_argument("--answer-format", choices=list(get_args(AnswerFormat)), default="paper",
                   help="skills.answer_format for SEED's own skills: the analyzer prompt's reply example (the paper's "
                        "\"string\", which SmolLM2 copies; seed_agents.skills.ANSWER_FORMATS). Another format is "
                        "another run.")
    p.add_argument("--skill-opening", choices=list(get_args(SkillOpening)), default="words",
                   help="skills.opening for SEED's own skills: call makes the skill grammar open 'Call <tool> with', "
                        "the writer choosing the tool and the rest (the oracle's skills name the call). Another "
                        "opening is another run.")
    p.add_argument("--skill-failures", choices=list(get_args(SkillFailures)), default="write",
                   help="skills.failures for SEED's own skills: skip writes none for a failed episode (seed-success "
                        "does the same with rule-read skills). Another choice is another run.")
    p.add_argument("--fuse-teacher", action="store_true",
                   help="trainer.fuse_teacher for the skill methods: the teacher scored on the training forward's "
                        "prompt keys and values (pays with --injector last_turn; docs/training.md).")
    p.add_argument("--guide-share", type=float, default=0.0,
                   help="With --first-turn auto: share of each group's training episodes steered into a tool call "
                        "at their first free choice (guided openings; held-out episodes stay free).")
    p.add_argument("--initial-eval", choices=["reuse", "own"], default="reuse",
                   help="reuse: a run starts with the initial policy's held-out evaluation a run beside it under "
                        "--work already played (the same weights, greedy; ~2 min a run); own: every run plays it.")
    p.add_argument("--result-name", default="learning_curve",
                   help="Result file stem under --results-dir (a variant keeps the main curve).")
    p.add_argument("--note", default="", help="What else ran on the machine (it shapes the wall time).")
    add_results_args(p)
    return p


def main(argv: list[str] | None = None) -> None:
    p = build_parser()
    try:
        path, rest = split_argv(sys.argv[1:] if argv is None else list(argv))
        prereg = load_preregistration(path, "learning_curve") if path else None
    except PreregistrationError as e:
        p.exit(2, f"learning_curve: {e}\n")
    args = p.parse_args([*prereg.argv(), *rest] if prereg else rest)
    del args.preregistered  # the file's record below stands for it
    if prereg:
        if args.split != "test":
            p.exit(2, f"learning_curve: {prereg.path} reads split {args.split}; a preregistered comparison reads test\n")
        setattr(args, PREREGISTRATION_KEY, prereg.record())
    if not 0.0 <= args.guide_share <= 1.0:
        p.error("--guide-share: a share in [0, 1]")
    if args.guide_share and args.first_turn != "auto":
        p.error("--guide-share steers free first turns: it needs --first-turn auto")
    if args.attention != "same" and args.precision == "float32":
        p.error("--attention float32 changes only bf16 runs: give it --precision auto or bfloat16 (in fp32 it would "
                "name another digest for the same run)")
    if args.opd_coef is not None and not args.opd_coef >= 0:
        p.error("--opd-coef: a weight >= 0")
    if not args.result_name.replace("_", "").replace("-", "").isalnum():
        p.error("--result-name: letters, digits, '-' and '_' only")
    methods = [m for m in args.methods.split(",") if m]
    if not methods or set(methods) - set(METHODS):
        p.error(f"--methods: choose from {', '.join(METHODS)}")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s]
    except ValueError:
        p.error("--seeds: a comma list of integers")
    started = now()
    args.work.mkdir(parents=True, exist_ok=True)
    tasks, heldout, n_train, n_heldout = write_tasks(args.work, args.level, args.train_tasks, args.heldout, args.split)
    log = args.work / "train.log"
    so_far = Invocation(seeds, methods, tasks, n_train, n_heldout, started)
    runs, walls, packed, read_from = so_far.runs, so_far.walls, so_far.packed, so_far.read_from
    kept = stored_runs(Path(args.results_dir) / f"{args.result_name}.json")
    elsewhere = stored_elsewhere(Path(args.results_dir), args.result_name)
    to_train = []
    for s in seeds:  # seeds outermost: a benchmark stopped early still has paired runs
        for method in methods:
            name = f"{method}-s{s}"
            out = args.work / name
            config = train_config(args, method, s, tasks, heldout, n_train, n_heldout, out)
            revision = REVISIONS.get(method, 1)
            digest = run_digest(config, tasks, heldout, revision)
            fresh = not (out / "benchmark-done.json").exists()
            if fresh and kept.get(name, {}).get("digest") == digest:
                source, stored = args.result_name, kept[name]
            elif fresh and digest in elsewhere:
                source, stored = elsewhere[digest]
            else:
                to_train.append((fresh, name, method, s, out, config, revision, digest))
                continue
            packed[name] = stored
            walls[name] = float(stored["wall_s"])
            runs.setdefault(method, {})[s] = unpack_run(stored)
            read_from[name] = source
            print(f"{name}: finished in an earlier invocation ({walls[name]:.0f} s), read from {source}.json", flush=True)
    # Every stored run is read back before the first one trains, and runs that finished in their
    # folders (run_one returns at once) come first: the result file rewritten after each trained
    # run (below) then still holds every finished run it had (rewritten with only the runs
    # reached so far, a killed invocation lost the later ones from the file).
    to_train.sort(key=lambda run: run[0])  # stable: finished folders first, each part in the asked order
    for _, name, method, s, out, config, revision, digest in to_train:
        print(f"{name}: training ({args.updates} updates of {args.tasks_per_update} tasks x {args.group})", flush=True)
        if args.initial_eval == "reuse" and (source := reuse_initial_eval(config, out, args.work)):
            print(f"{name}: the initial policy's held-out evaluation copied from {source} (the same weights, "
                  "played greedily)", flush=True)
        walls[name] = run_one(config, out, log, revision)
        runs.setdefault(method, {})[s] = {"scores": heldout_scores(out, heldout), "metrics": per_update(out)}
        packed[name] = pack_run(runs[method][s], digest, walls[name])
        if (out / INITIAL_EVAL_FROM).exists():  # its wall time lacks that evaluation's minutes
            packed[name]["initial_eval_from"] = json.loads((out / INITIAL_EVAL_FROM).read_text())["run"]
        if revision != 1:
            packed[name]["revision"] = revision
        print(f"{name}: done in {walls[name]:.0f} s", flush=True)
        if so_far.pending():  # a finished run reaches the results folder now, not only when the last one ends
            report(args, so_far)
    report(args, so_far)


@dataclass
class Invocation:
    """What one invocation of the benchmark asked for and holds so far: the runs it trained and
    those it read back (``read_from``: run -> the result file it came from), each kept both
    unpacked for the analysis (``runs``: method -> seed -> scores and metrics) and packed as the
    result file stores it, with each run's wall time."""

    seeds: list[int]
    methods: list[str]
    tasks: Path
    n_train: int
    n_heldout: int
    started: str
    runs: dict[str, dict[int, dict[str, Any]]] = field(default_factory=dict)
    packed: dict[str, dict[str, Any]] = field(default_factory=dict)
    walls: dict[str, float] = field(default_factory=dict)
    read_from: dict[str, str] = field(default_factory=dict)

    def pending(self) -> list[str]:
        """The runs asked for that this invocation has neither trained nor read back, in order."""
        return [f"{m}-s{s}" for s in self.seeds for m in self.methods if f"{m}-s{s}" not in self.packed]


def report(args: argparse.Namespace, so_far: Invocation) -> None:
    """Analyse the runs so far, print the figures and write the result file and its plot.

    Called after each run that trains and once at the end: a run takes an hour or more, a
    session can end between runs, and the result file is what a fresh checkout keeps (run
    folders are not committed). A file written while some runs are pending says so
    (``results.pending``), and the next invocation reads its finished runs back by digest and
    trains only the rest."""
    seeds, runs, packed, walls, tasks = so_far.seeds, so_far.runs, so_far.packed, so_far.walls, so_far.tasks
    n_train, n_heldout, pending = so_far.n_train, so_far.n_heldout, so_far.pending()
    analysis = analyse(runs)
    for name, run in packed.items():  # kept with the run; a run packed before this figure gets it from its folder
        if "quoted_answers" not in run and (args.work / name / "eval_trajectories.jsonl").exists():
            run["quoted_answers"] = quoted_answers(args.work / name)
    analysis["quoted_answers"] = {name: run["quoted_answers"] for name, run in sorted(packed.items())
                                  if run.get("quoted_answers")}
    for name, run in packed.items():  # likewise: what the skills named, where the run wrote any
        if "skill_content" not in run and (args.work / name / "skills.jsonl").exists():
            run["skill_content"] = skill_content(args.work / name, tasks)
    analysis["skill_content"] = {name: run["skill_content"] for name, run in sorted(packed.items())
                                 if run.get("skill_content")}
    # one optimizer step per batch: the tokens outside the PPO clip are those whose recorded old
    # log-prob and the trainer's already disagree by more than the clip: bf16's rounding gap, and
    # in any precision tokens sampled under a grammar (their old log-prob is the masked one,
    # docs/constrained_decoding.md) and guided prefills; not bf16's gap alone
    analysis["clip_frac"] = {name: statistics.fmean(u["clip_frac"] for u in run["metrics"] if "clip_frac" in u)
                             for name, run in sorted(packed.items()) if any("clip_frac" in u for u in run["metrics"])}
    analysis["zero_variance_series"] = {
        m: [(u, statistics.fmean(r["metrics"][u - 1]["zero_variance_groups"] for r in by_seed.values()
                                 if len(r["metrics"]) >= u and "zero_variance_groups" in r["metrics"][u - 1]))
            for u in range(1, args.updates + 1)
            if any(len(r["metrics"]) >= u and "zero_variance_groups" in r["metrics"][u - 1] for r in by_seed.values())]
        for m, by_seed in runs.items()}
    results_dir = Path(args.results_dir)
    results_dir.mkdir(parents=True, exist_ok=True)
    title = (f"{args.model}, atlas level {args.level} ({args.first_turn} first turn), {len(seeds)} seed(s), "
             f"{args.updates} updates x {args.tasks_per_update} tasks x G{args.group} at T {args.temperature:g}, "
             f"LoRA r{args.lora_r} lr {args.lr:g}")
    if args.guide_share:
        title += f", guide share {args.guide_share:g}"
    plot(analysis, results_dir / f"{args.result_name}.png", title)

    print(f"\n{title}; {n_train} training / {n_heldout} held-out tasks"
          + (f"; so far: {len(pending)} run(s) still to train ({', '.join(pending)})" if pending else ""))
    for method, m in analysis["methods"].items():
        curve = m["curve"]
        first, last = curve[min(curve, key=int)], curve[max(curve, key=int)]
        ci, crossed, t_ci = m["gain_ci"], m["gain_crossed_ci"], m["gain_t_ci"]
        print(f"{method:<5} held-out right answer {first['right_answer']:.3f} -> {last['right_answer']:.3f} "
              f"(right calls {first['right_calls']:.3f} -> {last['right_calls']:.3f}, parsed {first['parsed']:.3f} -> "
              f"{last['parsed']:.3f}); gain {m['gain']:+.3f}, 95% CI "
              f"{'-' if ci is None else f'[{ci[0]:+.3f}, {ci[1]:+.3f}]'} (tasks within seeds), "
              f"{'-' if crossed is None else f'[{crossed[0]:+.3f}, {crossed[1]:+.3f}]'} (seeds x tasks crossed)"
              f"{'' if t_ci is None else f', t interval [{t_ci[0]:+.3f}, {t_ci[1]:+.3f}]'}; "
              f"training success {m['training_success']:.3f}; "
              f"zero-variance groups {'-' if m['zero_variance_groups'] is None else format(m['zero_variance_groups'], '.3f')}")
    family = family_in(results_dir, args.result_name,
                       {"seeds": seeds, PREREGISTRATION_KEY: getattr(args, PREREGISTRATION_KEY, None)},
                       {"methods": analysis["methods"], "runs": packed})
    for method in METHODS[1:]:
        d = analysis.get(f"{method.replace('-', '_')}_minus_grpo")
        if d:
            ci, crossed = d["ci"], d["crossed_ci"]
            tests = paired_tests(d)
            claim = (family.get(f"{args.result_name}:{method}") or {}).get("claim")
            print(f"{method.upper()} - GRPO (final held-out, paired by seed, n={d['n']}): {d['mean']:+.3f}, 95% bootstrap "
                  f"CI {'-' if crossed is None else f'[{crossed[0]:+.3f}, {crossed[1]:+.3f}]'} over seeds x tasks "
                  f"({'-' if ci is None else f'[{ci[0]:+.3f}, {ci[1]:+.3f}]'} over seeds)"
                  f"{f'; {tests}' if tests else ''}{f'; {claim_words(claim)}' if claim else ''}; "
                  f"a paired test needs {d['seeds_needed'] or '-'} seeds")
    if family:
        print(f"Holm's correction over the family: every SEED variant against GRPO in {results_dir}/learning_curve*.json, "
              f"{len(family)} in all (comparison_family)")
    for name, shares in analysis["quoted_answers"].items():
        print(f"{name}: final held-out answers that copy a tool's response whole, per evaluation: "
              + ", ".join(f"update {u} {v:.2f}" for u, v in shares.items()))
    for name, c in analysis["skill_content"].items():
        print(f"{name}: of {c['valid']:.0f} valid training skills, {c['names_tool']:.2f} name the tool the task needs, "
              f"{c['names_args']:.2f} every argument of its calls, {c['names_answer']:.2f} the answer")
    if analysis["clip_frac"]:
        print("tokens outside the PPO clip at their one step, mean over updates: "
              + ", ".join(f"{name} {v:.4f}" for name, v in analysis["clip_frac"].items()))
    g = analysis["methods"].get("grpo")
    if g:
        print(f"goal: GRPO held-out gain >= +{GOAL:.2f} with its 95% CI (seeds x tasks) excluding 0: "
              f"{analysis['goal']['verdict']}")
    print(f"wall: {sum(walls.values()) / 60:.1f} min of training runs this invocation (finished runs count their own)")
    config = {**config_of(args), "opd_coef": skill_opd_coef(args),
              "work": args.work.name, "max_turns": AGENT_MAX_TURNS, "model": Path(str(args.model)).name,
              "seeds": seeds, "methods": so_far.methods, "train_tasks": n_train, "heldout": n_heldout}
    write_result(args.result_name, config,
                 {**analysis, "wall_s": walls, "note": args.note, "runs": packed, "read_from": so_far.read_from,
                  **({"pending": pending} if pending else {})},
                 paper=PAPER, labels=LABELS, started_at=so_far.started, results_dir=args.results_dir)


if __name__ == "__main__":
    stop_children_on_sigterm()
    main()
