"""Capture gateway overhead: per-call latency through the gateway vs straight to vLLM,
and trace-store insert throughput (SQLite, and PostgreSQL when ``--pg-url`` is given).

Starts its own vLLM server (a tiny random model by default, or ``--model``) with prefix
caching off, so the same prompt costs the same on every path, and the gateway as a
subprocess (``python -m seed_agents.gateway``, the CLI command) on a SQLite store. Each
round sends one prompt three ways, in rotating order so drift hits all alike:

- ``vllm-chat``: vLLM's own ``/v1/chat/completions`` (vLLM renders the template);
- ``vllm-ids``: ``/v1/completions`` with the prompt ids the gateway would send;
- ``gateway``: the gateway's ``/v1/chat/completions`` (render, sample, store, reply).

Greedy decoding of the same prompt makes every path generate the same tokens. Prints
p50/p99 per path and the gateway/direct ratios, then store inserts per second (one
writer, and 4 writer threads) for calls shaped like real ones.

    .venv/bin/python bench/gateway_overhead.py
    .venv/bin/python bench/gateway_overhead.py --model smollm2-135m --calls 100
    .venv/bin/python bench/gateway_overhead.py --pg-url postgresql://postgres@127.0.0.1:5432/bench

Every call's latency and every throughput run go to ``docs/results/gateway_overhead.json``
(``--results-dir``); the PostgreSQL URL is not stored (it can hold a password).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path

import httpx

from seed_agents.models import build_tiny_model, load_tokenizer, resolve_model
from seed_agents.serve import VLLMServer, free_port
from seed_agents.store import StoreError, TraceStore
from seed_agents.types import LLMCall, SamplingParams, new_id

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script: bench/ is on the path, its package is not
from bench import results as bench_results  # noqa: E402

SERVED = "bench-model"
# the paper serves a 3B model with 512-token responses; a call's fixed gateway cost weighs less there
PAPER = {"model": "Qwen2.5-3B-Instruct", "max_tokens": 512}
LABELS = {"model": "model", "max_tokens": "max tokens"}


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(q * (len(s) - 1)))]


def start_gateway(upstream: str, tokenizer_dir: str, db: Path, log: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "seed_agents.gateway", "--upstream", upstream, "--model", SERVED,
           "--tokenizer", tokenizer_dir, "--store", f"sqlite:///{db}", "--port", str(port)]
    proc = subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("gateway did not start in 120 s")


def latency_rounds(vllm_url: str, gateway_url: str, tokenizer, calls: int, max_tokens: int) -> dict[str, list[float]]:
    """Seconds per call for each path, ``calls`` rounds, order rotated per round."""
    eos = int(tokenizer.eos_token_id)
    times: dict[str, list[float]] = {"vllm-chat": [], "vllm-ids": [], "gateway": []}
    with httpx.Client(timeout=120) as client:
        def chat(url: str, messages: list[dict[str, str]]) -> None:
            r = client.post(f"{url}/v1/chat/completions", json={"model": SERVED, "messages": messages, "max_tokens": max_tokens, "temperature": 0.0})
            r.raise_for_status()

        def ids(prompt: list[int]) -> None:
            r = client.post(f"{vllm_url}/v1/completions", json={
                "model": SERVED, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0, "logprobs": 0,
                "return_token_ids": True, "skip_special_tokens": False, "stop_token_ids": [eos]})
            r.raise_for_status()

        order = list(times)
        for i in range(-3, calls):  # three untimed warm-up rounds
            messages = [{"role": "system", "content": "You are a helpful assistant."},
                        {"role": "user", "content": f"Question {i}: what should I pack for a two-day hike in the rain?"}]
            # rendered outside the timing: vllm-ids is the bare completion a client-side renderer pays
            text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            prompt = tokenizer(text, add_special_tokens=False)["input_ids"]
            paths: dict[str, Callable[[], None]] = {
                "vllm-chat": partial(chat, vllm_url, messages), "vllm-ids": partial(ids, prompt),
                "gateway": partial(chat, gateway_url, messages)}
            for name in order[i % 3:] + order[: i % 3]:
                t0 = time.perf_counter()
                paths[name]()
                if i >= 0:
                    times[name].append(time.perf_counter() - t0)
    return times


def sample_call(n_prompt: int, n_completion: int) -> LLMCall:
    return LLMCall(
        messages=[{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "x " * (n_prompt // 2)}],
        prompt_ids=list(range(1000, 1000 + n_prompt)), completion_ids=list(range(2000, 2000 + n_completion)),
        logprobs=[-0.123456789] * n_completion, text="y " * (n_completion // 2), policy_version=1,
        latency_s=0.5, sampling=SamplingParams(max_tokens=n_completion), scope={"source": "bench"})


def store_throughput(url: str, n: int, threads: int, calls_per_session: int = 8) -> float:
    """add_call per second into a fresh store at ``url``: ``threads`` writers, each its own sessions."""
    call = sample_call(300, 64)
    run = new_id()
    with TraceStore.open(url) as store:
        before = sum(s.num_calls for s in store.sessions())

        def writer(k: int) -> None:
            for j in range(n // threads):
                store.add_call(f"bench-{run}-{k}-{j // calls_per_session}", call.model_copy(update={"call_id": new_id()}))

        workers = [threading.Thread(target=writer, args=(k,)) for k in range(threads)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        wall = time.perf_counter() - t0
        stored = sum(s.num_calls for s in store.sessions()) - before
    if stored != (n // threads) * threads:
        raise RuntimeError(f"stored {stored} calls, expected {(n // threads) * threads}")
    return stored / wall


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="Model folder/alias to serve (default: a tiny random Llama with SmolLM2's tokenizer).")
    ap.add_argument("--calls", type=int, default=100, help="Timed rounds (each sends one call per path).")
    ap.add_argument("--max-tokens", dest="max_tokens", type=int, default=16)
    ap.add_argument("--store-calls", dest="store_calls", type=int, default=2000, help="Calls inserted per throughput run.")
    ap.add_argument("--pg-url", dest="pg_url", help="A PostgreSQL database for the throughput runs (its tables get created).")
    bench_results.add_results_args(ap)
    args = ap.parse_args(argv)
    started = bench_results.now()

    work = Path(tempfile.mkdtemp(prefix="seed-agents-gwbench-"))
    gateway = None
    try:
        model_dir = resolve_model(args.model) if args.model else build_tiny_model(work / "tiny-model", seed=0)
        tokenizer = load_tokenizer(model_dir)
        print(f"starting vLLM on {model_dir} ...", flush=True)
        with VLLMServer(model_dir, served_model_name=SERVED, work_dir=work / "vllm", extra_args=["--no-enable-prefix-caching"]) as server:
            gateway, gateway_url = start_gateway(server.url, model_dir, work / "gateway.db", work / "gateway.log")
            times = latency_rounds(server.url, gateway_url, tokenizer, args.calls, args.max_tokens)
            gateway.terminate()
            gateway.wait(timeout=30)
            with TraceStore.open(f"sqlite:///{work / 'gateway.db'}") as store:
                captured = sum(s.num_calls for s in store.sessions())
            try:
                vllm_version = httpx.get(f"{server.url}/version", timeout=10).json().get("version")
            except (httpx.HTTPError, ValueError):
                vllm_version = None
        print(f"\nper-call latency, {args.calls} sequential calls per path, max_tokens={args.max_tokens}, greedy "
              f"({captured} calls captured by the gateway):")
        latency = {name: {"p50_ms": 1000 * statistics.median(xs), "p99_ms": 1000 * percentile(xs, 0.99),
                          "mean_ms": 1000 * statistics.fmean(xs), "calls_ms": [1000 * x for x in xs]}
                   for name, xs in times.items()}
        print(f"  {'path':<10} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8}")
        for name, xs in times.items():
            print(f"  {name:<10} {1000 * statistics.median(xs):8.1f} {1000 * percentile(xs, 0.99):8.1f} {1000 * statistics.fmean(xs):8.1f}")
        for base in ("vllm-chat", "vllm-ids"):
            g, b = times["gateway"], times[base]
            print(f"  gateway / {base}: p50 x{statistics.median(g) / statistics.median(b):.2f}, "
                  f"p99 x{percentile(g, 0.99) / percentile(b, 0.99):.2f}, "
                  f"added p50 {1000 * (statistics.median(g) - statistics.median(b)):+.1f} ms")

        print(f"\nstore inserts (calls of 300 prompt + 64 completion tokens, {args.store_calls} per run):")
        inserts: dict[str, dict[str, float | None]] = {}
        targets = [("sqlite", lambda k: f"sqlite:///{work / f'bench-{k}.db'}")]
        if args.pg_url:
            targets.append(("postgresql", lambda k: args.pg_url))
        for label, url_for in targets:
            for threads in (1, 4):
                try:
                    rate = store_throughput(url_for(threads), args.store_calls, threads)
                except StoreError as e:
                    print(f"  {label:<11} {threads} writer(s): unavailable ({e})")
                    inserts.setdefault(label, {})[str(threads)] = None
                    break
                inserts.setdefault(label, {})[str(threads)] = rate
                print(f"  {label:<11} {threads} writer(s): {rate:8.0f} calls/s")
        config = {**bench_results.config_of(args), "pg_url": None, "postgresql": bool(args.pg_url),
                  "model": Path(str(args.model)).name if args.model else "tiny random Llama (SmolLM2 tokenizer)"}
        bench_results.write_result(
            "gateway_overhead", config,
            {"latency": latency, "captured_calls": captured, "store_inserts_per_s": inserts,
             "store_call_shape": {"prompt_tokens": 300, "completion_tokens": 64}},
            paper=PAPER, labels=LABELS, started_at=started, machine={"vllm_server": vllm_version},
            results_dir=args.results_dir)
    finally:
        if gateway is not None and gateway.poll() is None:
            gateway.kill()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
