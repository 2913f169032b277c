"""How long WebShop's pure-Python BM25 index takes to build, how much memory it holds, and
how fast it answers, at the size of the full catalog.

The original WebShop indexes 1.18M products with Lucene (Java). ``tools.webshop.search``
replaces it with a pure-Python BM25, built once per process on the first search (or in
``suite.prepare``). This measures that build and the search latency.

Two sources:
- default: ``--products`` synthetic documents of ``--words`` words each, drawn from a
  Zipf-distributed vocabulary of ``--vocab`` words (natural text's word frequencies, which
  decide how long the posting lists get). This is not WebShop's text: its documents
  (title, description, first bullet point, option values) vary in length, so the figures
  scale with the words per document; the script prints words/s to make that explicit.
- ``--data-dir DIR``: the real WebShop files (as for ``env: webshop``), indexed exactly
  as the env does. Loading the JSON is timed separately.

Printed: build seconds, documents/s and words/s, the process's peak RSS before and after
the build, and the median and 95th-percentile latency of ``--queries`` searches (queries
of 3 to 8 words drawn like the documents' words, or the real goals' instructions), with
the index's numpy scorer and with ``reference_search`` (the plain-Python loop it
replaced, which it must equal), on the same queries in the same run, and how many of
the queries got the same top 50 from both.

    .venv/bin/python bench/webshop_index.py --products 100000      # ~1 min
    .venv/bin/python bench/webshop_index.py                        # full size, synthetic
    .venv/bin/python bench/webshop_index.py --data-dir ~/webshop/data

Writes its figures and every query's latency to ``docs/results/webshop_index.json``
(``webshop_index_data.json`` with ``--data-dir``; ``--results-dir``).
"""

from __future__ import annotations

import argparse
import random
import resource
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import results as bench_results  # noqa: E402
from seed_agents.tools.webshop.search import BM25Index, reference_search  # noqa: E402

FULL_CATALOG = 1_181_436  # products in WebShop's items_shuffle.json
# the original WebShop: its full catalog, its own text, Lucene; the header names what differs
PAPER = {"products": FULL_CATALOG, "source": "WebShop items_shuffle.json"}
LABELS = {"products": "documents", "source": "text"}


def peak_rss_gb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 ** 2  # Linux: KiB


class ZipfWords:
    """Words ``w0 .. w{n-1}`` with P(rank r) proportional to 1 / (r + 1)^s, seeded."""

    def __init__(self, vocab: int, s: float, seed: int) -> None:
        self.words = [f"w{i}" for i in range(vocab)]
        weights = [1.0 / (r + 1) ** s for r in range(vocab)]
        total = sum(weights)
        acc, self.cum = 0.0, []
        for w in weights:
            acc += w / total
            self.cum.append(acc)
        self.rng = random.Random(seed)

    def sample(self, k: int) -> list[str]:
        return self.rng.choices(self.words, cum_weights=self.cum, k=k)


def synthetic_docs(n: int, words: int, zipf: ZipfWords) -> Iterator[str]:
    for _ in range(n):
        yield " ".join(zipf.sample(words))


