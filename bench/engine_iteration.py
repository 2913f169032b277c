"""The whole training iteration on each engine: the in-process local backend against a vLLM
server the command starts for itself, on the same seed, tasks and settings.

An iteration is what a user waits for: rollouts (the episodes and, with SEED, the policy's
hindsight skills), scoring, the update, and the sync that makes the new weights serve. Each
side is one ``seed-agents train`` process from an empty folder, ``--backend.kind`` local or
vllm (no ``base_url``: the command starts and stops its server, startup counted apart); its
per-iteration times come from the run's own ``metrics.jsonl``, its memory from the resident
set of the whole process tree (the trainer and the server with its engine, sampled from
/proc), and the CPU the server's processes burnt while the trainer updated says whether an
idle engine takes cores from the update.

Workloads:

- ``main``: the main job (``seed_agents.config.presets.MAIN_JOB``: SEED on the atlas agent
  left free to choose its tools, batches of 32, 64 response tokens), held-out evaluation off;
- ``user``: the same agent with the scheduling a user who wraps an agent leaves alone (runner
  concurrency and the local batch size at their defaults).

    .venv/bin/python -m bench.engine_iteration --note "what else ran"

Writes ``docs/results/engine_iteration.json``.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import psutil
import yaml

from bench import results as bench_results
from bench.children import stop_children_on_sigterm
from seed_agents.config.presets import MAIN_JOB

ENGINES = ("local", "vllm")
WORKLOADS = ("main", "user")
USER_LEAVES_ALONE = (("runner", "concurrency"), ("backend", "max_batch_size"))
"""What the ``user`` workload takes from the defaults rather than from the main job."""


def workload_config(workload: str, engine: str, iterations: int) -> dict[str, Any]:
    """The train config of one side: the main job without held-out evaluation, on ``engine``."""
    cfg = copy.deepcopy(MAIN_JOB)
    cfg.pop("eval", None)
    cfg["iterations"] = iterations
    cfg.setdefault("backend", {})["kind"] = engine
    cfg.setdefault("runner", {})["progress"] = False
    if workload == "user":
        for section, key in USER_LEAVES_ALONE:
            cfg.get(section, {}).pop(key, None)
    return cfg


class TreeMemory:
    """The peak summed resident set of a process and all its descendants, and the CPU seconds
    of the descendants whose command line holds ``marker`` (the vLLM server's), sampled."""

    def __init__(self, pid: int, marker: str = "vllm", every_s: float = 0.5) -> None:
        self.root = psutil.Process(pid)
        self.marker, self.every_s = marker, every_s
        self.peak_gb = 0.0
        self.server_peak_gb = 0.0
        self._server_cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def server_cpu_s(self) -> float:
        return sum(self._server_cpu.values())

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            try:
                procs = [self.root, *self.root.children(recursive=True)]
            except psutil.Error:
                return
            total = server = 0.0
            for proc in procs:
                try:
                    rss = proc.memory_info().rss / 2**30
                    total += rss
                    if proc.pid != self.root.pid and self.marker in " ".join(proc.cmdline()):
                        server += rss
                        times = proc.cpu_times()
                        self._server_cpu[proc.pid] = times.user + times.system
                except psutil.Error:
                    continue
            self.peak_gb = max(self.peak_gb, total)
            self.server_peak_gb = max(self.server_peak_gb, server)


def run_side(workload: str, engine: str, iterations: int, work: Path) -> dict[str, Any]:
    folder = work / f"{workload}-{engine}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.yaml").write_text(yaml.safe_dump(workload_config(workload, engine, iterations)))
    log = folder / "train.log"
    cmd = [sys.executable, "-m", "seed_agents", "train", "--config", "config.yaml", "--out", "run"]
    print(f"{workload}/{engine}: {' '.join(cmd[2:])} (log {log})", flush=True)
    t0 = time.perf_counter()
    with log.open("w", encoding="utf-8") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=folder,
                                env={**os.environ, "PYTHONUNBUFFERED": "1"})
        try:
            with TreeMemory(proc.pid) as memory:
                proc.wait()
        except BaseException:
            proc.kill()
            proc.wait()
            raise
    wall = time.perf_counter() - t0
    text = log.read_text(encoding="utf-8", errors="replace")
    rows = [json.loads(line) for line in (folder / "run" / "metrics.jsonl").read_text().splitlines()] \
        if (folder / "run" / "metrics.jsonl").exists() else []
    startup = [float(line.split("(")[1].split(" s)")[0]) for line in text.splitlines() if line.startswith("vLLM ready at")]
    its = [{"rollout_s": r.get("time/rollout_s"), "score_s": r.get("time/score_s"), "sync_s": r.get("time/sync_s"),
            "step_s": r.get("time/step_s"), "iteration_s": (r.get("time/step_s") or 0) + (r.get("time/sync_s") or 0),
            "success": r.get("success_rate")} for r in rows]
    for it in its:  # the update is what the step spent beyond its rollouts and scoring
        it["update_s"] = it["step_s"] - (it["rollout_s"] or 0) - (it["score_s"] or 0) if it["step_s"] else None
    later = [it["iteration_s"] for it in its[1:]] or [it["iteration_s"] for it in its]
    side = {"exit": proc.returncode, "wall_s": wall, "server_startup_s": startup[0] if startup else None,
            "iterations": its, "iteration_s_mean_after_first": statistics.fmean(later) if later else None,
            "tree_peak_rss_gb": memory.peak_gb, "server_peak_rss_gb": memory.server_peak_gb,
            "server_cpu_s": memory.server_cpu_s(), "log_tail": text.splitlines()[-30:]}
    print(f"{workload}/{engine}: exit {proc.returncode}, {wall:.0f} s, iteration {side['iteration_s_mean_after_first'] or 0:.0f} s "
          f"(after the first), tree peak {memory.peak_gb:.2f} GB", flush=True)
    return side


