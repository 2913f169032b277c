"""The result tables of the README and the docs/ pages, rendered from docs/results/.

A figure typed by hand from a script's output drifts from the run it came from; here every
table between ``<!-- results:NAME -->`` and ``<!-- /results:NAME -->`` in README.md or a
``docs/*.md`` page is printed from ``docs/results/NAME*.json`` (written by
``bench/results.py``). Each table opens with where its figures came from (file, commit,
date, machine load) and every setting of the run that differs from the paper's, read from
the file's config. A table lives on one page: a marker name found twice is an error.

    .venv/bin/python scripts/readme_tables.py           # rewrite the tables in README.md and docs/*.md
    .venv/bin/python scripts/readme_tables.py --check   # exit 1 if a figure on a page differs from its file

Only the text between markers is touched; a marker whose results are missing, or one
opened and never closed, is an error.
"""

from __future__ import annotations

import argparse
import difflib
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from statistics import fmean as mean
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run as a script: scripts/ is on the path, the repo root is not

from bench.results import Result, load_results  # noqa: E402
from bench.stats import claim_words, compare, paired_tests, sign_test, t_test  # noqa: E402

MARKER = re.compile(r"(<!-- results:(?P<name>[a-z0-9_]+) -->\n)(?P<body>.*?)(<!-- /results:(?P=name) -->)", re.S)
OPENING = re.compile(r"<!-- results:(?P<name>[a-z0-9_]+) -->")


class TablesError(Exception):
    """A marker without results or twice, or results a renderer cannot read: one line for the user."""


# -- shared pieces ------------------------------------------------------------------------