def time_searches(searches: list[Callable[[str], list[int]]],
                  queries: list[str]) -> list[tuple[float, float, list[list[int]], list[float]]]:
    """Per search function: (median, p95) latency in seconds, each query's results and each
    query's latency. The functions take turns on every query, so load on the machine hits them alike."""
    lat: list[list[float]] = [[] for _ in searches]
    results: list[list[list[int]]] = [[] for _ in searches]
    for q in queries:
        for i, search in enumerate(searches):
            t0 = time.perf_counter()
            results[i].append(search(q))
            lat[i].append(time.perf_counter() - t0)
    out = []
    for ls, rs in zip(lat, results):
        s = sorted(ls)
        out.append((statistics.median(s), s[min(len(s) - 1, int(0.95 * len(s)))], rs, ls))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--products", type=int, default=FULL_CATALOG, help="Synthetic documents (default: WebShop's count).")
    p.add_argument("--words", type=int, default=100, help="Words per synthetic document.")
    p.add_argument("--vocab", type=int, default=200_000, help="Synthetic vocabulary size.")
    p.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of the synthetic words.")
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", dest="data_dir", type=Path, default=None, help="Real WebShop data instead.")
    bench_results.add_results_args(p)
    args = p.parse_args(argv)
    started = bench_results.now()

    if args.data_dir is not None:
        from seed_agents.tools.webshop.catalog import load_webshop

        t0 = time.perf_counter()
        catalog = load_webshop(args.data_dir)
        print(f"loaded {len(catalog.products)} products and {len(catalog.goals)} goals in "
              f"{time.perf_counter() - t0:.1f}s (peak RSS {peak_rss_gb():.2f} GB)", flush=True)
        docs = [pr.search_text() for pr in catalog.products]
        queries = [g.instruction for g in random.Random(args.seed).sample(catalog.goals, min(args.queries, len(catalog.goals)))]
        source = f"WebShop files in {args.data_dir}"
        rss0 = peak_rss_gb()
    else:
        zipf = ZipfWords(args.vocab, args.zipf, args.seed)
        t0 = time.perf_counter()
        docs = list(synthetic_docs(args.products, args.words, zipf))
        print(f"generated {len(docs)} synthetic documents in {time.perf_counter() - t0:.1f}s", flush=True)
        rss0 = peak_rss_gb()
        qrng = random.Random(args.seed + 1)
        queries = [" ".join(zipf.sample(qrng.randint(3, 8))) for _ in range(args.queries)]
        source = f"synthetic: {args.products} documents x {args.words} words, Zipf s={args.zipf} over {args.vocab} words"

    print(f"building the index ({source}) ...", flush=True)
    t0 = time.perf_counter()
    index = BM25Index(docs)
    build_s = time.perf_counter() - t0
    rss1 = peak_rss_gb()
    n_docs = len(docs)
    n_words = index.total_terms  # after stopwords (none in the synthetic vocabulary)
    fast, slow = time_searches([index.search, lambda q: reference_search(index, q)], queries)
    same = sum(a == b for a, b in zip(fast[2], slow[2]))
    print(f"documents        {n_docs}")
    print(f"build            {build_s:.1f} s ({n_docs / build_s:,.0f} documents/s, {n_words / build_s:,.0f} indexed words/s, one core)")
    print(f"peak RSS         {rss0:.2f} GB with the documents in memory, {rss1:.2f} GB after the build")
    print(f"search (top 50), {len(queries)} queries:")
    print(f"  numpy scorer     median {fast[0] * 1000:8.1f} ms, p95 {fast[1] * 1000:8.1f} ms")
    print(f"  reference loop   median {slow[0] * 1000:8.1f} ms, p95 {slow[1] * 1000:8.1f} ms")
    print(f"  speedup          x{slow[0] / fast[0]:.1f} (median); same top 50 on {same}/{len(queries)} queries")
    config = {**bench_results.config_of(args), "products": n_docs,
              "source": "synthetic Zipf text" if args.data_dir is None else PAPER["source"]}
    bench_results.write_result(
        "webshop_index" if args.data_dir is None else "webshop_index_data", config,
        {"documents": n_docs, "indexed_words": n_words, "build_s": build_s, "documents_per_s": n_docs / build_s,
         "words_per_s": n_words / build_s, "peak_rss_gb_before_build": rss0, "peak_rss_gb_after_build": rss1,
         "queries": len(queries), "numpy_median_ms": fast[0] * 1000, "numpy_p95_ms": fast[1] * 1000,
         "reference_median_ms": slow[0] * 1000, "reference_p95_ms": slow[1] * 1000, "speedup_median": slow[0] / fast[0],
         "same_top50": same, "numpy_ms": [x * 1000 for x in fast[3]], "reference_ms": [x * 1000 for x in slow[3]]},
        paper=PAPER, labels=LABELS, started_at=started, results_dir=args.results_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
