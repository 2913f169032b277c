"""Decode taken apart: where a SmolLM2 decode step's time goes, against this machine's ceiling.

``bench/rollout_throughput.py`` times whole episodes (prefill, decode, environment, graph);
its tokens/s mixes all of them. This one times decode alone: ``--batches`` of sequences of a
``--prompt``-token prompt each, ``--new`` tokens after it, three ways on one model and dtype:

- ``forward``: the model's own step in a plain loop (one token a sequence on its KV cache,
  greedy argmax): decode with no generation machinery, what any faster path could reach
  without touching the model's kernels;
- ``generate``: transformers' ``generate`` (greedy, ``min_new_tokens`` = ``--new`` so every row
  runs every step), its prefill timed apart (one new token) and subtracted;
- ``backend``: ``LocalBackend`` (the rollouts' path), the rows sent together through its
  batcher at T 0.7 with a seed each, so its per-row sampler, logprob capture and stop checks
  are in the figure; its own one-token call subtracted as its prefill (its longest row sets
  the steps: a row that samples its end early shortens none, as the batch runs on);
- ``backend-concat``: the same with ``kv_cache="concat"``: transformers' own cache, which copies every
  layer's keys and values at every token (the path before the in-place cache, the same numbers);
- ``backend-static``: the same with ``kv_cache="static"`` (an engine option): keys and values
  written in place into buffers sized for the generation instead of concatenated every step.

``bf16-fp32attn`` (a ``--dtypes`` entry) runs every way in bf16 with attention in fp32
(``backend.attention float32``): CPU bf16 attention was 5x fp32's here.

Each gives seconds a step and tokens/s (batch / step), as a fraction of
``docs/results/roofline*.json``'s decode ceiling at that batch and dtype (bandwidth-bound:
every step reads every weight). Then ``torch.profiler`` over ``forward`` steps: the ops with the
most self CPU time, and the share in matrix products (``aten::mm``, ``addmm``, ``bmm``, the
oneDNN linear) against everything else a 30-layer model launches per token.

    .venv/bin/python bench/decode_profile.py                        # batch 1 and 8, fp32 and bf16
    .venv/bin/python bench/decode_profile.py --batches 8 --dtypes fp32 --new 16 --results-dir runs/smoke

Writes ``docs/results/decode_profile.json``; the table is printed last. A busy neighbour
slows every figure: say in ``--note`` what else ran.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results  # noqa: E402
from seed_agents.precision import attention_in_fp32, compute_in  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "bf16-fp32attn": torch.bfloat16}
# bf16-fp32attn: bf16 products with attention in fp32 (backend.attention float32); its ceiling is bf16's
MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear", "mkldnn", "onednn")


def bare_steps(model: Any, prompts: torch.Tensor) -> Iterator[None]:
    """The bare model's decode: the prefill, then one greedy step on the KV cache per ``next()``.
    The caller pulls the steps it times or profiles inside its own ``no_grad``/``compute_in``
    (a generator holding those would leave them on in the caller between steps)."""
    out = model(input_ids=prompts, use_cache=True)
    while True:
        past, nxt = out.past_key_values, out.logits[:, -1].argmax(-1, keepdim=True)
        yield
        out = model(input_ids=nxt, past_key_values=past, use_cache=True)


def forward_step_s(model: Any, prompts: torch.Tensor, new: int, dtype: torch.dtype) -> float:
    """Seconds a decode step costs the bare model (prefill excluded)."""
    with torch.no_grad(), compute_in(dtype):
        steps = bare_steps(model, prompts)
        next(steps)  # the prefill
        t0 = time.perf_counter()
        for _ in range(new):
            next(steps)
        return (time.perf_counter() - t0) / new


def generate_s(model: Any, prompts: torch.Tensor, new: int, dtype: torch.dtype) -> float:
    """Seconds of one greedy ``generate`` of exactly ``new`` tokens a row."""
    from transformers import GenerationConfig

    cfg = GenerationConfig(max_new_tokens=new, min_new_tokens=new, do_sample=False, temperature=None, top_p=None,
                           top_k=None, pad_token_id=0)
    with torch.no_grad(), compute_in(dtype):
        t0 = time.perf_counter()
        model.generate(input_ids=prompts, attention_mask=torch.ones_like(prompts), generation_config=cfg)
        return time.perf_counter() - t0


def backend_s(backend: Any, prompts: torch.Tensor, new: int) -> tuple[float, int]:
    """Seconds for the rows sent together through ``LocalBackend``, and the steps its longest row took."""
    from seed_agents.types import SamplingParams

    async def run() -> list[Any]:
        return await asyncio.gather(*(backend.agenerate(row.tolist(), SamplingParams(max_tokens=new, temperature=0.7,
                                                                                       seed=i))
                                      for i, row in enumerate(prompts)))

    backend.turn_cache.check(-1)  # every call starts cold: no row reads another's keys and values
    t0 = time.perf_counter()
    comps = asyncio.run(run())
    return time.perf_counter() - t0, max(len(c.token_ids) for c in comps)


def step_figures(step_s: float, batch: int, ceiling: float | None) -> dict[str, float | None]:
    """A way's seconds a step, tokens/s and fraction of the ceiling. A way timed as a whole
    call less its one-token call can come out at or below 0 when a neighbour's load swamps a
    short decode: that is noise, not speed, so it is kept as unmeasured (None) and printed so."""
    if step_s <= 0:
        return {"step_s": None, "tokens_per_s": None, "of_ceiling": None}
    return {"step_s": step_s, "tokens_per_s": batch / step_s, "of_ceiling": batch / step_s / ceiling if ceiling else None}


def profile_ops(model: Any, prompts: torch.Tensor, steps: int, dtype: torch.dtype, top: int) -> dict[str, Any]:
    """Self CPU time by op over ``steps`` bare decode steps; the matrix products' share of it."""
    from torch.profiler import ProfilerActivity, profile

    with torch.no_grad(), compute_in(dtype):
        decode = bare_steps(model, prompts)
        next(decode)  # the prefill, outside the profile
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(steps):
                next(decode)
    ops = sorted(prof.key_averages(), key=lambda e: e.self_cpu_time_total, reverse=True)
    total = sum(e.self_cpu_time_total for e in ops)
    matmul = sum(e.self_cpu_time_total for e in ops if any(m in e.key for m in MATMUL_OPS))
    return {"steps": steps, "self_cpu_us_per_step": total / steps, "matmul_share": matmul / total if total else 0.0,
            "ops_launched_per_step": sum(e.count for e in ops) / steps,
            "top": [{"op": e.key, "self_us_per_step": e.self_cpu_time_total / steps, "calls_per_step": e.count / steps}
                    for e in ops[:top]]}