def f(x: Any, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def source_line(r: Result, what: str = "") -> str:
    """Where the figures come from, then each departure from the paper's settings."""
    rev = r.code.get("git_rev")
    code = "commit unknown" if not rev else f"commit {rev[:7]}" + (" + uncommitted changes" if r.code.get("dirty") else "")
    m = r.machine
    load = f", load {m['load_avg_1m']:.1f} at the start" if m.get("load_avg_1m") is not None else ""
    day = (r.started_at or r.ended_at or "")[:10]
    diff = r.departures()
    paper = (f"Differs from the paper: {'; '.join(diff)}." if diff else
             "Every compared setting is the paper's." if r.paper else "Not compared with the paper's settings.")
    return (f"*`docs/results/{r.name}.json`{': ' + what if what else ''} ({code}, {day}, "
            f"{m.get('cpus_usable', m.get('cpu_count'))} CPUs{load}). {paper}*")


def table(head: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(head) + " |", "|" + "---|" * len(head), *("| " + " | ".join(r) + " |" for r in rows)]


def goal_words(value: float, goal: float, at_most: bool) -> str:
    """``met`` or ``missed by`` the unrounded gap, to two significant digits: a ratio that
    prints as 1.300 against a goal of <= 1.3 can still be a miss, and then says so."""
    ok = value <= goal if at_most else value >= goal
    return f"goal {'<=' if at_most else '>='} {goal:g}: " + ("met" if ok else f"missed by {abs(value - goal):.2g}")


def one(results: dict[str, Result], name: str) -> Result:
    if name not in results:
        raise TablesError(f"no docs/results/{name}.json for the {name} table; run its benchmark first")
    return results[name]


def roofline_for(results: dict[str, Result], r: Result) -> Result:
    """The roofline a run's fractions are read against: the ``roofline*.json`` measured on a
    CPU with the run's ceiling features (``roofline.json`` first; another machine's is kept as
    ``roofline_<machine>.json``), refused when none was (results written before the runs
    recorded their flags are read against roofline.json as they are)."""
    roof = one(results, "roofline")
    flags = r.machine.get("cpu_flags")
    if flags is None or flags == roof.results["cpu_flags"]:
        return roof
    same = [v for n, v in sorted(results.items()) if n.startswith("roofline_") and v.results.get("cpu_flags") == flags]
    if not same:
        raise TablesError(f"{r.name} ran on a CPU with {flags}, roofline.json was measured on one with "
                          f"{roof.results['cpu_flags']}: measure that CPU's (bench/roofline.py --result-name "
                          f"roofline_<machine>) or re-run {r.name} on roofline.json's machine")
    return same[0]


# -- one renderer per table ---------------------------------------------------------------

def capture_overhead(results: dict[str, Result]) -> list[str]:
    runs = [r for n, r in sorted(results.items(), key=lambda kv: kv[0] != "capture_overhead_fake")
            if n.startswith("capture_overhead_")]
    if not runs:
        raise TablesError("no docs/results/capture_overhead_*.json; run bench/capture_overhead.py first")
    lines, rows = [], []
    for r in runs:
        c, x = r.config, r.results
        lines.append(source_line(r, f"{c['episodes']} episodes x {c['max_turns']} turns, concurrency "
                                    f"{c['concurrency']}, median of {len(x['repeats'])} interleaved repeats") + "  ")
        backend = {"fake": "fake (no model: framework cost alone)", "local": f"{c['model']}, local backend",
                   "vllm": f"{c['model']}, vLLM server"}[c["backend"]]
        per_step = x.get("framework_ms_per_step")  # measured since the executor reuses threads
        step = "-" if per_step is None else f"{per_step:.2f} ms ({goal_words(per_step, x['goal_ms_per_step'], at_most=True)})"
        verdict = goal_words(x["ratio"], x["goal"], at_most=False)
        if per_step is not None and per_step < 0:  # the graph side ran faster: no framework cost can be read off
            step = f"{per_step:.2f} ms (not resolved: the graph side was faster)"
            verdict = "not resolved: above 1, the two sides' batching differs by more than the framework costs"
        floor = x.get("langgraph_floor_ms_per_step")  # measured since the bench runs a bare graph beside
        rows.append([backend, f"{x['plain_eps_median']:.3f} ep/s", f"{x['graph_eps_median']:.3f} ep/s",
                     f"{x['ratio']:.3f}",  # with the fake model the ratio is the framework's cost alone (issue 21's goal)
                     verdict, step,
                     "-" if floor is None else f"{floor:.2f} ms: ratio <= {x['langgraph_ratio_ceiling']:.3f}"])
    lines[-1] = lines[-1].rstrip()
    out = [*lines, "", *table(["backend", "plain loop", "graph + capture", "ratio", "goal", "framework cost per step",
                               "LangGraph alone per step (the ratio it allows)"], rows)]
    fake = next((r.results for r in runs if r.config["backend"] == "fake"), None)
    if fake and fake.get("chat_model_ms_per_call") is not None:
        out += ["", f"Fake backend, where the framework's milliseconds go: LangGraph alone "
                    f"{fake['langgraph_floor_ms_per_step']:.2f} ms per step, ours beyond it "
                    f"{fake['framework_ms_per_step'] - fake['langgraph_floor_ms_per_step']:.2f} ms, of which a chat "
                    f"model call through SeedChatModel under capture takes {fake['chat_model_ms_per_call']:.2f} ms "
                    f"against {fake['bare_call_ms']:.2f} ms for the same render, backend call and decode bare."]
    return out


SEED_GRPO_GOAL = 1.15  # issue 21's; runs before it stored the script's older goal (1.3) in their file
PLACEMENTS = {"system": "skill in the system message", "task_line": "skill after the task line",
              "last_turn": "skill after the prompt"}  # skills.injector


def placement(name: str) -> str:
    """A seed_overhead side in words: ``last_turn+fused`` is the placement with the teacher
    scored on the loss forward's prompt keys and values (``trainer.fuse_teacher``)."""
    base = name.removesuffix("+fused")
    return PLACEMENTS.get(base, base) + (", teacher fused into the loss forward" if name.endswith("+fused") else "")


def seed_overhead(results: dict[str, Result], name: str = "seed_overhead") -> list[str]:
    r = one(results, name)
    c, x = r.config, r.results
    n = len(x["repeats"])
    what = (f"{c['env']}, {c['tasks']} tasks x {c['group']} episodes, {c['max_turns']} turns, "
            f"{x['rows']} rows, teacher prompts on {x['rows_with_teacher']}/{x['rows']} rows ({c['skill_coverage']})"
            + (f", LoRA r{c['lora_r']}" if c.get("lora_r") else "") + (f", T {c['temperature']:g}" if "temperature" in c else "")
            # the benchmark drives the update without Trainer.train(), which is what turns checkpointing on
            + (", activation checkpointing on (as `train` runs)" if c.get("gradient_checkpointing") == "on" else
               ", no activation checkpointing (`train` checkpoints by default: each side's backward recomputes "
               "less here than in training)"))
    placed = x.get("placements", {})
    order = [side for side in c.get("injectors") or [] if side in placed] or list(placed)  # the run's order
    rows = [["GRPO (lambda 0)", f"{x['grpo_update_s']:.1f}", f"{x['grpo_score_s']:.1f} (reference)"]]
    if len(placed) > 1:  # one SEED row and ratio per skill placement, all against the one GRPO
        for side in order:
            p = placed[side]
            where = f"{placement(side)}: teacher prompt shares {p['shared_with_row_prompt_per_row']:.0f} " \
                    f"of its {p['teacher_prompt_tokens_per_row']:.0f} tokens with the row's"
            fused = "fused_rows" in p
            rows += [[f"SEED (lambda {c['opd_coef']:g}), {where}", f"{p['seed_update_s']:.1f}",
                      f"{p['seed_score_s']:.1f} (reference; the teacher inside the loss, {p['fused_rows']:.0%} of its "
                      f"rows fused)" if fused else f"{p['seed_score_s']:.1f} (teacher + reference)"],
                     [f"ratio SEED/GRPO, {placement(side)}", f"{p['ratio']:.3f}",
                      goal_words(p["ratio"], SEED_GRPO_GOAL, at_most=True)]]
    else:
        rows += [[f"SEED (lambda {c['opd_coef']:g})", f"{x['seed_update_s']:.1f}",
                  f"{x['seed_score_s']:.1f} (teacher + reference)"],
                 ["ratio SEED/GRPO", f"{x['ratio']:.3f}", goal_words(x["ratio"], SEED_GRPO_GOAL, at_most=True)]]
    return [source_line(r, what), "",
            *table(["update (median of %d, interleaved)" % n, "seconds", "of which scoring"], rows),
            *(["", "Tokens each scoring pass computes, as the trainer chunks its rows (load cannot move them): "
                   f"reference {x['reference_tokens_scored']}; teacher " + ", ".join(
                       f"{placement(side)} {placed[side]['teacher_tokens_scored']}" for side in order) + "."]
              if "reference_tokens_scored" in x else []),
            "", f"Analyzer: {x['analyzer_calls']} calls, busy {x['analyzer_busy_s']:.1f} s summed over its concurrent "
                f"calls ({x['analyzer_busy_s'] / x['iteration_s']:.0%} of the iteration's {x['iteration_s']:.1f} s: "
                f"collect {x['collect_s']:.1f} s + SEED update); a call in flight for "
                f"{x['analyzer_wall_s'] / x['iteration_s']:.0%} of the iteration's wall time."]


def gateway_overhead(results: dict[str, Result]) -> list[str]:
    r = one(results, "gateway_overhead")
    c, x = r.config, r.results
    lat = x["latency"]
    names = {"vllm-chat": "vLLM chat endpoint", "vllm-ids": "vLLM `/v1/completions`, token ids + logprobs",
             "gateway": "through the gateway (stored)"}
    what = f"{c['calls']} sequential calls per path, max {c['max_tokens']} tokens, greedy"
    out = [source_line(r, what), "",
           *table(["path", "p50 ms", "p99 ms", "mean ms"],
                  [[names[k], f"{lat[k]['p50_ms']:.1f}", f"{lat[k]['p99_ms']:.1f}", f"{lat[k]['mean_ms']:.1f}"]
                   for k in names]),
           ""]
    g = lat["gateway"]
    ratios = [f"vs {names[b]}: p50 x{g['p50_ms'] / lat[b]['p50_ms']:.2f} ({g['p50_ms'] - lat[b]['p50_ms']:+.1f} ms), "
              f"p99 x{g['p99_ms'] / lat[b]['p99_ms']:.2f}" for b in ("vllm-ids", "vllm-chat")]
    out.append("Through the gateway " + "; ".join(ratios) + ".")
    shape = x["store_call_shape"]
    out += ["", *table([f"store inserts/s ({shape['prompt_tokens']} prompt + {shape['completion_tokens']} completion "
                        f"tokens, {c['store_calls']} calls a run)", "1 writer", "4 writers"],
                       [[label, *(f(v.get(k), ".0f") if v.get(k) is not None else "unavailable" for k in ("1", "4"))]
                        for label, v in x["store_inserts_per_s"].items()])]
    return out


def update_memory(results: dict[str, Result], name: str = "update_memory") -> list[str]:
    """Peak RSS and update time with and without the recompute (bench/update_memory.py; its
    ``--demo`` form: the embedded demo's iteration)."""
    r = one(results, name)
    c, x = r.config, r.results
    med = x["median"]
    pairs = len(x["runs"]) // 2
    rows = [[side, f"{med[side]['peak_rss_gb']:.2f} GB", f"{med[side]['update_s']:.1f} s"] for side in ("off", "on")]
    rows.append(["on/off", f"{x['rss_on_over_off']:.2f}x", f"{x['update_on_over_off']:.2f}x"])
    what = "the embedded demo's iteration (stage 1 not run)" if c.get("demo") else "one training iteration"
    return [source_line(r, f"{what} per run, median of {pairs} alternating pair(s), {c['threads']} torch threads"
                           + (f"; {c['note']}" if c.get("note") else "")), "",
            *table(["gradient checkpointing (recompute)", "peak RSS", "update time"], rows)]


def activation_trim(results: dict[str, Result]) -> list[str]:
    """A forward and backward kept or recomputed, with and without the heap trim after each
    (bench/activation_trim.py)."""
    r = one(results, "activation_trim")
    c, x = r.config, r.results
    rows = [[way, f"{x['median_s'][way]:.2f} s", ", ".join(f"{p:.2f}" for p in passes)]
            for way, passes in x["passes"].items()]
    return [source_line(r, f"SmolLM2 forward and backward, {c['rows']} rows x {c['tokens']} tokens, {c['dtype']}, "
                           f"median of {c['repeats']} passes a way" + (f"; {c['note']}" if c.get("note") else "")), "",
            *table(["way", "median", "passes (s)"], rows), "",
            f"Kept over recomputed: {x['kept_over_recompute']:.2f}x without the trim, "
            f"{x['kept_over_recompute_trimmed']:.2f}x with it."]


def run_memory(results: dict[str, Result]) -> list[str]:
    """A learning run's training with freed heap memory given back and kept (bench/run_memory.py)."""
    r = one(results, "run_memory")
    c, x = r.config, r.results
    med = x["median"]
    runs = {side: [s for s in x["runs"] if s["release_memory"] == (side == "on")] for side in ("off", "on")}
    rows = [[side, f"{med[side]['peak_rss_gb']:.2f} GB", f"{med[side]['step_s']:.1f} s",
             " / ".join(f"{s['wall_s'] / 60:.1f}" for s in runs[side])] for side in ("off", "on")]
    rows.append(["on/off", f"{x['rss_on_over_off']:.2f}x", f"{x['step_on_over_off']:.2f}x", ""])
    same = "the same" if x["same_batches"] else "NOT the same"
    return [source_line(r, f"the learning curve's GRPO training, {c['updates']} updates of 4 tasks x group {c['group']} "
                           f"per run, {len(runs['on'])} run(s) a side alternating, no held-out evaluation"
                           + (f"; {c['note']}" if c.get("note") else "")), "",
            *table(["`trainer.release_memory`", "peak RSS", "median update", "wall per run (min)"], rows),
            "", f"Both sides logged {same} rows and losses, update for update."]


def main_job(results: dict[str, Result], name: str = "main_job") -> list[str]:
    """The README's main job from the default command, and GRPO from the same start (bench/main_job.py)."""
    r = one(results, name)
    x, t = r.results, r.results["targets"]
    rows = []
    for name, side in x["sides"].items():
        h = side["summary"].get("heldout") or {}
        b, a = h.get("before") or {}, h.get("after") or {}
        label = "`seed-agents train` (SEED)" if name == "default" else "the same, `--skills.source none` (GRPO)"
        rows.append([label, f"{f(b.get('success_rate'), '.2f')} -> {f(a.get('success_rate'), '.2f')}",
                     f(h.get("gain"), "+.2f"), f"{f(b.get('tool_share'), '.2f')} -> {f(a.get('tool_share'), '.2f')}",
                     f"{f(b.get('markup_share'), '.2f')} -> {f(a.get('markup_share'), '.2f')}",
                     " ".join(f"{v:.2f}" for v in side["summary"].get("training_success", [])),
                     f"{side['wall_s'] / 60:.1f} min", f"{side['peak_rss_gb']:.2f} GB", str(side["exit"])])
    what = ("the default command and GRPO from the same start, one seed each, each in its own process"
            if "grpo" in x["sides"] else "the default command alone, one seed, in its own process")
    lines = [source_line(r, what + (f"; {r.config['note']}" if r.config.get("note") else "")), "",
             *table(["run", "held-out success (greedy)", "gain", "called the right tool", "answers with markup",
                     "training success per update", "wall", "peak RSS", "exit"], rows)]
    if "default" in x["sides"]:
        d = x["sides"]["default"]
        gain = (d["summary"].get("heldout") or {}).get("gain")
        lines += ["", "Targets, the default command alone: held-out gain "
                  + ("not measured" if gain is None else goal_words(gain, t["gain_at_least"], at_most=False))
                  + f"; wall {goal_words(d['wall_s'] / 60, t['wall_s_at_most'] / 60, at_most=True)} min"
                  + f"; peak RSS {goal_words(d['peak_rss_gb'], t['peak_rss_gb_at_most'], at_most=True)} GB."]
    if x.get("default_minus_grpo") is not None:
        lines += ["", f"SEED minus GRPO, held-out gain: {x['default_minus_grpo']:+.2f} (one seed each: no test)."]
    return lines


#: the local backend's engine options (seed_agents.backends.engine): a bench's ``local_engine``
#: section, and backend keys in the files written while they were in the user config
ENGINE_KEYS = ("reuse_kv", "prefix_groups", "kv_cache", "drop_finished")


def side_flags(settings: dict[str, Any]) -> str:
    """A side's settings as the flags that set them, and its engine options as ``engine.<key>
    <value>`` (no flag sets those): {"backend": {"kv_cache": "concat"}, "trainer": {"sampled_head":
    False}} -> "engine.kv_cache concat --no-trainer.sampled-head"."""
    flags = []
    for section, values in settings.items():
        for key, value in values.items():
            if section == "local_engine" or (section == "backend" and key in ENGINE_KEYS):
                flags.append(f"engine.{key} {str(value).lower() if isinstance(value, bool) else value}")
                continue
            flag = f"{section}.{key}".replace("_", "-")
            flags.append(f"--no-{flag}" if value is False else f"--{flag}" if value is True else f"--{flag} {value}")
    return " ".join(flags)


def demo_speed(results: dict[str, Result], name: str = "demo_speed") -> list[str]:
    """The README's first command on each path: stage 1 and one iteration, against the first side."""
    r = one(results, name)
    c, x = r.config, r.results
    sides = [s for s in c["sides"].split(",") if s in x["iteration_s"]]
    base = sides[0]
    names = {"before": "before (fp32, every prompt whole, TRL's padded update and SFT head)",
             "fp32": "fp32 (`--backend.precision float32`, the README's command before auto)",

             # the files before 2026-12-07 ran the README's command in fp32, those after in auto
             "default": "default (the README's command when run)", "auto": "`--backend.precision auto` (bf16 attention)",
             "auto-attn32": "`--backend.precision auto --backend.attention float32`"}
    if "previous" in c.get("side_settings", {}):  # what `previous` switched back changed over time
        names["previous"] = f"previous (`{side_flags(c['side_settings']['previous'])}`: the README's command, these switched back)"
    if "keep" in c.get("side_settings", {}):
        names["keep"] = f"keep (`{side_flags(c['side_settings']['keep'])}`: the README's command, activations kept where they fit)"
    stage1 = x.get("stage1", {})
    rows = []
    for side in sides:
        its = x["iterations"][side]
        rollout = statistics.median(i["time/rollout_s"] for i in its)
        s1 = stage1.get(side)
        rows.append([names.get(side, side),
                     "-" if s1 is None else f"{s1['stage1_s']:.0f} s ({s1['collect_s']:.0f} + {s1['sft_s']:.0f})",
                     "-" if side == base or s1 is None else f"{x['stage1_ratio'][side]:.2f}",
                     f"{x['iteration_s'][side]:.0f} s", f"{rollout:.0f} s",
                     "-" if side == base else f"{x['iteration_ratio'][side]:.2f}"])
    built = ("stage 1 not timed (--no-stage1), " if c.get("no_stage1") else "stage 1 built once per side, ")
    what = (f"the embedded demo (TextWorld, SmolLM2-135M, full fine-tuning), {built}"
            + (f"{c['repeats']} iteration(s) per side" if c.get("run_iterations", 1) == 1 else
               f"{c['repeats']} run(s) of {c['run_iterations']} iterations per side, a run's iteration the median of its own")
            + " from one stage-1 model" + (f"; {c['note']}" if c.get("note") else ""))
    lines = [source_line(r, what), "",
             *table(["path", "stage 1 (collect + SFT)", f"vs {base}", "one iteration", "of which rollouts", f"vs {base}"],
                    rows), ""]
    def words(kind: str, side: str) -> str:
        ratio = x[f"{kind}_ratio"][side]
        return f"{ratio:.2f}x ({goal_words(ratio, x[f'{kind}_goal'], at_most=True)})"

    verdicts = [f"`{side}` iteration {words('iteration', side)}"
                + (f", stage 1 {words('stage1', side)}" if side in x.get("stage1_ratio", {}) else "")
                for side in sides[1:]]
    return lines + [f"Against `{base}`: " + "; ".join(verdicts) + "."]


def webshop_index(results: dict[str, Result]) -> list[str]:
    r = one(results, "webshop_index")
    c, x = r.config, r.results
    what = (f"{c['source']}, {x['documents']:,} documents" +
            (f" x {c['words']} words, Zipf s={c['zipf']:g} over {c['vocab']:,} words" if c.get("data_dir") is None else "")
            + f", {x['queries']} queries")
    return [source_line(r, what), "",
            *table(["build (one core)", "documents/s", "indexed words/s", "peak RSS before / after the build"],
                   [[f"{x['build_s']:.1f} s", f"{x['documents_per_s']:,.0f}", f"{x['words_per_s']:,.0f}",
                     f"{x['peak_rss_gb_before_build']:.2f} / {x['peak_rss_gb_after_build']:.2f} GB"]]),
            "",
            *table(["search, top 50", "median ms", "p95 ms"],
                   [["numpy scorer (the index's)", f"{x['numpy_median_ms']:.1f}", f"{x['numpy_p95_ms']:.1f}"],
                    ["plain-Python reference loop", f"{x['reference_median_ms']:.1f}", f"{x['reference_p95_ms']:.1f}"]]),
            "", f"Speedup x{x['speedup_median']:.1f} (median); the same top 50 on {x['same_top50']}/{x['queries']} queries."]


def sample_efficiency(results: dict[str, Result]) -> list[str]:
    r = one(results, "sample_efficiency")
    c, x = r.config, r.results
    s = x["summary"]
    th = c["threshold"]

    def ms(v: list[float]) -> str:
        return f"{v[0]:.3f} ± {v[1]:.3f}"

    final_at = max((p["episodes"] for m in s.values() for p in m["curve"]), default=0)
    rows = []
    for m, v in s.items():
        reached = [f"{e}" for e in v["to_threshold"].values() if e is not None]
        rows.append([f"`{m}`", ms(v["start"]), ms(v["area"]), ms(v["final"]), f"{v['gain'][0]:+.3f} ± {v['gain'][1]:.3f}",
                     v["reached"] + (f" (at {', '.join(reached)} episodes)" if reached else "")])
    what = (f"TextWorld eval_seen, {c['eval_tasks']} games per seed, greedy; {c['iterations']} updates of "
            f"{c['tasks_per_iteration']} tasks x {c['group']} episodes; seeds {', '.join(map(str, c['seeds']))}; "
            f"mean ± sd over seeds")
    out = [source_line(r, what), "",
           *table(["method", "start", "mean over the curve", f"final ({final_at} episodes)", "final - start",
                   f"seeds reaching {th:g}"], rows), ""]
    for name, p in x["paired"].items():
        if p.get("p_t") is None and p["n"] > 1:  # written before the tests: its n, mean and sd give the t-test
            t_ci, p_t = t_test(p["n"], p["mean"], p["sd"])
            p = {**p, "t_ci": t_ci, "p_t": p_t, "p_sign": sign_test(p["higher"], p["lower"])}
        ci = "n/a" if p["ci"] is None else f"[{p['ci'][0]:+.3f}, {p['ci'][1]:+.3f}]"
        need = "no effect to detect" if p["seeds_needed"] is None else f"{p['seeds_needed']} seeds"
        out.append(f"- paired by seed, `{name}`: {p['mean']:+.3f} ± {p['sd']:.3f} over {p['n']} seeds ({p['higher']} "
                   f"higher, {p['lower']} lower, {p['equal']} equal); 95% bootstrap CI {ci}"
                   + (f"; {paired_tests(p)}" if paired_tests(p) else "") + "; to detect it "
                   f"(paired t, alpha 0.05, power 0.8): {need}")
    return out


def skill_usefulness(results: dict[str, Result]) -> list[str]:
    r = one(results, "skill_usefulness")
    c, x = r.config, r.results
    rows = []
    for row in x["rows"]:
        rerun = (f"{f(row.get('rerun_success_with'), '.2f')} / {f(row.get('rerun_success_without'), '.2f')}"
                 if row.get("rerun_episodes") else "-")
        rows.append([row["analyzer"], f"{row['valid']}/{row['examples']}", f(row.get("delta_success"), "+.3f"),
                     f(row.get("delta_failure"), "+.3f"), f(row.get("margin"), "+.3f"),
                     f"{f(row.get('paired_win_rate'), '.2f')} ({row.get('n_pairs', 0)})", rerun])
    what = (f"policy: the stage-1 model of {c['model']}, {c['num_tasks']} {c['split']} games x {c['group']} episodes at T={c['temperature']:g}; "
            f"re-run {c['rerun_tasks']} tasks x {c['rerun_episodes_per_task']} episodes")
    return [source_line(r, what), "",
            *table(["analyzer", "valid skills", "shift on successes", "shift on failures", "margin (want > 0)",
                    "paired wins (pairs)", "re-run success with / without"], rows)]


def atlas_skills(results: dict[str, Result], name: str = "atlas_skills") -> list[str]:
    r = one(results, name)
    c, x = r.config, r.results
    rows = []
    for name, s in x["summary"].items():
        ci = s.get("margin_ci95")
        rows.append([name, f"{s['valid']}/{s['examples']}", f(s.get("delta_success"), "+.3f"), f(s.get("delta_failure"), "+.3f"),
                     f(s.get("margin"), "+.3f"), "-" if not ci else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]",
                     f"{f(s.get('paired_win_rate'), '.2f')} ({s.get('n_pairs', 0)})",
                     # files before the figure existed have no "names"
                     " / ".join(f(s["names"][k], ".2f") for k in ("names_tool", "names_args", "names_answer"))
                     if s.get("names") else "-",
                     f(s.get("copies_example"), ".2f")])  # None in files before the figure existed
    counts = x.get("counts") or {}
    what = (f"the base policy {c['model']} on {c['tasks']} atlas level-0 training tasks x {c['group']} episodes at "
            f"T {c['temperature']:g} (first turn forced), {counts.get('policy_calls', '?')} policy calls scored, "
            f"{counts.get('render_mismatches', '?')} re-rendered differently; "
            f"{'paired check on' if c.get('paired') else 'no paired check'}" + (f"; {c['note']}" if c.get("note") else ""))
    return [source_line(r, what), "",
            *table(["analyzer", "valid skills", "shift on successes", "shift on failures", "margin (want > 0)",
                    "95% CI over tasks", "paired wins (pairs)", "valid skills naming the tool / arguments / answer",
                    "valid skills opening with the example's \"string\""],
                   rows)]