def idle_server_cores(model: str = "smollm2-135m", seconds: float = 20.0) -> dict[str, float]:
    """The cores an idle vLLM server (started as ``train`` starts it, ready and warmed up)
    burns while nothing is asked of it: what it would take from an update beside it."""
    from seed_agents.models import resolve_model
    from seed_agents.serve import VLLMServer

    with tempfile.TemporaryDirectory(prefix="engine-iteration-idle-") as folder, \
            VLLMServer(resolve_model(model), served_model_name=model, work_dir=folder) as server:
        group = [psutil.Process(server.process.pid), *psutil.Process(server.process.pid).children(recursive=True)]
        time.sleep(2.0)  # the warm-up request's tail

        def cpu() -> float:
            return sum(sum(p.cpu_times()[:2]) for p in group if p.is_running())

        before, t0 = cpu(), time.perf_counter()
        time.sleep(seconds)
        cores = (cpu() - before) / (time.perf_counter() - t0)
    print(f"an idle vLLM server burns {cores:.2f} cores", flush=True)
    return {"idle_cores": cores, "seconds": seconds, "startup_s": server.startup_s or 0.0}


def ratios(sides: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Per workload: local's mean iteration time over vLLM's (above 1: vLLM faster), per phase too."""
    out: dict[str, Any] = {}
    for workload in WORKLOADS:
        local, vllm = sides.get(f"{workload}/local"), sides.get(f"{workload}/vllm")
        if not (local and vllm and local["iteration_s_mean_after_first"] and vllm["iteration_s_mean_after_first"]):
            continue
        phase = {}
        for key in ("rollout_s", "score_s", "update_s", "sync_s"):
            a = [it[key] for it in local["iterations"][1:] if it[key] is not None]
            b = [it[key] for it in vllm["iterations"][1:] if it[key] is not None]
            phase[key] = {"local": statistics.fmean(a) if a else None, "vllm": statistics.fmean(b) if b else None}
        out[workload] = {"local_over_vllm": local["iteration_s_mean_after_first"] / vllm["iteration_s_mean_after_first"],
                         "phases": phase}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", default=",".join(WORKLOADS), help=f"Comma list of {', '.join(WORKLOADS)}.")
    p.add_argument("--engines", default=",".join(ENGINES), help=f"Comma list of {', '.join(ENGINES)}.")
    p.add_argument("--iterations", type=int, default=3, help="Updates per side (the first is reported apart).")
    p.add_argument("--work", type=Path, default=None, help="Folder for the runs (default: a temporary one, deleted).")
    p.add_argument("--note", default="", help="What else ran on the machine.")
    p.add_argument("--result-name", default="engine_iteration", help="The result file's name.")
    p.add_argument("--no-idle", action="store_true", help="Skip the idle server's CPU measurement.")
    bench_results.add_results_args(p)
    args = p.parse_args(argv)
    stop_children_on_sigterm()
    started, code = bench_results.now(), bench_results.code_version()
    workloads = [w for w in args.workloads.split(",") if w]
    engines = [e for e in args.engines.split(",") if e]
    if bad := [w for w in workloads if w not in WORKLOADS] + [e for e in engines if e not in ENGINES]:
        p.error(f"unknown workload or engine: {', '.join(bad)}")
    idle = idle_server_cores() if "vllm" in engines and not args.no_idle else None
    with tempfile.TemporaryDirectory(prefix="engine-iteration-") as tmp:
        work = args.work or Path(tmp)
        sides = {f"{w}/{e}": run_side(w, e, args.iterations, work) for w in workloads for e in engines}
    results = {"idle_server": idle, "sides": sides, "ratios": ratios(sides)}
    for workload, r in results["ratios"].items():
        print(f"{workload}: local/vLLM whole iteration {r['local_over_vllm']:.2f}x", flush=True)
    config = {"workloads": {w: workload_config(w, "<engine>", args.iterations) for w in workloads},
              "engines": engines, "iterations": args.iterations, "note": args.note}
    bench_results.write_result(args.result_name, config, results, started_at=started, results_dir=args.results_dir,
                               code=code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
