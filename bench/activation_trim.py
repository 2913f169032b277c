"""Does keeping an update's activations pay, when the heap is given back after every update?

``trainer.keep_activations_gb`` lets an update keep its activations instead of recomputing
them in backward (``trainers/activations.py``). ``trainer.release_memory`` trims the heap after
every update (glibc ``malloc_trim``), so the next update maps the kept gigabytes afresh. This
script times the question in isolation: one SmolLM2 forward and backward at the demo's update
shape (``--rows`` rows of ``--tokens`` tokens, left-padded by 12 tokens a row more, the LM head
on the last 80 positions, the trainer's number format), four ways, alternating:

- ``recompute`` / ``kept``: the layers checkpointed or not (``activations.recompute``);
- ``+trim``: the heap trimmed after each pass (``seed_agents.memory.release_free_memory``), as
  the trainer does after each update.

The inputs are random token ids and the loss a stand-in (the log-sum-exp of the head's logits);
the model, its layers, the number format and the shapes are the update's, its loss terms and
optimizer are not. The untrimmed ways run first, then the trimmed ones (a pass right after a
trim maps its memory afresh); each way runs once untimed, then ``--repeats`` timed passes
alternating with its pair. Reported: each pass and the median. Writes ``docs/results/activation_trim.json``.

    .venv/bin/python bench/activation_trim.py --note "nothing else ran"     # ~6 min on 2 cores
    .venv/bin/python bench/activation_trim.py --rows 2 --tokens 64 --repeats 1 --results-dir runs/smoke
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path
from bench import results as bench_results  # noqa: E402

WAYS = ("recompute", "kept", "recompute+trim", "kept+trim")


def build(model_name: str, precision: str) -> tuple[Any, torch.dtype, str]:
    """SmolLM2 in training mode with non-reentrant checkpointing, in the update's number format
    (fp32 weights; bf16 autocast and fp32 attention where ``auto`` resolves so)."""
    from transformers import AutoModelForCausalLM

    from seed_agents.models import resolve_model
    from seed_agents.precision import attention_in_fp32, resolve_attention, resolve_precision

    dtype, why = resolve_precision(precision)
    model = AutoModelForCausalLM.from_pretrained(resolve_model(model_name), dtype=torch.float32)
    if dtype != torch.float32 and resolve_attention("auto", dtype)[0]:
        attention_in_fp32(model)
    model.train()
    if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
        model.activation_checkpointing_enable({"use_reentrant": False})
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model, dtype, why


def one_pass(model: Any, ids: torch.Tensor, mask: torch.Tensor, dtype: torch.dtype, way: str) -> float:
    """Seconds of one forward and backward the given way (the trim after it not counted)."""
    from seed_agents.memory import release_free_memory
    from seed_agents.precision import compute_in
    from seed_agents.trainers.activations import recompute

    decoder, head = model.get_decoder(), model.get_output_embeddings()
    model.zero_grad(set_to_none=True)
    start = time.perf_counter()
    with compute_in(dtype), recompute(model, way.startswith("recompute")):
        hidden = decoder(input_ids=ids, attention_mask=mask, use_cache=False).last_hidden_state
        loss = head(hidden[:, -80:]).float().logsumexp(-1).mean()
    loss.backward()
    took = time.perf_counter() - start
    del hidden, loss
    model.zero_grad(set_to_none=True)
    if way.endswith("+trim"):
        release_free_memory()
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--precision", default="auto", choices=["auto", "float32", "bfloat16"])
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=434, help="Columns a row (the demo's first batch: 434).")
    ap.add_argument("--repeats", type=int, default=5, help="Timed passes a way, after one untimed one.")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--note", default="", help="What else ran on the machine (it shapes the times).")
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    if min(args.rows, args.tokens, args.repeats) < 1 or args.tokens <= 80 + 12 * (args.rows - 1):
        ap.error("--rows, --tokens and --repeats must be positive, and every row must keep 80 real tokens")
    started = bench_results.now()
    torch.manual_seed(args.seed)
    model, dtype, why = build(args.model, args.precision)
    print(f"update computes in {why}", flush=True)
    ids = torch.randint(0, model.config.vocab_size, (args.rows, args.tokens))
    mask = torch.ones_like(ids)
    for i in range(args.rows):
        mask[i, :12 * i] = 0
    passes: dict[str, list[float]] = {w: [] for w in WAYS}
    # untrimmed ways first: a pass after a trim would map its memory afresh, which is the
    # trimmed ways' question, not theirs; within a block the two ways alternate
    for block in (WAYS[:2], WAYS[2:]):
        for w in block:
            one_pass(model, ids, mask, dtype, w)  # untimed: the first pass maps its memory
        for r in range(args.repeats):
            for w in (block if r % 2 == 0 else block[::-1]):
                passes[w].append(one_pass(model, ids, mask, dtype, w))
            print(f"repeat {r}: " + ", ".join(f"{w} {passes[w][-1]:.2f} s" for w in block), flush=True)
    median = {w: statistics.median(p) for w, p in passes.items()}
    ratios = {"kept_over_recompute": median["kept"] / median["recompute"],
              "kept_over_recompute_trimmed": median["kept+trim"] / median["recompute+trim"]}
    print(f"\nmedian of {args.repeats}: " + ", ".join(f"{w} {median[w]:.2f} s" for w in WAYS))
    print(f"kept / recompute: {ratios['kept_over_recompute']:.2f} without the trim, "
          f"{ratios['kept_over_recompute_trimmed']:.2f} with it")
    bench_results.write_result(
        "activation_trim", {**bench_results.config_of(args), "dtype": str(dtype).removeprefix("torch.")},
        {"passes": passes, "median_s": median, **ratios}, started_at=started, results_dir=args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