def determinism(results: dict[str, Result]) -> list[str]:
    r = one(results, "determinism")
    c, x = r.config, r.results

    def same(runs: dict[str, Any]) -> str:
        if runs["identical"]:
            return "identical (ids, logprobs, rewards)"
        gap = runs.get("max_logprob_gap")
        return ("token ids differ" if not runs["token_ids_equal"] else f"logprobs differ by up to {gap:.1e}") + \
            ("" if runs["rewards_equal"] else ", rewards differ")

    what = (f"{c['model']}, env {c['env']}, {x['episodes']} episodes ({c['tasks']} tasks x {c['group']}) x "
            f"{c['max_turns']} turns, concurrency {c['concurrency']}, T={c['temperature']:g}, "
            f"{c['repeats']} interleaved repeats per mode")
    return [source_line(r, what), "",
            *table(["batching", "wall s (each repeat)", "median s", "two runs of the same seed"],
                   [["arrival time (unseeded runs)", ", ".join(f"{v:.1f}" for v in x["arrival_s"]),
                     f"{x['arrival_median_s']:.1f}", same(x["arrival_runs_compared"])],
                    ["lockstep (seeded runs)", ", ".join(f"{v:.1f}" for v in x["seeded_s"]),
                     f"{x['seeded_median_s']:.1f}", same(x["seeded_runs_compared"])]]),
            "", f"Ratio lockstep / arrival time: {x['ratio']:.3f} ({goal_words(x['ratio'], x['goal'], at_most=True)}); "
                "the repeats spread widely because other jobs shared the 2 cores."]


def tool_agent(results: dict[str, Result]) -> list[str]:
    r = one(results, "tool_agent")
    c, x = r.config, r.results
    what = (f"atlas tool agent, {c['model']}, {len(c['seeds'])} seed(s), {c['iterations']} updates of "
            f"{c['tasks_per_iteration']} tasks x {c['group']} episodes, {c['eval_tasks']} held-out tasks, greedy eval")
    rows = []
    for method, runs in x["per_seed"].items():
        vals = list(runs.values())

        def ms(key: str) -> str:
            got = [v[key] for v in vals if v.get(key) is not None]
            if not got:
                return "-"
            mean = sum(got) / len(got)
            spread = (sum((g - mean) ** 2 for g in got) / (len(got) - 1)) ** 0.5 if len(got) > 1 else 0.0
            return f"{mean:.3f} ± {spread:.3f}"

        rows.append([method, str(len(vals)), ms("start"), ms("final"), ms("gain"), ms("train_success"),
                     ms("skill_parse_rate") if method != "grpo" else "- (writes none)"])
    out = [source_line(r, what), "",
           *table(["method", "seeds", "held-out start", "held-out final", "gain", "training success (T=0.7)",
                   "skill parse rate"], rows), ""]
    for key in ("final", "gain"):
        p = x["paired"][key]
        if not p.get("diffs"):
            out.append(f"Paired SEED - GRPO ({key}): no seed has both runs.")
            continue
        ci = p.get("ci95") or [None, None]
        ci_text = "n/a (one seed)" if len(p["diffs"]) < 2 or ci[0] is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"
        need = p.get("seeds_needed")
        diffs = dict(enumerate(p["diffs"]))
        tests = paired_tests(compare(diffs, dict.fromkeys(diffs, 0.0)))  # the stored differences, tested against 0
        out.append(f"Paired by seed, SEED - GRPO held-out {key}: {p['mean']:+.3f}, 95% bootstrap CI {ci_text}, "
                   + (f"{tests}, " if tests else "") +
                   f"seeds a paired test would need: {'n/a' if need is None else need}.  ")
    out[-1] = out[-1].rstrip()
    return out


def continual_atlas(results: dict[str, Result]) -> list[str]:
    """One loop cycle on the atlas family: does the signal GRPO needs reach the update?"""
    r = one(results, "continual_atlas")
    c, x = r.config, r.results
    rp, canary, step = x["replays"], x["canary"]["by_side"], x["training"]["step"]
    what = (f"{x['model']}, atlas level {c['level']}, first turn forced to `{c['tool_choice']}`; {c['sessions']} sessions x "
            f"G={c['group_size']} replays, canary {c['canary']} held-out tasks x {c['canary_seeds']} seed, one cycle")
    rows = [["replays with a tool call", f"{rp['with_tool_call']}/{rp['replays']}"],
            ["replays: right calls / right answer", f"{rp['right_calls']:.0%} / {rp['right_answer']:.0%}"],
            ["groups with unequal rewards", f"{rp['groups_unequal']}/{rp['groups']} (zero-variance fraction {rp['zero_variance_fraction']:.0%})"],
            ["writes that reached production", str(rp["requests"]["live_writes"])],
            ["canary episodes with a tool call", f"{sum(s['with_tool_call'] for s in canary.values())}/{x['canary']['episodes']}"],
            ["canary solved, promoted vs candidate", f"{canary['promoted']['successes']}/{canary['promoted']['episodes']} vs "
                                                     f"{canary['candidate']['successes']}/{canary['candidate']['episodes']}"],
            ["gate", x["gate"]["summary"].removeprefix("gate: ")],
            ["time: replays / update / canary + gate", " / ".join(f"{x['phases_s'][k]:.0f} s" for k in ("replays", "train", "load_canary_gate"))],
            ["update rows, skills parsed", f"{step['rows']:.0f} rows, {step['skill_parse_rate']:.0%}"]]
    return [source_line(r, what), "", *table(["one cycle", "measured"], rows)]


def continual_demo(results: dict[str, Result]) -> list[str]:
    return _continual_demo_body(one(results, "continual_demo"))


#: Issue 22's target for the atlas demo, as ``bench/continual_demo.py`` (GOAL_GAIN) prints it.
ATLAS_DEMO_GOAL = 0.10


