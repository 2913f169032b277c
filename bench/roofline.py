"""This machine's limits, measured, and what they allow SmolLM2-135M at most.

Every speed figure of the project is read against these ceilings (``bench/rollout_throughput.py``
prints its runs as fractions of them):

- **matmul throughput** in fp32 and bf16, through the kernels torch actually uses here
  (``torch.matmul``, oneDNN; bf16 runs on AMX where the CPU has it), with as many threads as
  the process may use: a square 2048 product and the shapes of SmolLM2's projections at
  decode (8 rows), prefill/training (2048 rows);
- **memory bandwidth**: a STREAM-like copy of a 256 MB tensor (bytes read + written / s);
- the **ceilings** for SmolLM2-135M (``P`` parameters, ``B`` bytes a parameter):
  decode is bandwidth-bound while the batch is small: every step reads every weight once,
  so ``tokens/s <= batch * bandwidth / (P * B)``, and never above the FLOP bound
  ``matmul / (2 P)``; prefill is FLOP-bound at ``matmul / (2 P)`` tokens/s; a training
  step (forward + backward) at ``matmul / (6 P)`` tokens/s.

The ceilings ignore attention (short contexts here) and the embedding's gather (only the
rows used are read); the tied output projection is one full read per step, counted in ``P``.

    .venv/bin/python bench/roofline.py                     # writes docs/results/roofline.json
    .venv/bin/python bench/roofline.py --repeats 3 --results-dir runs/smoke

Prints the table last. Say in the run what else was running: the machine has 2 cores and a
busy neighbour halves every figure (the result file records the load average).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results  # noqa: E402
from seed_agents.cpu import cpu_flags  # noqa: E402

SMOLLM2 = {"params": 134_515_008, "hidden": 576, "intermediate": 1536, "layers": 30}
"""SmolLM2-135M-Instruct (LlamaForCausalLM, tied embeddings: the 49152 x 576 matrix counted once)."""
DECODE_BATCHES = (1, 4, 8, 16, 32)


def timed(fn: Callable[[], Any], repeats: int, min_s: float = 0.3, warm_up: bool = True) -> list[float]:
    """Seconds per call, ``repeats`` samples, each averaged over enough calls to last ``min_s``."""
    if warm_up:
        fn()  # oneDNN picks and caches its kernel on the first call
    samples = []
    for _ in range(repeats):
        n, t0 = 0, time.perf_counter()
        while True:
            fn()
            n += 1
            elapsed = time.perf_counter() - t0
            if elapsed >= min_s:
                break
        samples.append(elapsed / n)
    return samples


def matmul_gflops(m: int, k: int, n: int, dtype: torch.dtype, repeats: int, warm_up: bool = True) -> dict[str, float]:
    a = torch.randn(m, k).to(dtype)
    b = torch.randn(k, n).to(dtype)
    secs = timed(lambda: torch.matmul(a, b), repeats, warm_up=warm_up)
    flops = 2 * m * k * n
    return {"best": flops / min(secs) / 1e9, "median": flops / statistics.median(secs) / 1e9}


def copy_gbps(megabytes: int, repeats: int) -> dict[str, float]:
    n = megabytes * 2**20 // 4
    src = torch.randn(n)
    dst = torch.empty_like(src)
    secs = timed(lambda: dst.copy_(src), repeats)
    moved = 2 * src.numel() * src.element_size()  # read + write
    return {"best": moved / min(secs) / 1e9, "median": moved / statistics.median(secs) / 1e9}


def ceilings(matmul: dict[str, float], bandwidth_gbps: float, params: int) -> dict[str, Any]:
    """Tokens/s bounds for one model from a machine's matmul GFLOP/s (by dtype name) and bandwidth."""
    out: dict[str, Any] = {}
    for name, gflops in matmul.items():
        bytes_per_param = 4 if name == "fp32" else 2
        flop_bound = gflops * 1e9 / (2 * params)
        decode = {str(b): min(b * bandwidth_gbps * 1e9 / (params * bytes_per_param), flop_bound) for b in DECODE_BATCHES}
        out[name] = {"decode_tokens_per_s": decode, "prefill_tokens_per_s": flop_bound,
                     "train_tokens_per_s": gflops * 1e9 / (6 * params)}
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5, help="Timed samples per measurement (best and median kept).")
    parser.add_argument("--copy-mb", type=int, default=256, help="Size of the tensor the bandwidth copy moves.")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: the CPUs this process may use).")
    parser.add_argument("--note", default="", help="What else ran on the machine (written into the result).")
    parser.add_argument("--result-name", default="roofline",
                        help="roofline_<machine> keeps another CPU's ceilings beside roofline.json; benchmarks and "
                             "tables read the roofline*.json measured on a CPU like theirs.")
    bench_results.add_results_args(parser)
    args = parser.parse_args(argv)
    if args.result_name != "roofline" and not re.fullmatch(r"roofline_[a-z0-9_]+", args.result_name):
        parser.error("--result-name: roofline or roofline_<lowercase letters, digits, _>")
    started = bench_results.now()
    threads = args.threads or len(os.sched_getaffinity(0))
    torch.set_num_threads(threads)
    flags = cpu_flags()
    print(f"threads {threads}; cpu flags: amx_bf16={'amx_bf16' in flags} avx512_bf16={'avx512_bf16' in flags} "
          f"avx512f={'avx512f' in flags}; torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})", flush=True)

    h, i = SMOLLM2["hidden"], SMOLLM2["intermediate"]
    shapes = {"square_2048": (2048, 2048, 2048), "mlp_decode_8": (8, h, i), "mlp_prefill_2048": (2048, h, i)}
    matmul: dict[str, dict[str, dict[str, float]]] = {}
    # Without bf16 instructions torch emulates bf16 matmuls at ~1 GFLOP/s a core (36x under
    # fp32 on an AVX2 machine): five warm samples of the square product would take many
    # minutes to say only that. One cold sample per shape says it as well.
    emulated = not {"avx512_bf16", "amx_bf16"} & set(flags)
    if emulated:
        print("bf16: emulated on this CPU (no avx512_bf16 or amx_bf16): one cold sample per shape", flush=True)
    for dtype_name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        matmul[dtype_name] = {}
        slow = emulated and dtype == torch.bfloat16
        for shape_name, (m, k, n) in shapes.items():
            matmul[dtype_name][shape_name] = matmul_gflops(m, k, n, dtype, 1 if slow else args.repeats, warm_up=not slow)
            print(f"matmul {dtype_name} {shape_name} {m}x{k}x{n}: {matmul[dtype_name][shape_name]['best']:.1f} "
                  f"GFLOP/s best, {matmul[dtype_name][shape_name]['median']:.1f} median", flush=True)
    bandwidth = copy_gbps(args.copy_mb, args.repeats)
    print(f"copy {args.copy_mb} MB: {bandwidth['best']:.2f} GB/s best, {bandwidth['median']:.2f} median", flush=True)

    # The model's projections are the relevant kernels: prefill/training rows run at the
    # 2048-row shape's rate, not the square product's.
    peak = {name: by_shape["mlp_prefill_2048"]["best"] for name, by_shape in matmul.items()}
    bound = ceilings(peak, bandwidth["best"], SMOLLM2["params"])
    results = {"threads": threads, "cpu_flags": bench_results.ceiling_flags(),
               "cpu_capability": torch.backends.cpu.get_cpu_capability(), "matmul_gflops": matmul,
               "copy_gbps": bandwidth, "model": SMOLLM2, "ceilings": bound, "bf16_emulated": emulated,
               "note": args.note}
    bench_results.write_result(args.result_name, bench_results.config_of(args), results, started_at=started,
                               results_dir=args.results_dir)
    print()
    print("| dtype | matmul GFLOP/s (SmolLM2 MLP, 2048 rows) | decode tok/s ceiling, batch 1 / 8 / 32 | prefill tok/s | train tok/s |")
    print("|---|---|---|---|---|")
    for name, c in bound.items():
        d = c["decode_tokens_per_s"]
        print(f"| {name} | {peak[name]:.0f} | {d['1']:.0f} / {d['8']:.0f} / {d['32']:.0f} | "
              f"{c['prefill_tokens_per_s']:.0f} | {c['train_tokens_per_s']:.0f} |")
    print(f"bandwidth {bandwidth['best']:.2f} GB/s (copy, best of {args.repeats})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