def way_line(x: dict[str, Any]) -> str:
    if x["step_s"] is None:
        return "below noise (its one-token call took as long)"
    return (f"{x['step_s'] * 1e3:.1f} ms/step ({x['tokens_per_s']:.0f} tok/s"
            + (f", {x['of_ceiling']:.0%} of ceiling)" if x["of_ceiling"] is not None else ")"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m", help="Alias or local folder.")
    ap.add_argument("--batches", default="1,8", help="Comma list of batch sizes.")
    ap.add_argument("--dtypes", default="fp32,bf16,bf16-fp32attn",
                    help="Comma list from fp32, bf16 (autocast, as the backend), bf16-fp32attn (the same, attention in fp32).")
    ap.add_argument("--prompt", type=int, default=400, help="Prompt tokens a row (an atlas turn is ~400).")
    ap.add_argument("--new", type=int, default=64, help="New tokens a row (the learning curves' max_tokens).")
    ap.add_argument("--repeats", type=int, default=3, help="Timed samples per way (the median is kept).")
    ap.add_argument("--profile-steps", type=int, default=16, help="Bare steps under the profiler (0: none).")
    ap.add_argument("--top", type=int, default=12, help="Ops listed from the profile.")
    ap.add_argument("--note", default="", help="What else ran on the machine (written into the result).")
    ap.add_argument("--roofline", default=None,
                    help="The ceilings' file (default: the docs/results/roofline*.json measured on a CPU like this one).")
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",")]
        dtypes = [d.strip() for d in args.dtypes.split(",")]
    except ValueError:
        ap.error("--batches: comma-separated integers")
    if not batches or min(batches) < 1 or set(dtypes) - set(DTYPES) or args.new < 2 or args.prompt < 1:
        ap.error(f"--batches: integers >= 1; --dtypes: from {', '.join(DTYPES)}; --new >= 2; --prompt >= 1")
    try:  # a ceiling from another CPU would misstate every fraction
        ceilings = bench_results.load_roofline(args.roofline).results["ceilings"]
    except bench_results.RooflineMismatch as e:
        ap.error(str(e))
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from seed_agents.backends.local import LocalBackend
    from seed_agents.models import resolve_model

    started = bench_results.now()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    path = resolve_model(args.model)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    gen, vocab = torch.Generator().manual_seed(0), model.config.vocab_size
    runs = []
    for name in dtypes:
        dtype = DTYPES[name]
        if name == "bf16-fp32attn":
            attention_in_fp32(model)  # every way below, the bare step's included
        else:
            model.set_attn_implementation("sdpa")
        # every row through every step (drop_finished off): a step's cost at a fixed batch is the
        # figure here; what finished rows leaving the forward saves is demo_speed's to measure
        backends = {way: LocalBackend(model, tokenizer=tokenizer, max_batch_size=max(batches), compute_dtype=dtype,
                                      batch_wait_s=0.05, kv_cache=cache, drop_finished=False)
                    for way, cache in (("backend", "dynamic"), ("backend-concat", "concat"), ("backend-static", "static"))}
        for b in batches:
            prompts = torch.randint(min(1000, vocab // 2), min(40000, vocab), (b, args.prompt), generator=gen)
            forward_step_s(model, prompts, 2, dtype)  # warm-up: allocations, oneDNN primitives
            fwd = statistics.median(forward_step_s(model, prompts, args.new, dtype) for _ in range(args.repeats))
            prefill = statistics.median(generate_s(model, prompts, 1, dtype) for _ in range(args.repeats))
            whole = statistics.median(generate_s(model, prompts, args.new, dtype) for _ in range(args.repeats))
            ways = {"forward": fwd, "generate": (whole - prefill) / (args.new - 1)}
            own_prefill = {}
            for way, backend in backends.items():
                backend_s(backend, prompts, 2)
                own_prefill[way] = statistics.median(backend_s(backend, prompts, 1)[0] for _ in range(args.repeats))
                took = [backend_s(backend, prompts, args.new) for _ in range(args.repeats)]
                ways[way] = statistics.median((s - own_prefill[way]) / max(steps - 1, 1) for s, steps in took)
            ceiling = ceilings[name.split("-")[0]]["decode_tokens_per_s"].get(str(b))
            run = {"dtype": name, "batch": b, "prefill_s": prefill, "backend_prefill_s": own_prefill["backend"],
                   "backend_static_prefill_s": own_prefill["backend-static"],
                   "decode_ceiling_tokens_per_s": ceiling,
                   "ways": {w: step_figures(s, b, ceiling) for w, s in ways.items()}}
            if args.profile_steps:
                run["profile"] = profile_ops(model, prompts, args.profile_steps, dtype, args.top)
            runs.append(run)
            print(f"{name} batch {b}: " + ", ".join(f"{w} {way_line(x)}" for w, x in run["ways"].items()), flush=True)
    bench_results.write_result("decode_profile", bench_results.config_of(args), {"runs": runs, "note": args.note},
                               started_at=started, results_dir=args.results_dir)
    for run in runs:
        if "profile" in run:
            p = run["profile"]
            print(f"\n{run['dtype']} batch {run['batch']}: {p['self_cpu_us_per_step'] / 1e3:.1f} ms self CPU a step, "
                  f"{p['ops_launched_per_step']:.0f} ops launched, matrix products {p['matmul_share']:.0%}")
            for op in p["top"]:
                print(f"  {op['op']:<40} {op['self_us_per_step'] / 1e3:7.2f} ms  x{op['calls_per_step']:.0f}")
    print("\n| dtype | batch | way | ms a step | tokens/s | of decode ceiling |\n|---|---|---|---|---|---|")
    for run in runs:
        for w, x in run["ways"].items():
            if x["step_s"] is None:
                print(f"| {run['dtype']} | {run['batch']} | {w} | below noise | - | - |")
                continue
            frac = f"{x['of_ceiling']:.2f}" if x["of_ceiling"] is not None else "-"
            print(f"| {run['dtype']} | {run['batch']} | {w} | {x['step_s'] * 1e3:.1f} | {x['tokens_per_s']:.0f} | {frac} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