def continual_demo_atlas(results: dict[str, Result]) -> list[str]:
    """The demo's table on the atlas, then what issue 22 asks of it: each version's canary,
    the last promoted version against v0 played again (levels apart), the gate's power."""
    r = one(results, "continual_demo_atlas")
    x = r.results
    out = _continual_demo_body(r)
    out += ["", "Canary mean per version, each time it was played: " + "; ".join(
        f"{v} {' / '.join(f'{m:.3f}' for m in ms)}" for v, ms in x["canary_by_version"].items()) + "."]
    gp = x["gate_power"]
    out += ["", "Gate power: not estimable (no trained candidate's canary differed from its baseline on any task)." if not gp
            else f"Gate power at {gp['n_tasks']} canary tasks (per-task difference sd {gp['sd']:.3f}, pooled over "
                 f"{gp['pooled_differences']} differences): it promotes with {gp['power']:.0%} probability a candidate "
                 f"better than {gp['promotes_above']:+.3f} and rejects one worse than {gp['rejects_below']:+.3f}."]
    out += _anchor_replay(x)
    fc = x["final_check"]
    if not fc:
        return out + ["", f"Last promoted version vs v0: no version was promoted; goal (>= +{ATLAS_DEMO_GOAL:.2f}, CI excluding 0): "
                          "missed."]
    lo, hi = fc["ci95"]
    met = fc["mean_diff"] >= ATLAS_DEMO_GOAL and lo is not None and lo > 0
    out += ["", f"Last promoted v{fc['version']} vs v0, both played again on the {fc['n_tasks']} canary tasks: "
                f"{fc['v0_mean']:.3f} -> {fc['final_mean']:.3f}, paired difference {fc['mean_diff']:+.3f}, 95% bootstrap CI "
                f"[{lo:+.3f}, {hi:+.3f}] over tasks; goal (>= +{ATLAS_DEMO_GOAL:.2f}, CI excluding 0): {'met' if met else 'missed'}."]
    if fc.get("levels"):
        out += ["", *table(["canary, greedy", "a call parsed", "the right calls", "the right answer", "episodes"],
                           [[label, f"{lv['parsed']:.0%}", f"{lv['right_calls']:.0%}", f"{lv['right_answer']:.0%}",
                             str(lv["episodes"])]
                            for label, lv in (("v0", fc["levels"]["promoted"]),
                                              (f"v{fc['version']}", fc["levels"]["candidate"]))])]
    return out


def _anchor_replay(x: dict[str, Any], anchor_margin: float = 0.1) -> list[str]:
    """What ``gate.anchor_margin`` would have said in a run made without it, replayed from
    the stored per-task differences: each promoted version against v0 is the sum of the
    differences along its chain of promotions, which holds where a version's canary replays
    agree (a greedy canary, one seed: the file's per-version means say whether they did)."""
    from seed_agents.continual.gate import CanaryResult, GateConfig, decide

    if x["loop_config"]["canary_seeds"] != 1 or x["loop_config"]["gate"].get("anchor_margin") is not None:
        return []
    promoted = sorted((d for d in x["decisions"] if d["action"] == "promote"), key=lambda d: d["cycle"])
    if not promoted or promoted[0]["baseline"] != 0:
        return []
    # floor off: the zero side is a stand-in for v0, not its score, so "both at the floor" means nothing here
    cfg = GateConfig(**{**x["loop_config"]["gate"], "margin": anchor_margin, "floor": None})
    chained: dict[str, float] = dict.fromkeys(promoted[0]["per_task"], 0.0)
    verdicts = []
    for d in promoted:
        chained = {t: chained[t] + d["per_task"].get(t, 0.0) for t in chained}
        zero = [CanaryResult(task_id=t, seed=0, reward=0.0) for t in chained]
        vs = decide(zero, [CanaryResult(task_id=t, seed=0, reward=v) for t, v in chained.items()], cfg)
        verdicts.append((d["version"], vs))
    low_v, low = min(verdicts, key=lambda p: p[1].mean_diff or 0.0)
    turned = [f"v{v}" for v, vs in verdicts if not vs.promote]
    return ["", f"Anchor check replayed (the gate's anchor_margin, not set in this run): chaining each promotion's "
                f"per-task differences back to v0, the lowest promoted version was v{low_v} at {low.mean_diff:+.3f} "
                f"against v0 ({low.config.confidence:.0%} lower bound {low.ci_low:+.3f}); an anchor margin of "
                f"{anchor_margin:g} would have rejected " + (", ".join(turned) if turned else "none of them") +
                f" ({len(verdicts)} promotions)."]


def _continual_demo_body(r: Result) -> list[str]:
    c, x = r.config, r.results
    loop = x["loop_config"]
    serving = {"vllm+gateway": "vLLM CPU server with runtime LoRA behind the capture gateway",
               "local": "in process (no vLLM, no gateway)"}[x["serving"]]
    what = (f"{c['model']}, served {serving}; {len(x['cycles'])} cycles of {loop['sessions_per_cycle']} sessions x "
            f"G={loop['group_size']} replays, canary {loop['canary_tasks']} tasks x {loop['canary_seeds']} seeds, "
            f"gate margin {loop['gate']['margin']:g} at confidence {loop['gate']['confidence']:g}")
    traffic = [[version, str(v["sessions"]), f"{v['success']:.0%}"] for version, v in x["traffic_by_version"].items()]
    decisions = [[f"v{d['version']} vs v{d['baseline']}" + (" (forced regression)" if d["forced_regression"] else ""),
                  d["action"], f"{d['candidate_mean']:.2f} vs {d['promoted_mean']:.2f}",
                  f"{d['mean_diff']:+.3f}", f"{d['ci_low']:+.3f}", f"{d['n_tasks']} / {d['n_pairs']}"]
                 for d in x["decisions"]]
    lat = x["reward_to_promotion_s"].get("summary")
    prod = x["production_requests"]
    fr = x["forced_regression"]
    out = [source_line(r, what), ""]
    if x.get("serving_note"):
        out += [f"Serving note: {x['serving_note']}", ""]
    out += [*table(["version that served the traffic", "sessions", "success"], traffic), "",
            *table(["candidate", "decision", "canary mean (candidate vs promoted)", "mean difference",
                    "lower bound", "tasks / pairs"], decisions), "",
            f"Forced regression: {'v' + str(fr['version']) + ' ' + fr['action'] + 'ed' if fr else 'not run'}. "
            f"Mutating requests that training replays and canaries sent to production: "
            f"{prod['mutating_from_training']} (users' own: {prod['mutating_from_traffic']}). "
            "Reward to a promoted version trained on it: " +
            (f"median {lat['median']:.0f} s (min {lat['min']:.0f}, max {lat['max']:.0f}) over "
             f"{len(x['reward_to_promotion_s']['sessions'])} sessions." if lat else "no promotion.")]
    return out


def roofline(results: dict[str, Result], name: str = "roofline") -> list[str]:
    r = one(results, name)
    x = r.results
    flags = ", ".join(x["cpu_flags"]) or "none of avx2/avx512/amx"
    what = (f"{x['threads']} threads, torch kernels {x['cpu_capability']} (flags: {flags})"
            + (f"; {x['note']}" if x.get("note") else ""))
    rows = []
    for name, c in x["ceilings"].items():
        mm = x["matmul_gflops"][name]
        d = c["decode_tokens_per_s"]
        rows.append([name, f"{mm['square_2048']['best']:.1f}", f"{mm['mlp_prefill_2048']['best']:.1f}",
                     f"{mm['mlp_decode_8']['best']:.1f}", f"{d['1']:.0f} / {d['8']:.0f} / {d['32']:.0f}",
                     f"{c['prefill_tokens_per_s']:.0f}", f"{c['train_tokens_per_s']:.0f}"])
    return [source_line(r, what), "",
            *table(["dtype", "matmul GFLOP/s, 2048 square", "SmolLM2 MLP, 2048 rows", "SmolLM2 MLP, 8 rows",
                    "decode tok/s ceiling, batch 1 / 8 / 32", "prefill tok/s ceiling", "train tok/s ceiling"], rows),
            "", f"Memory bandwidth (copy of {r.config['copy_mb']} MB, read + write): {x['copy_gbps']['best']:.1f} GB/s best, "
                f"{x['copy_gbps']['median']:.1f} GB/s median."]


def logprob_gap(results: dict[str, Result]) -> list[str]:
    r = one(results, "logprob_gap")
    c = r.config
    what = (f"TextWorld, {c['tasks']} tasks x {c['group']} episodes, {c['max_turns']} turns, T {c['temperature']:g}; "
            f"sampled by the local backend, recomputed as TRL scores rows")
    rows = [[f"{m['mode']} ({m['why']})", str(m["tokens"]), f"{m['mean_abs_gap']:.2e}", f"{m['median_abs_gap']:.2e}",
             f"{m['max_abs_gap']:.2e}", f"{m['ratio_outside_clip']:.3f}"] for m in r.results["modes"]]
    return [source_line(r, what), "",
            *table(["mode", "sampled tokens", "mean abs gap", "median abs gap", "max abs gap",
                    f"first-step ratio outside [{1 - c['clip_eps']:g}, {1 + c['clip_eps']:g}]"], rows)]


def rollout_throughput(results: dict[str, Result]) -> list[str]:
    r = one(results, "rollout_throughput")
    c, x = r.config, r.results
    what = (f"{c['tasks']} tasks x group {c['group']} per workload, T {c['temperature']:g}, median of {c['repeats']} "
            f"interleaved repeats" + (f"; {x['note']}" if x.get("note") else ""))
    # both ceilings from docs/results/roofline.json (the fp32 ones, as a common yardstick), not the
    # file the run happened to read: a roofline re-measured on the run's machine corrects both
    fp32 = roofline_for(results, r).results["ceilings"]["fp32"]
    prefill, decode = fp32["prefill_tokens_per_s"], fp32["decode_tokens_per_s"]["8"]
    rows = []
    for key, s in x["summary"].items():
        workload, path = key.split("/")
        frac = f"{s['generated_tokens_per_s'] / decode:.2f}"
        processed = (s["prompt_tokens_per_s"] + s["generated_tokens_per_s"]) / prefill
        rows.append([workload, f"{path} ({x['paths'][path]})", f"{s['episodes_per_s']:.3f}",
                     f"{s['generated_tokens_per_s']:.1f}", f"{s['prompt_tokens_per_s']:.0f}", frac, f"{processed:.2f}"])
    return [source_line(r, what), "",
            *table(["workload", "path", "episodes/s", "generated tok/s", "prompt tok/s",
                    "generated, of the fp32 decode ceiling (batch 8)", "prompt + generated, of the fp32 prefill ceiling"],
                   rows)]


DECODE_GOAL = 0.5  # issue 21: rollout decode at half the bandwidth ceiling or more
DECODE_WAYS = {"forward": "the bare model step (plain loop)", "generate": "transformers' generate",
               "backend": "LocalBackend (the rollouts' path)",
               "backend-concat": "LocalBackend, kv_cache concat (transformers' cache)",
               "backend-static": "LocalBackend, kv_cache static"}


def decode_profile(results: dict[str, Result]) -> list[str]:
    r = one(results, "decode_profile")
    c, x = r.config, r.results
    what = (f"{c['prompt']}-token prompts, {c['new']} new tokens a row, median of {c['repeats']}"
            + (f"; {x['note']}" if x.get("note") else ""))
    rows = [[run["dtype"], str(run["batch"]), DECODE_WAYS.get(way, way), "below noise", "-", "-"]
            if w["step_s"] is None else  # its one-token call took as long as the whole: not measured
            [run["dtype"], str(run["batch"]), DECODE_WAYS.get(way, way), f"{w['step_s'] * 1e3:.1f}", f"{w['tokens_per_s']:.0f}",
             "-" if w["of_ceiling"] is None else f"{w['of_ceiling']:.2f}"
             + (f" ({goal_words(w['of_ceiling'], DECODE_GOAL, at_most=False)})" if way.startswith("backend") else "")]
            for run in x["runs"] for way, w in run["ways"].items()]
    profiles = [f"- {run['dtype']}, batch {run['batch']}: {p['self_cpu_us_per_step'] / 1e3:.1f} ms of self CPU time a "
                f"step over {p['ops_launched_per_step']:.0f} ops, {p['matmul_share']:.0%} in matrix products; most: "
                + ", ".join(f"{o['op']} {o['self_us_per_step'] / 1e3:.1f} ms" for o in p["top"][:4])
                for run in x["runs"] if (p := run.get("profile"))]
    return [source_line(r, what), "",
            *table(["dtype", "batch", "decode by", "ms a step", "tokens/s", "of the decode ceiling"], rows),
            *(["", "The bare step under torch.profiler:", *profiles] if profiles else [])]


