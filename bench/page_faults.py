"""Page faults in an update step: what the kernel costs, and what allocator settings change.

A training run here takes ~17,000 minor page faults a second (docs/benchmarks.md): glibc
hands every freed block over its mmap threshold back to the kernel, and the next tensor of
that size is faulted in (and zeroed) again. This script asks how much of a step that is
worth before anyone changes the allocator. Each variant runs the same synthetic update
step (SmolLM2 with a LoRA adapter, fp32, random token ids, loss over every position) in a
fresh child process, variants interleaved per repeat; the child reports, per step, its
minor faults and its own user and kernel CPU time (getrusage: what the process spent, less
bent by other load than wall time, which is printed too).

Variants, each set through the environment before torch starts (no code change):
- ``default``: glibc's defaults;
- ``glibc_hugetlb``: ``GLIBC_TUNABLES=glibc.malloc.hugetlb=1``: malloc asks for transparent
  huge pages (2 MiB) on its mmaps, so a big tensor faults once per 2 MiB, not per 4 KiB;
- ``torch_thp``: ``THP_MEM_ALLOC_ENABLE=1``: PyTorch's CPU allocator aligns blocks of 2 MiB
  and more and asks for huge pages itself;
- ``no_mmap``: ``glibc.malloc.mmap_max=0`` and no trimming: freed blocks stay in the heap
  (what an in-process ``mallopt`` did in the earlier experiment).

    .venv/bin/python bench/page_faults.py --note "nothing else ran"

Prints each variant's medians and the kernel's share of the default's CPU time: no
allocator setting can save more than that share through the kernel alone. Writes
``docs/results/page_faults.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path
from bench import results as bench_results  # noqa: E402

VARIANTS = {
    "default": {},
    "glibc_hugetlb": {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    "torch_thp": {"THP_MEM_ALLOC_ENABLE": "1"},
    "no_mmap": {"GLIBC_TUNABLES": "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4294967295"},
}


def child(args: argparse.Namespace) -> None:
    """One variant: a warm step, then ``--steps`` timed ones; one JSON line per step."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from seed_agents.models import resolve_model

    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(args.model), dtype=torch.float32)
    model = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", task_type="CAUSAL_LM"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-5)
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.tokens))
    for i in range(args.steps + 1):
        before, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
        after, wall = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter() - t0
        if i:  # the first step allocates everything for the first time
            print(json.dumps({"faults": after.ru_minflt - before.ru_minflt, "user_s": after.ru_utime - before.ru_utime,
                              "sys_s": after.ru_stime - before.ru_stime, "wall_s": wall}), flush=True)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--tokens", type=int, default=256)
    p.add_argument("--steps", type=int, default=2, help="Timed steps per child (after one warm step).")
    p.add_argument("--repeats", type=int, default=2, help="Rounds of every variant, interleaved.")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"Comma list of {', '.join(VARIANTS)}.")
    p.add_argument("--threads", type=int, default=0,
                   help="torch threads in the child (0: torch's default). 1 beside another job: oversubscribed "
                        "OpenMP threads spin, and their user time would measure the spinning.")
    p.add_argument("--note", default="", help="What else ran on the machine.")
    p.add_argument("--child", choices=list(VARIANTS), help=argparse.SUPPRESS)
    bench_results.add_results_args(p)
    args = p.parse_args(argv)
    if args.child:
        return child(args)
    variants = [v for v in args.variants.split(",") if v]
    if not variants or set(variants) - set(VARIANTS):
        p.error(f"--variants: choose from {', '.join(VARIANTS)}")
    started = bench_results.now()
    steps: dict[str, list[dict[str, float]]] = {v: [] for v in variants}
    for r in range(args.repeats):
        for v in variants if r % 2 == 0 else reversed(variants):  # alternate the order: drift hits all alike
            cmd = [sys.executable, __file__, "--child", v, "--model", args.model, "--rows", str(args.rows),
                   "--tokens", str(args.tokens), "--steps", str(args.steps), "--threads", str(args.threads)]
            done = subprocess.run(cmd, env={**os.environ, **VARIANTS[v]}, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                raise SystemExit(f"error: variant {v} failed (exit {done.returncode}): "
                                 f"{(done.stderr.strip().splitlines() or ['no output'])[-1]}")
            rows = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
            steps[v] += rows
            print(f"repeat {r} {v}: " + "; ".join(f"{s['faults']} faults, {s['user_s']:.1f} s user, {s['sys_s']:.2f} s "
                                                   f"kernel, {s['wall_s']:.1f} s wall" for s in rows), flush=True)
    summary = {v: {k: statistics.median(s[k] for s in rows) for k in ("faults", "user_s", "sys_s", "wall_s")}
               for v, rows in steps.items()}
    print(f"\nper step, median of {args.repeats} x {args.steps} ({args.rows} x {args.tokens} tokens):")
    for v, m in summary.items():
        print(f"{v:<14} {m['faults']:>9.0f} faults  {m['user_s']:6.1f} s user  {m['sys_s']:5.2f} s kernel  "
              f"{m['wall_s']:6.1f} s wall")
    base = summary.get("default")
    share = base["sys_s"] / (base["user_s"] + base["sys_s"]) if base else None
    if share is not None:
        print(f"the kernel's share of the default step's CPU time: {share:.3f}; an allocator setting saves no more "
              "through the kernel alone")
    bench_results.write_result("page_faults", bench_results.config_of(args),
                               {"steps": steps, "median": summary, "kernel_share_default": share, "note": args.note},
                               started_at=started, results_dir=args.results_dir)


if __name__ == "__main__":
    main()
