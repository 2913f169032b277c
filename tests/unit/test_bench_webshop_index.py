"""bench/webshop_index.py runs, and its synthetic corpus is what it says: seeded, Zipfian."""

from __future__ import annotations

import importlib.util
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("bench_webshop_index", ROOT / "bench" / "webshop_index.py")
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


def test_zipf_words_are_seeded_and_rank_ordered():
    a, b = bench.ZipfWords(1000, 1.0, seed=3), bench.ZipfWords(1000, 1.0, seed=3)
    sample = a.sample(20000)
    assert sample == b.sample(20000)
    counts = Counter(sample)
    # P(w0) / P(w9) = 10 under s = 1; sampling noise stays far from the 1x of a uniform draw
    assert 6 < counts["w0"] / counts["w9"] < 16


def test_the_bench_prints_its_figures(capsys, tmp_path):
    assert bench.main(["--products", "300", "--words", "20", "--vocab", "500", "--queries", "5",
                       "--results-dir", str(tmp_path)]) == 0  # never over the committed docs/results
    out = capsys.readouterr().out
    assert "documents        300" in out and "documents/s" in out and "p95" in out
    assert "same top 50 on 5/5 queries" in out  # the numpy scorer agrees with the reference loop