def page_faults(results: dict[str, Result]) -> list[str]:
    r = one(results, "page_faults")
    c, x = r.config, r.results
    what = (f"a synthetic LoRA update step of {c['model']} (fp32, {c['rows']} x {c['tokens']} tokens), "
            f"{c['threads'] or 'default'} thread(s), median of {c['repeats']} x {c['steps']} steps, variants "
            f"interleaved" + (f"; {x['note']}" if x.get("note") else ""))
    base = x["median"].get("default")
    rows = [[v, f"{m['faults']:.0f}", f"{m['user_s']:.1f}", f"{m['sys_s']:.2f}",
             f"{m['sys_s'] / (m['user_s'] + m['sys_s']):.3f}", f"{m['wall_s']:.1f}",
             "-" if base is None else f"{m['wall_s'] / base['wall_s']:.2f}"] for v, m in x["median"].items()]
    return [source_line(r, what), "",
            *table(["allocator setting", "minor faults / step", "user s", "kernel s", "kernel share", "wall s",
                    "wall vs default"], rows)]


def skill_scoring_speed(results: dict[str, Result]) -> list[str]:
    r = one(results, "skill_scoring_speed")
    c, x = r.config, r.results
    what = (f"{x['episodes']} atlas level-0 episodes of the base policy at T {c['temperature']:g}, each call scored without "
            f"and with its oracle skill: {x['sequences']} sequences ({x['completion_tokens']} completion tokens), "
            f"{x['distinct_sequences']} distinct ({x['whole_tokens']} tokens); median of {c['repeats']} repeats, "
            f"arms rotated, {c['threads']} threads"
            + (f"; {x['note']}" if x.get("note") else ""))
    why = {"whole": "the former scorer: whole sequences, logits everywhere, batches of 4",
           "completion_logits": f"logits on completions only, batches of {c['batch_size']}",
           "shared_prefix": "as completion_logits, a batch's shared prompt tokens run once: skills eval now"}
    order = [arm for arm in why if arm in x["arms"]] + [arm for arm in x["arms"] if arm not in why]
    rows = [[f"{arm} ({why.get(arm, '')})", f"{a['median_s']:.1f}", str(a["tokens_run"]), f"{a['speedup_vs_whole']:.2f}x",
             f"{a['max_abs_diff_sum']:.1e}", f"{a['max_abs_diff_delta']:.1e}"]
            for arm, a in ((k, x["arms"][k]) for k in order)]
    out = [source_line(r, what), "",
           *table(["scorer", "seconds", "tokens run", "speed-up", "max abs diff of a sequence's log-prob",
                   "max abs diff of an episode's Delta (nats/token)"], rows)]
    if x.get("delta_spread") is not None:
        out += ["", f"For scale: the episodes' Deltas themselves spread by {x['delta_spread']:.3f} nats/token."]
    return out


def atlas_band(results: dict[str, Result], name: str = "atlas_band") -> list[str]:
    """The level probe or a temperature sweep (``--result-name``). Files before the sweep
    existed hold one temperature's ``cells`` and ``temperature`` in their config."""
    r = one(results, name)
    c, x = r.config, r.results
    lo, hi = x["band"]
    by_t = x.get("cells_by_temperature") or {f"{c['temperature']:g}": x["cells"]}
    temps = ", ".join(f"T {t}" for t in by_t)
    what = (f"{c['model']}, {c['tasks']} training tasks x group {c['group']} per cell, {temps}, "
            f"{c['max_turns']} turns, {c['max_tokens']} tokens a turn" + (f"; {c['note']}" if c.get("note") else ""))
    rows = []
    for temperature, cells in by_t.items():
        for mode, levels in cells.items():
            for level, cell in sorted(levels.items()):
                band = "in" if lo <= cell["success"] <= hi else "out"
                rows.append([temperature, mode, level, f"{cell['success']:.2f} ({band})", f"{cell['parsed']:.2f}",
                             f"{cell['right_calls']:.2f}", f"{cell['right_answer']:.2f}",
                             f"{cell['zero_variance_groups']:.2f}", str(cell["episodes"])])
    return [source_line(r, what), "",
            *table(["T", "first turn", "level", f"success (band {lo:g}-{hi:g})", "call parses",
                    "right tool and arguments", "right answer", "groups with zero reward variance", "episodes"], rows)]


def update_throughput(results: dict[str, Result], name: str = "update_throughput") -> list[str]:
    r = one(results, name)
    c, x = r.config, r.results
    lora = f"LoRA r{c['lora_r']}" if c["lora_r"] else "full fine-tuning"
    formats = sorted({v.get("precision", "fp32") for v in x["layouts"].values()}, reverse=True)  # fp32 first
    what = (f"one SEED update on atlas level-0 rows (forced first turn): {x['episodes']} episodes, {x['rows']} rows, "
            f"{x['real_tokens']} real tokens, teacher prompts on {x['rows_with_teacher']}/{x['rows']} rows; {lora}, "
            f"{' and '.join(formats)}, {c['repeats']} timed update(s) per layout" + (f"; {c['note']}" if c.get("note") else ""))
    names = {"trl": "TRL's layout (before)", "chunked": "length-grouped, trimmed", "shared": "+ shared prefix once",
             "shared-nogc": "+ shared prefix, no checkpointing", "shared-bf16": "+ shared prefix, bf16 autocast"}
    order = [k for k in c["layouts"].split(",") if k in x["layouts"]]  # the run's order; the file sorts keys
    first = order[0]
    # read against docs/results/roofline.json (the machine's own ceilings), whatever file the run read
    matmul = roofline_for(results, r).results["matmul_gflops"]
    ceilings = {fmt: matmul[fmt]["mlp_prefill_2048"]["best"] for fmt in formats}

    def rate(v: dict[str, Any], key: str) -> float:
        """Achieved GFLOP/s: stored per layout since bf16 layouts; older files stored only
        the fraction of the run's fp32 ceiling."""
        if "gflops" in v:
            return v["gflops"] * v[key] / v["fraction_of_ceiling"]
        return v[key] * x["ceiling_gflops"]

    def of_ceiling(v: dict[str, Any], key: str) -> float:
        return rate(v, key) / ceilings[v.get("precision", "fp32")]

    rows = [[f"{names.get(k, k)} (`{k}`)", f"{v['median_s']:.1f}", f"{v['vs_first']:.2f}", str(v["train_tokens_computed"]),
             str(v["teacher_tokens_computed"]), f"{rate(v, 'fraction_of_ceiling'):.0f}",
             f"{of_ceiling(v, 'fraction_of_ceiling'):.0%} of {v.get('precision', 'fp32')}",
             f"{of_ceiling(v, 'effective_fraction'):.0%}"]
            for k, v in ((k, x["layouts"][k]) for k in order)]
    fastest = x["layouts"][x["fastest"]]
    best = of_ceiling(fastest, "fraction_of_ceiling")
    spelled = ", ".join(f"{fmt} {ceilings[fmt]:.0f}" for fmt in formats)
    return [source_line(r, what), "",
            *table(["layout", "update s", f"vs `{first}`", "training positions computed", "teacher positions computed",
                    "GFLOP/s on them", f"of the matmul ceiling in its number format ({spelled} GFLOP/s, roofline table)",
                    "effective (all real tokens)"], rows),
            "", f"Fastest: `{x['fastest']}`, {best:.0%} of the {fastest.get('precision', 'fp32')} matmul ceiling "
                f"({goal_words(best, 0.4, at_most=False)})."]


#: How a curve's ``first_turn`` mode reads where it is not "<mode> first turn" (examples/atlas_tasks.py BUILDERS).
TURNS = {"forced-two": "first two turns forced to a tool", "lookup-add": "first turn forced to lookup, second to add"}


