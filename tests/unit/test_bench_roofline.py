"""bench/roofline.py: bf16 where the CPU only emulates it gets one cold sample per shape."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from bench import roofline  # noqa: E402


@pytest.mark.parametrize("flags", [["avx2"], ["avx2", "avx512f", "avx512_bf16"]], ids=["avx2", "avx512-bf16"])
def test_bf16_is_sampled_once_cold_only_where_it_is_emulated(flags, monkeypatch, tmp_path):
    calls = []

    def fake_matmul(m, k, n, dtype, repeats, warm_up=True):
        calls.append((dtype, repeats, warm_up))
        return {"best": 100.0 if dtype == torch.float32 else 3.0, "median": 90.0}

    monkeypatch.setattr(roofline, "cpu_flags", lambda: flags)
    monkeypatch.setattr(roofline, "matmul_gflops", fake_matmul)
    monkeypatch.setattr(roofline, "copy_gbps", lambda mb, repeats: {"best": 20.0, "median": 19.0})
    roofline.main(["--repeats", "4", "--results-dir", str(tmp_path)])
    emulated = "avx512_bf16" not in flags
    assert {c for c in calls if c[0] == torch.float32} == {(torch.float32, 4, True)}
    assert {c for c in calls if c[0] == torch.bfloat16} == {(torch.bfloat16, 1, False) if emulated else (torch.bfloat16, 4, True)}
    doc = json.loads((tmp_path / "roofline.json").read_text())
    assert doc["results"]["bf16_emulated"] is emulated


def test_another_machines_roofline_is_kept_under_its_own_name(monkeypatch, tmp_path):
    monkeypatch.setattr(roofline, "cpu_flags", lambda: ["avx2"])
    monkeypatch.setattr(roofline, "matmul_gflops", lambda m, k, n, dtype, repeats, warm_up=True: {"best": 1.0, "median": 1.0})
    monkeypatch.setattr(roofline, "copy_gbps", lambda mb, repeats: {"best": 20.0, "median": 19.0})
    roofline.main(["--repeats", "1", "--results-dir", str(tmp_path), "--result-name", "roofline_avx2"])
    assert [p.name for p in tmp_path.iterdir()] == ["roofline_avx2.json"]
    with pytest.raises(SystemExit):  # any other name would not be found as a roofline
        roofline.main(["--results-dir", str(tmp_path), "--result-name", "ceilings"])