def learning_curve(results: dict[str, Result], name: str = "learning_curve") -> list[str]:
    """Held-out success from the start to the end of training, each method, with its CI
    (``name``: the main curve or a variant written with ``--result-name``)."""
    r = one(results, name)
    c, x = r.config, r.results
    seeds = c["seeds"]
    turns = TURNS.get(c["first_turn"], f"{c['first_turn']} first turn")
    what = (f"atlas level {c['level']} ({turns}"
            + (f", guided openings in a share {c['guide_share']:g} of training episodes" if c.get("guide_share") else "")
            + f"), {c['train_tasks']} training / {c['heldout']} "
            f"held-out tasks (disjoint places), {len(seeds)} seed(s), LoRA r{c['lora_r']} lr {c['lr']:g}"
            f"{' constant' if c.get('lr_schedule') == 'constant' else ''}, "
            f"T {c['temperature']:g}, held-out greedy every {c['eval_every']} updates"
            + (f", computing in {c['precision']}" if c.get("precision", "float32") != "float32" else "")
            + (f", attention in {c['attention']}" if c.get("attention", "same") != "same" else "")
            + (f", {c['kv_cache']} KV cache" if c.get("kv_cache", "dynamic") != "dynamic" else "")
            + (f"; {c['note']}" if c.get("note") else ""))

    def ci(v: Any) -> str:
        return "-" if v is None else f"[{v[0]:+.3f}, {v[1]:+.3f}]"

    rows = []
    for method, m in x["methods"].items():
        curve = m["curve"]
        a, b = curve[min(curve, key=int)], curve[max(curve, key=int)]
        # a file written mid-invocation holds fewer runs of a method than the seeds it names
        runs = sum(name.rsplit("-s", 1)[0] == method for name in x.get("runs", {})) or len(seeds)
        rows.append([method, str(m["updates"] // runs),
                     f"{a['right_answer']:.3f} -> {b['right_answer']:.3f}", _gain_cell(r, method, m),
                     f"{a['right_calls']:.3f} -> {b['right_calls']:.3f}", f"{a['parsed']:.3f} -> {b['parsed']:.3f}",
                     f(m["training_success"]), f(m["zero_variance_groups"])])
    out = [source_line(r, what), "",
           *table(["method", "updates per seed", "held-out right answer",
                   "gain, 95% CI (seeds x tasks crossed; t over seeds)",
                   "right tool + arguments", "a call parses", "training success", "groups with zero reward variance"],
                  rows)]
    if x.get("pending"):  # written after a run that trained, before the invocation's last run ended
        out += ["", f"Partial: {len(x['pending'])} run(s) of this invocation not finished when the file was written "
                    f"({', '.join(x['pending'])}); the figures above are over the runs it holds."]
    series = {method: m["curve"] for method, m in x["methods"].items() if len(m["curve"]) > 2}
    if series:  # the points between start and end: whether a curve still climbs, flattens or falls back
        out += ["", "Held-out right answer at each evaluation, mean over seeds: " + "; ".join(
            f"{method}: " + ", ".join(f"update {u} {curve[u]['right_answer']:.3f}" for u in sorted(curve, key=int))
            for method, curve in series.items()) + "."]
    for method, m in x["methods"].items():
        per_seed = m.get("gain_per_seed") or {}
        if len(per_seed) > 1:  # the spread over seeds is what the pooled CI hides
            out += ["", f"{method} held-out gain per seed: "
                        + ", ".join(f"seed {s} {g:+.3f}" for s, g in sorted(per_seed.items(), key=lambda kv: int(kv[0])))
                        + f"; a test of the mean gain over seeds would need {m.get('seeds_needed_for_gain') or '-'} seeds."]
    out += _update_diagnostics(x)
    steps = [m for run in x.get("runs", {}).values() for m in run["metrics"] if "guided_success_rate" in m]
    if steps:  # guided openings: what the steered and the free training episodes scored
        first, last = min(m["update"] for m in steps), max(m["update"] for m in steps)

        def free_at(u: int) -> str:
            return f(mean(m["free_success_rate"] for m in steps if m["update"] == u))

        out += ["", f"Training episodes, mean over every update of every seed: guided "
                    f"{f(mean(m['guided_success_rate'] for m in steps))}, free {f(mean(m['free_success_rate'] for m in steps))}"
                    f" (free at update {first}: {free_at(first)}, at update {last}: {free_at(last)})."]
        opening = [m for m in steps if "guide/first_logp" in m]
        if opening:  # whether the call's opening grows likelier where the agent was free, before greedy flips

            def logp_at(u: int) -> str:
                return f(mean(m["guide/first_logp"] for m in opening if m["update"] == u), "+.2f")

            lo, hi = min(m["update"] for m in opening), max(m["update"] for m in opening)
            out += ["", f"Log-prob of the call's opening token under the policy, where the agent was free to choose "
                        f"(scored before each update, mean over seeds): update {lo} {logp_at(lo)}, update {hi} {logp_at(hi)}; "
                        "a greedy choice flips to a call only once it beats the prose reply's first token."]
    clipped = x.get("clip_frac") or {}
    if clipped:  # the sampler/trainer gap and grammar-masked tokens together (bench/learning_curve.py says why)
        out += ["", "Trained tokens whose PPO ratio started outside the clip (one optimizer step an update; mean over "
                    "updates): " + ", ".join(f"{run} {share:.3f}" for run, share in sorted(clipped.items())) + "."]
    quoted = {run: shares for run, shares in (x.get("quoted_answers") or {}).items() if shares}
    if quoted:  # a right answer in a form no user asked for: the levels above cannot tell
        out += ["", "Final held-out answers that copy a tool's response whole (`<tool_response>` tags included; right by "
                    "the verifier when the number is in it), first and last evaluation: " + "; ".join(
                        f"{run} {shares[min(shares, key=int)]:.2f} -> {shares[max(shares, key=int)]:.2f}"
                        for run, shares in quoted.items()) + "."]
    named = x.get("skill_content") or {}
    if named:  # a skill gives the teacher something to carry only if it names this task's action
        out += ["", "What the valid training skills name about their own task (the tool its calls need / every "
                    "argument / the answer): " + "; ".join(
                        f"{run} {c['names_tool']:.2f} / {c['names_args']:.2f} / {c['names_answer']:.2f} "
                        f"of {c['valid']:.0f}" for run, c in named.items()) + "."]
    out += against_nearest_curve(results, name)
    for key, label in (("seed_minus_grpo", "SEED"), ("seed_oracle_minus_grpo", "SEED with oracle skills (seed-oracle)"),
                       ("seed_episode_minus_grpo", "SEED with skills read off each episode (seed-episode)"),
                       ("seed_success_minus_grpo", "SEED with skills read off successful episodes only (seed-success)"),
                       ("seed_success_generic_minus_grpo",
                        "SEED with one fixed sentence on successes, the control (seed-success-generic)"),
                       ("seed_success_imitate_minus_grpo",
                        "Imitation of successes, the gate off (seed-success-imitate)")):
        d = x.get(key)
        if d:
            method = key.removesuffix("_minus_grpo").replace("_", "-")
            tests = paired_tests(_against_grpo(r, method, d))
            member = _family(results).get(f"{name}:{method}") or {}
            crossed = (f"95% CI over {'seeds x tasks' if d['n'] > 1 else 'tasks'} {ci(member['crossed_ci'])}, "
                       if member.get("crossed_ci") else "")
            holm = claim_words(member.get("claim"))
            out += ["", f"{label} - GRPO, final held-out answer success paired by seed (n={d['n']}): "
                        f"{f(d['mean'], '+.3f')}, {crossed}95% bootstrap CI over seeds {ci(d['ci'])}"
                        f"{f'; {tests}' if tests else ''}{f'; {holm}' if holm else ''}; "
                        f"a paired test would need {d['seeds_needed'] or '-'} seeds."]
    if "grpo" in x["methods"]:
        out += ["", f"Goal (GRPO held-out gain >= +{x['goal']['gain_at_least']:.2f}, 95% CI over seeds and tasks "
                    f"excluding 0): **{x['goal']['verdict']}**."]
    return out


def _finals(r: Result, method: str) -> dict[str, float]:
    """``method``'s final held-out answer success per seed, from the runs ``r`` keeps (the
    last evaluation's right-answer bits over the tasks it scored)."""
    out = {}
    for name, run in (r.results.get("runs") or {}).items():
        m, _, seed = name.rpartition("-s")
        if m == method and run.get("scores"):
            bits = run["scores"][max(run["scores"], key=int)]["right_answer"].replace("-", "")
            out[seed] = bits.count("1") / len(bits) if bits else 0.0
    return out


def _against_grpo(r: Result, method: str, stored: dict[str, Any]) -> dict[str, Any]:
    """``method`` minus GRPO as ``r`` stored it, with the tests a file written before them
    lacks computed from its runs; the stored figures where the runs do not give its mean."""
    if stored.get("p_t") is not None:
        return stored
    p = compare(_finals(r, method), _finals(r, "grpo"))
    if p.n != stored.get("n") or p.mean is None or abs(p.mean - stored["mean"]) > 1e-5:  # stored to 6 places
        return stored
    return {**stored, "t_ci": p.t_ci, "p_t": p.p_t, "p_sign": p.p_sign}


#: The settings the summary names (label by key): those in ALWAYS on every row, the rest where
#: they differ from the family's first runs (level 0, forced first turn, no guiding, system block, fp32, rank 8, 8 updates).
SUMMARY_KEYS = {"temperature": "T", "lr": "lr", "lr_schedule": "schedule", "opd_coef": "OPD weight",
                "first_turn": "first turn", "guide_share": "guided share", "injector": "skill in", "precision": "precision",
                "answer_format": "skill prompt's example", "skill_opening": "skill opening",
                "skill_failures": "skills on failures", "lora_r": "LoRA rank", "attention": "attention",
                "kv_cache": "KV cache", "updates": "updates", "level": "level"}
ALWAYS = {"temperature", "lr", "lr_schedule", "opd_coef"}
SUMMARY_DEFAULTS = {"first_turn": "forced", "lora_r": 8, "updates": 8, "level": 0}


def learning_summary(results: dict[str, Result]) -> list[str]:
    """Every learning curve in one table: per file, each method whose runs it trained (a
    method read whole from another file is that file's row), its settings, held-out answer
    success from start to end with the gain's CI, and the paired difference from GRPO."""
    from bench.learning_curve import REVISIONS, curve_rows

    rows, family = [], _family(results)
    for name, method in curve_rows(_curves(results)):  # a method read from (or also in) a file above is that row
        r = results[name]
        m = r.results["methods"][method]
        revision, now_ = _revisions(r, method), str(REVISIONS.get(method, 1))
        curve = m["curve"]
        a, b = curve[min(curve, key=int)], curve[max(curve, key=int)]
        paired = r.results.get(f"{method.replace('-', '_')}_minus_grpo")
        paired = _against_grpo(r, method, paired) if paired else None
        member = family.get(f"{name}:{method}") or {}
        shown = [k for k in SUMMARY_KEYS if k not in _UNREAD.get(method, set())
                 and (k in ALWAYS or _setting(r, k) not in (None, _ADDED_LATER.get(k), SUMMARY_DEFAULTS.get(k)))]
        settings = ", ".join(f"{SUMMARY_KEYS[k]} {_setting(r, k):g}" if isinstance(_setting(r, k), float)
                             else f"{SUMMARY_KEYS[k]} {_setting(r, k)}" for k in shown)
        # trained by code a later fix changed: kept as history, no longer the method's result
        label = method if revision == now_ else f"{method} (retired: code revision {revision}, now {now_})"
        rows.append([f"`{name}`", label, str(len(r.config["seeds"])), settings,
                     f"{a['right_answer']:.3f} -> {b['right_answer']:.3f}", _gain_cell(r, method, m),
                     _paired_cell(paired, member.get("crossed_ci")), _p_cell(paired, member.get("claim"))])
    return ["*Every `docs/results/learning_curve*.json`: atlas level 0 (unless named), SmolLM2-135M with LoRA, 80 held-out tasks "
            "played greedily; settings as each file states (its section below has the rest). A row per method a file "
            "trained. Intervals are 95%: a bootstrap that resamples seeds and held-out tasks as crossed factors (every "
            "seed plays the same tasks), then the t interval over the seeds' values (at three to six seeds the "
            "bootstrap over seeds is too narrow: bench/stats.py). Paired: minus GRPO's final held-out success, seed by "
            f"seed. p: the paired t-test's, then Holm's correction over the family of {len(family)} SEED variants "
            "compared with GRPO in these files, one seed or not (bench/learning_curve.py `comparison_family`).*", "",
            *table(["curve", "method", "seeds", "settings", "held-out right answer", "gain, crossed CI; t interval",
                    "paired vs GRPO, crossed CI; t interval", "t-test p; Holm p (variants)"], rows)]


def _curves(results: dict[str, Result]) -> dict[str, dict[str, Any]]:
    """The learning-curve files as bench/learning_curve.py's family functions read them."""
    return {n: {"config": r.config, "results": r.results} for n, r in results.items()
            if n == "learning_curve" or n.startswith("learning_curve_")}


_FAMILIES: dict[int, tuple[dict[str, Result], dict[str, dict[str, Any]]]] = {}


def _family(results: dict[str, Result]) -> dict[str, dict[str, Any]]:
    """``comparison_family`` over the loaded learning-curve files, computed once for the
    results one rendering passes to every table (each curve's section reads it)."""
    from bench.learning_curve import comparison_family

    held = _FAMILIES.get(id(results))
    if held is None or held[0] is not results:
        held = _FAMILIES[id(results)] = (results, comparison_family(_curves(results)))
    return held[1]


def _interval(ci: Any) -> str:
    return "[{:+.3f}, {:+.3f}]".format(*ci)


def _gain_cell(r: Result, method: str, m: dict[str, Any]) -> str:
    """A method's held-out gain with its crossed bootstrap interval and, over two seeds or more,
    its t interval, both from the runs the file keeps; the stored interval without them."""
    from bench.learning_curve import stored_gain

    crossed, t_ci = stored_gain(r.results, method)
    if crossed is None:
        return f"{f(m['gain'], '+.3f')} {_interval(m['gain_ci'])}" if m.get("gain_ci") else f(m["gain"], "+.3f")
    return f"{f(m['gain'], '+.3f')} {_interval(crossed)}" + (f"; t {_interval(t_ci)}" if t_ci else "")


def _paired_cell(d: dict[str, Any] | None, crossed: Any = None) -> str:
    """The summary's paired cell: mean, crossed bootstrap interval (the stored bootstrap over
    seeds where the runs give none) and the t interval."""
    if not d:
        return "-"
    if d.get("ci") is None:
        return f"{d['mean']:+.3f} (one seed)"
    t_ci = f"; t {_interval(d['t_ci'])}" if d.get("t_ci") is not None else ""
    return f"{d['mean']:+.3f} {_interval(crossed if crossed is not None else d['ci'])}{t_ci}"


def _p_cell(d: dict[str, Any] | None, claim: Any) -> str:
    """The paired t-test's p, then its Holm-adjusted p and the family's size."""
    if not d or d.get("p_t") is None:
        return "-" if claim is None else f"- ({claim.variants})"
    raw = f"{d['p_t']:.4f}" if d["p_t"] < 0.01 else f"{d['p_t']:.3f}"
    return raw if claim is None or claim.p_holm is None else f"{raw}; {claim.p_holm:.3f} ({claim.variants})"


def _update_diagnostics(x: dict[str, Any]) -> list[str]:
    """Per method, from its runs' per-update metrics: KL to the start at the last update
    (range over seeds) and, where skills were written (SEED), the share that parsed and the
    mean OPD gate (how much of the distillation term was let through)."""
    lines = []
    for method in x["methods"]:
        runs = [run["metrics"] for name, run in sorted(x.get("runs", {}).items()) if name.startswith(f"{method}-s")]
        last = [m[-1]["kl"] for m in runs if m and "kl" in m[-1]]
        spread = f"{min(last):.3f}" if last and min(last) == max(last) else f"{min(last or [0]):.3f}-{max(last or [0]):.3f}"
        parts = [f"KL to the start at the last update {spread}"] if last else []
        skills = [u["skill_parse_rate"] for m in runs for u in m if "skill_parse_rate" in u]
        if method != "grpo" and skills:
            parts.append(f"skills parsed {mean(skills):.2f} (mean over updates and seeds)")
            # an update without a valid skill has no distillation token: its logged gate (0) is no gate
            gates = [u["opd/gate"] for m in runs for u in m if "opd/gate" in u and u.get("skill_parse_rate", 1) > 0]
            if gates:
                parts.append(f"OPD gate {mean(gates):.3f} (mean over the updates with a skill)")
        if parts:
            lines += ["", f"{method}: " + "; ".join(parts) + "."]
    return lines


#: Settings that name a run's bookkeeping, not what it trained.
_BOOKKEEPING = {"note", "result_name", "seeds", "methods", "work"}
#: Settings that change what the held-out score measures: curves that differ in one are not paired.
_MEASURE = {"level", "first_turn", "heldout", "model", "max_tokens"}


#: Flags added to bench/learning_curve.py after curves were stored: what an older file without them ran.
_ADDED_LATER = {"guide_share": 0.0, "lr_schedule": "linear", "precision": "float32", "opd_coef": 0.01,
                "injector": "system", "fuse_teacher": False, "answer_format": "paper", "skill_opening": "words",
                "skill_failures": "write", "attention": "same", "kv_cache": "dynamic"}
#: Settings a method's runs do not read: GRPO trains without the distillation term and writes no skill.
_UNREAD = {"grpo": {"opd_coef", "injector", "answer_format", "skill_opening", "skill_failures"}}


def _setting(r: Result, key: str) -> Any:
    value = r.config.get(key)
    return _ADDED_LATER.get(key) if value is None else value


def _changed(a: Result, b: Result, method: str | None = None) -> list[str]:
    return sorted(k for k in set(a.config) | set(b.config)
                  if k not in _BOOKKEEPING | _UNREAD.get(method or "", set()) and _setting(a, k) != _setting(b, k))


def _revisions(r: Result, method: str) -> str:
    """The code revision(s) of ``method``'s runs in ``r`` (bench/learning_curve.py's REVISIONS)."""
    runs = [run for name, run in r.results.get("runs", {}).items() if name.startswith(f"{method}-s")]
    return "/".join(map(str, sorted({run.get("revision", 1) for run in runs} or {1})))


def _gains(r: Result, method: str) -> dict[str, float]:
    return (r.results.get("methods", {}).get(method) or {}).get("gain_per_seed") or {}


def _paired_gains(me: Result, other: Result, method: str) -> tuple[dict[str, float], dict[str, float]]:
    """``method``'s gain per seed in both curves, over the seeds both ran, leaving out a seed
    whose run is the same in both (read back from one file into the other by its digest:
    no difference to report)."""
    def digests(r: Result) -> dict[str, str]:
        runs = r.results.get("runs") or {}
        return {n.rsplit("-s", 1)[1]: run["digest"] for n, run in runs.items()
                if n.rsplit("-s", 1)[0] == method and run.get("digest")}

    theirs_digests = digests(other)
    same = {s for s, d in digests(me).items() if theirs_digests.get(s) == d}
    mine, theirs = _gains(me, method), _gains(other, method)
    common = (set(mine) & set(theirs)) - same
    return {s: mine[s] for s in common}, {s: theirs[s] for s in common}


def nearest_curve(results: dict[str, Result], name: str, method: str) -> str | None:
    """The other learning curve to pair ``name`` with: one that measures the same thing
    (no ``_MEASURE`` setting differs) and shares a seed, differing in the fewest settings (the
    method's code revision counts as one: a run a fix retired is a worse partner than one of
    the same code); ties go to more common seeds, then to the main curve. A curve holding only
    this one's own runs (read back by digest) is no partner."""
    me = results[name]
    candidates = []
    for other, r in results.items():
        if other == name or not (other == "learning_curve" or other.startswith("learning_curve_")):
            continue
        changed = _changed(me, r, method)
        common = _paired_gains(me, r, method)[0]
        if common and not _MEASURE & set(changed):
            retired = _revisions(me, method) != _revisions(r, method)
            candidates.append((len(changed) + retired, -len(common), other != "learning_curve", other))
    return min(candidates)[-1] if candidates else None


def against_nearest_curve(results: dict[str, Result], name: str) -> list[str]:
    """A curve's held-out gain minus its nearest curve's (``nearest_curve``), paired by seed:
    variants keep the same seeds, hence the same tasks per update, start and held-out set, so
    the pairing removes what a seed decides. Names the settings that differ, so the
    difference is read as theirs; one common seed gets its difference and no interval. The
    main curve is what variants pair with, so its own table gets no such line."""
    if name == "learning_curve":
        return []
    out = []
    for method in results[name].results.get("methods", {}):
        other = nearest_curve(results, name, method)
        if other is None:
            continue
        mine, theirs = _paired_gains(results[name], results[other], method)
        p = compare(mine, theirs)
        per_seed = ", ".join(f"seed {s} {mine[s] - theirs[s]:+.3f}" for s in sorted(set(mine) & set(theirs), key=int))
        moved = [f"{k} {_setting(results[other], k)} -> {_setting(results[name], k)}"
                 for k in _changed(results[other], results[name], method)]
        before, now_ = _revisions(results[other], method), _revisions(results[name], method)
        if before != now_:  # the same settings run by code a fix changed (REVISIONS in the script)
            moved.append(f"code revision {before} -> {now_}")
        settings = "; ".join(moved) or "no setting"
        head = (f"{method} held-out gain minus {other}.json's, paired by seed (n={p.n}; differs in: {settings}): "
                f"{f(p.mean, '+.3f')}")
        if p.n < 2:
            out += ["", f"{head} (one seed: no interval)."]
        else:
            out += ["", f"{head} ({per_seed}), 95% bootstrap CI [{p.ci[0]:+.3f}, {p.ci[1]:+.3f}]; {paired_tests(p)}; "
                        f"a paired test would need {p.seeds_needed or '-'} seeds."]
    return out


def decode_drop(results: dict[str, Result]) -> list[str]:
    """One recorded iteration's calls replayed with finished rows kept in the forward and left out."""
    r = one(results, "decode_drop")
    c, x = r.config, r.results
    sec, ratio = x["seconds"], x["ratio"]
    what = (f"iteration {c['iteration']} of a recorded run replayed, {x['rows']} rows in {len(x['batches'])} batches, "
            f"median of {c['repeats']}, the ways alternating" + (f"; {c['note']}" if c.get("note") else ""))
    names = {"agent": "agent turns", "hindsight": "hindsight batch", "total": "both"}
    rows = [[names[k], f"{sec['generate'][k]:.2f} s", f"{sec['drop'][k]:.2f} s", f"{ratio[k]:.3f}"]
            for k in ("agent", "hindsight", "total")]
    return [source_line(r, what), "",
            *table(["calls", "every row to the end (`generate`)", "finished rows leave (`drop_finished`)", "ratio"], rows),
            "", f"Rows that sampled the same ids both ways: {x['rows_same_ids']}/{x['rows']}."]


# -- the README's status table --------------------------------------------------------------

#: The README's claims, each read off one result file: ``(claim, kind, file, method, link)``.
#: ``gain``: a method's held-out gain (crossed bootstrap over seeds and tasks); ``paired``: a
#: method minus GRPO's final, seed by seed (t interval, t-test p, Holm p over the variants tried);
#: ``between``: two methods' finals from two files, seed by seed; ``main_job`` and ``continual``:
#: their one run. The links are docs/ pages, relative to the README.
STATUS: list[tuple[str, str, str, Any, str]] = [
    ("`seed-agents train` with no config learns (the main job: free tool agent, 6 updates)", "main_job", "main_job", None,
     "docs/benchmarks.md#the-main-job"),
    ("GRPO learns the atlas tool family (level 0, first call forced, 8 updates)", "gain",
     "learning_curve_t05_const_seed_success_opd01", "grpo",
     "docs/results.md#seed-with-its-own-skills-on-successes-only-at-opd-weight-01-far-above-grpo-five-seeds-0203-paired"),
    ("SEED, the policy's own skills on its successes, beats GRPO", "paired",
     "learning_curve_t05_const_seed_success_opd01", "seed",
     "docs/results.md#seed-with-its-own-skills-on-successes-only-at-opd-weight-01-far-above-grpo-five-seeds-0203-paired"),
    ("one fixed sentence in place of the skills beats GRPO (the content control)", "paired",
     "learning_curve_t05_const_success_generic_opd01", "seed-success-generic",
     "docs/results.md#the-content-control-one-fixed-sentence-on-every-success-five-seeds-0177-paired-above-grpo-the-skills"
     "-content-adds-nothing-detected"),
    ("plain imitation of successes, no teacher, beats GRPO (the imitation control)", "paired",
     "learning_curve_t05_const_success_imitate_opd01", "seed-success-imitate",
     "docs/results.md#the-imitation-control-the-gate-off-plain-imitation-of-successes-five-seeds-0105-paired-above-grpo-about"
     "-half"),
    ("the skills' content adds to the fixed sentence (own skills minus sentence)", "between",
     "learning_curve_t05_const_seed_success_opd01",
     ("seed", "learning_curve_t05_const_success_generic_opd01", "seed-success-generic"),
     "docs/results.md#the-content-control-one-fixed-sentence-on-every-success-five-seeds-0177-paired-above-grpo-the-skills"
     "-content-adds-nothing-detected"),
    ("SEED as the paper runs it (own skills on every episode) beats GRPO", "paired",
     "learning_curve_t05_const_seed_opd01_r3", "seed",
     "docs/results.md#seed-with-its-own-skills-at-opd-weight-01-after-two-fixes-three-seeds-not-above-grpo--0021-paired"),
    ("SEED holds to 30 updates where GRPO's gain does not", "paired",
     "learning_curve_t05_const_seed_success_u30", "seed",
     "docs/results.md#thirty-updates-of-seed-with-its-own-skills-on-successes-096-0975-on-three-seeds-grpo-anywhere-from-011"
     "-to-089-paired-0471-not-yet-a-test"),
    ("a free agent learns to call its tools (guided openings, 16 updates)", "gain", "learning_curve_guided_lr1e3", "grpo",
     "docs/results.md#guided-openings-at-a-constant-1e-3-the-free-agent-learns-to-call-three-seeds-the-goal-met"),
    ("level 1 (lookup, then add) learns with both calls' tools forced", "gain", "learning_curve_level1_lookup_add", "grpo",
     "docs/results.md#level-1-with-lookup-then-add-forced-trained-grpo-0175---081-held-out-in-8-updates-three-seeds-the-goal-met"),
    ("the continual loop promotes a better version behind its gate (vLLM, LoRA, gateway)", "continual",
     "continual_demo_atlas", None, "docs/deploy.md#continual-training-learn-from-the-traffic-behind-a-gate"),
]


def _verdict(ci: Any, p_holm: float | None = None) -> str:
    """``shown`` where the interval excludes 0; a paired claim also needs its Holm p under 5%."""
    if ci is None or ci[0] <= 0 <= ci[1]:
        return "not decided"
    word = "shown" if ci[0] > 0 else "the opposite shown"
    return word if p_holm is None or p_holm < 0.05 else f"{word} alone, not after Holm's correction"


def _status_row(results: dict[str, Result], claim: str, kind: str, name: str, method: Any) -> list[str]:
    r = one(results, name)
    if kind == "main_job":
        x, t = r.results, r.results["targets"]
        d, g = x["sides"]["default"], x["sides"]["grpo"]["summary"]["heldout"]
        h = d["summary"]["heldout"]
        evidence = (f"held-out {h['before']['success_rate']:.2f} -> {h['after']['success_rate']:.2f} (GRPO "
                    f"{g['before']['success_rate']:.2f} -> {g['after']['success_rate']:.2f}); "
                    f"{d['wall_s'] / 60:.1f} min (target {t['wall_s_at_most'] / 60:g} min: "
                    f"{'met' if d['wall_s'] <= t['wall_s_at_most'] else 'missed'}), peak {d['peak_rss_gb']:.1f} GB "
                    f"(target {t['peak_rss_gb_at_most']:g} GB: "
                    f"{'met' if d['peak_rss_gb'] <= t['peak_rss_gb_at_most'] else 'missed'})")
        if "main_job_allocator" in results:  # the same command re-run with the allocator settings it now starts with
            m = results["main_job_allocator"].results["sides"]["default"]
            mh = m["summary"]["heldout"]
            wall = "met" if m["wall_s"] <= t["wall_s_at_most"] else "missed"
            rss = "met" if m["peak_rss_gb"] <= t["peak_rss_gb_at_most"] else "missed"
            evidence += (f"; re-run with the allocator settings the commands now start with: "
                         f"{mh['before']['success_rate']:.2f} -> {mh['after']['success_rate']:.2f}, "
                         f"{m['wall_s'] / 60:.1f} min ({wall}), peak {m['peak_rss_gb']:.1f} GB ({rss})")
        return [claim, evidence, "1", "- (one seed)"]
    if kind == "continual":
        fc = r.results["final_check"]
        ci = tuple(fc["ci95"])
        return [claim, f"last promoted v{fc['version']} {fc['final_mean']:.3f} against v0 {fc['v0_mean']:.3f} on "
                       f"{fc['n_tasks']} canary tasks, {fc['mean_diff']:+.3f}: {_verdict(ci)}",
                "1 run", f"{_interval(ci)} over tasks"]
    seeds = str(len(r.config["seeds"]))
    curve = r.results["methods"][method if kind != "between" else method[0]]["curve"]
    a, b = curve[min(curve, key=int)]["right_answer"], curve[max(curve, key=int)]["right_answer"]
    if kind == "gain":
        from bench.learning_curve import stored_gain

        crossed, _ = stored_gain(r.results, method)
        m = r.results["methods"][method]
        return [claim, f"held-out {a:.3f} -> {b:.3f}, {m['gain']:+.3f}: {_verdict(crossed)}", seeds,
                f"{_interval(crossed)} (crossed bootstrap)"]
    if kind == "between":
        mine, other, theirs = method
        p = compare(_finals(r, mine), _finals(one(results, other), theirs))
        return [claim, f"{p.mean:+.3f}, t-test p {p.p_t:.2f}: {_verdict(p.t_ci)}", str(p.n), f"{_interval(p.t_ci)} (t)"]
    d = _family(results).get(f"{name}:{method}") or {}
    claim_ = d.get("claim")
    holm = f", Holm {claim_.p_holm:.3f} over {claim_.variants} variants" if claim_ and claim_.p_holm is not None else ""
    p_t = d["p_t"]
    return [claim, f"{a:.3f} -> {b:.3f}; minus GRPO {d['mean']:+.3f}, t-test p "
                   f"{f'{p_t:.4f}' if p_t < 0.01 else f'{p_t:.3f}'}{holm}: "
                   f"{_verdict(d['t_ci'], claim_.p_holm if claim_ else None)}",
            seeds, f"{_interval(d['t_ci'])} (t)"]


def _design(r: Result) -> str:
    """``preregistered`` (file, commit, split) where the result file records a preregistration
    committed before the run started; ``exploratory`` where it records none. A recorded
    preregistration that is not older than the run is refused: its settings could have been
    chosen after seeing it."""
    from bench.preregistration import PREREGISTRATION_KEY, older_than

    record = r.config.get(PREREGISTRATION_KEY)
    if not record:
        return "exploratory"
    if not older_than(record, r.started_at):
        raise TablesError(f"{r.name}: its preregistration {record.get('path')} (commit {str(record.get('commit'))[:7]}, "
                          f"{record.get('committed_at')}) is not older than the run ({r.started_at})")
    return f"preregistered (`{record['path']}` at {record['commit'][:7]}, {r.config.get('split', 'heldout')} split)"


def _status_design(results: dict[str, Result], kind: str, name: str, method: Any) -> str:
    """A row's design: a comparison across two files is preregistered only where both are."""
    designs = [_design(one(results, name))]
    if kind == "between":
        designs.append(_design(one(results, method[1])))
    return next((d for d in designs if d == "exploratory"), designs[0])


def status(results: dict[str, Result]) -> list[str]:
    """The README's claims, one row each: the evidence read off its result file, the seeds, the
    95% interval, whether its settings were preregistered, and the section that has the rest."""
    rows = [[*_status_row(results, claim, kind, name, method), _status_design(results, kind, name, method),
             f"[{name}]({link})"] for claim, kind, name, method, link in STATUS]
    exploratory = sum(row[-2] == "exploratory" for row in rows)
    design = ("Every row is exploratory" if exploratory == len(rows) else f"{exploratory} of {len(rows)} rows are "
              "exploratory") + (": an exploratory row's settings (temperature, schedule, rank, OPD weight, skill "
                                "options) were chosen on the same held-out tasks that report it, so its figure is "
                                "likely optimistic; a preregistered row's settings were committed under "
                                "`bench/preregistered/` before it ran on the test split "
                                "([splits and preregistration](docs/results.md#splits-and-preregistration)).")
    return ["*Atlas tool family, SmolLM2-135M-Instruct with LoRA on 2 CPU cores, held-out tasks played greedily; "
            "each row from `docs/results/<file>.json`. Intervals are 95%: a gain's resamples seeds and held-out tasks "
            "(crossed), a difference between methods is the paired t interval over seeds, the continual loop's a "
            "bootstrap over its canary tasks. Shown: the interval excludes 0 (and, for a SEED variant against GRPO, "
            f"Holm's correction over every variant tried keeps it under 5%). {design}*", "",
            *table(["claim", "evidence", "seeds", "interval", "design", "file, section"], rows)]


RENDERERS: dict[str, Callable[[dict[str, Result]], list[str]]] = {
    "determinism": determinism, "tool_agent": tool_agent, "continual_demo": continual_demo,
    "continual_demo_atlas": continual_demo_atlas,
    "capture_overhead": capture_overhead, "seed_overhead": seed_overhead, "gateway_overhead": gateway_overhead,
    "update_memory": update_memory, "activation_trim": activation_trim, "run_memory": run_memory, "demo_speed": demo_speed, "webshop_index": webshop_index,
    "sample_efficiency": sample_efficiency,
    "skill_usefulness": skill_usefulness, "roofline": roofline, "logprob_gap": logprob_gap,
    "rollout_throughput": rollout_throughput, "atlas_band": atlas_band, "continual_atlas": continual_atlas,
    "update_throughput": update_throughput, "learning_curve": learning_curve, "skill_scoring_speed": skill_scoring_speed,
    "atlas_skills": atlas_skills, "page_faults": page_faults, "learning_summary": learning_summary,
    "decode_profile": decode_profile, "decode_drop": decode_drop, "main_job": main_job, "status": status}

#: Benchmarks that write variants under another name (``--result-name NAME_variant``): a
#: marker ``results:NAME_variant`` renders that file with its family's table.
FAMILIES: dict[str, Callable[[dict[str, Result], str], list[str]]] = {
    "learning_curve": learning_curve, "atlas_band": atlas_band, "update_throughput": update_throughput,
    "demo_speed": demo_speed, "roofline": roofline, "atlas_skills": atlas_skills,
    "seed_overhead": seed_overhead, "update_memory": update_memory, "main_job": main_job}


def renderer(name: str) -> Callable[[dict[str, Result]], list[str]] | None:
    """The table for a marker: its own, or its family's for a variant; None when neither."""
    if name in RENDERERS:
        return RENDERERS[name]
    family = next((f for f in FAMILIES if name.startswith(f + "_")), None)
    return None if family is None else (lambda results: FAMILIES[family](results, name))


# -- the pages ----------------------------------------------------------------------------

def render(text: str, results: dict[str, Result]) -> str:
    """``text`` (one page) with every marked section replaced by its rendered table."""
    def sub(m: re.Match[str]) -> str:
        name = m.group("name")
        draw = renderer(name)
        if draw is None:
            raise TablesError(f"marker results:{name} has no renderer in scripts/readme_tables.py")
        try:
            body = draw(results)
        except (KeyError, TypeError, IndexError) as e:
            raise TablesError(f"docs/results for {name} lack a figure the table needs ({type(e).__name__}: {e})") from e
        return m.group(1) + "\n".join(body) + "\n" + m.group(4)

    return MARKER.sub(sub, text)


def default_pages(root: Path) -> list[Path]:
    """README.md and every markdown page directly under docs/ (docs/results/ holds only JSON)."""
    return [p for p in [root / "README.md", *sorted((root / "docs").glob("*.md"))] if p.is_file()]


def sections(pages: dict[Path, str], root: Path) -> dict[str, Path]:
    """Each marker name and the one page that holds it."""
    where: dict[str, Path] = {}
    for page, text in pages.items():
        closed = [m.group("name") for m in MARKER.finditer(text)]
        for name in [m.group("name") for m in OPENING.finditer(text)]:
            if name not in closed:
                raise TablesError(f"{rel(page, root)}: results:{name} is opened but never closed with <!-- /results:{name} -->")
            if name in where:
                raise TablesError(f"results:{name} appears twice ({rel(where[name], root)} and {rel(page, root)}); a table lives on one page")
            where[name] = page
            closed.remove(name)
    return where


def rel(path: Path, root: Path) -> Path:
    """``path`` as the user knows it: relative to the checkout where it is inside one."""
    try:
        return path.resolve().relative_to(root.resolve())
    except ValueError:
        return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--check", action="store_true", help="Change nothing; exit 1 if a table differs from its results.")
    ap.add_argument("--root", type=Path, default=ROOT,
                    help="Checkout whose README.md and docs/*.md pages hold the tables (default: this one).")
    ap.add_argument("--pages", nargs="+", type=Path, metavar="FILE",
                    help="Render these markdown files instead of the root's README.md and docs/*.md.")
    ap.add_argument("--results-dir", dest="results_dir", type=Path,
                    help="Result files to render from (default: docs/results under --root).")
    args = ap.parse_args(argv)
    paths = args.pages or default_pages(args.root)
    try:
        current = {p: p.read_text(encoding="utf-8") for p in paths}
        where = sections(current, args.root)
        results = load_results(args.results_dir or args.root / "docs" / "results")
        new = {p: render(text, results) for p, text in current.items()}
    except (TablesError, OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    changed = [p for p in paths if new[p] != current[p]]
    names = ", ".join(f"{n} ({rel(p, args.root)})" for n, p in where.items())
    if args.check:
        for p in changed:
            sys.stdout.writelines(difflib.unified_diff(current[p].splitlines(True), new[p].splitlines(True),
                                                       str(rel(p, args.root)), f"{rel(p, args.root)} (from docs/results)"))
        if changed:
            print(f"result tables in {', '.join(str(rel(p, args.root)) for p in changed)} differ from docs/results; "
                  f"run {Path(__file__).name} to regenerate", file=sys.stderr)
            return 1
        print(f"pages match docs/results ({len(where)} tables: {names})")
        return 0
    for p in changed:
        p.write_text(new[p], encoding="utf-8")
    print(f"{'rewrote ' + ', '.join(str(rel(p, args.root)) for p in changed) if changed else 'unchanged'}: "
          f"{len(where)} tables ({names})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
