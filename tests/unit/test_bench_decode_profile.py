"""bench/decode_profile.py on a tiny random model: every way timed per dtype and batch, read
against the roofline it was given, the profile's ops and matrix-product share recorded."""

from __future__ import annotations

import json

import pytest

from bench.decode_profile import main, step_figures
from bench.results import write_result


def _roofline(tmp_path):
    from bench.results import ceiling_flags

    ceilings = {"fp32": {"decode_tokens_per_s": {"1": 100.0, "2": 200.0}},
                "bf16": {"decode_tokens_per_s": {"1": 400.0}}}
    return write_result("roofline", {}, {"cpu_flags": ceiling_flags(), "ceilings": ceilings}, results_dir=tmp_path / "r")


def test_each_way_is_timed_and_read_against_the_ceiling(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--model", tiny_model_dir, "--batches", "1,2", "--dtypes", "fp32", "--prompt", "8", "--new", "3",
                 "--repeats", "1", "--profile-steps", "2", "--top", "3", "--roofline", str(_roofline(tmp_path)),
                 "--results-dir", str(out)]) == 0
    runs = json.loads((out / "decode_profile.json").read_text())["results"]["runs"]
    assert [(r["dtype"], r["batch"]) for r in runs] == [("fp32", 1), ("fp32", 2)]
    for r in runs:
        assert set(r["ways"]) == {"forward", "generate", "backend", "backend-concat", "backend-static"}
        assert r["ways"]["forward"]["step_s"] > 0  # timed step by step: never below noise
        for x in r["ways"].values():  # the others are a call less its one-token call: on a tiny model, noise can win
            if x["step_s"] is None:
                assert x["tokens_per_s"] is None and x["of_ceiling"] is None
                continue
            assert x["step_s"] > 0 and x["tokens_per_s"] == pytest.approx(r["batch"] / x["step_s"], rel=1e-4)
            assert x["of_ceiling"] == pytest.approx(x["tokens_per_s"] / (100.0 * r["batch"]), rel=1e-4)
        p = r["profile"]
        assert len(p["top"]) == 3 and 0 < p["matmul_share"] <= 1 and p["ops_launched_per_step"] > 30
    assert "| fp32 | 2 | backend" in capsys.readouterr().out
    assert step_figures(-0.001, 8, 100.0) == {"step_s": None, "tokens_per_s": None, "of_ceiling": None}


def test_bf16_with_fp32_attention_is_read_against_bf16s_ceiling_then_fp32_runs_plain(tiny_model_dir, tmp_path):
    out = tmp_path / "out"
    assert main(["--model", tiny_model_dir, "--batches", "1", "--dtypes", "bf16-fp32attn,fp32", "--prompt", "8",
                 "--new", "3", "--repeats", "1", "--profile-steps", "0", "--roofline", str(_roofline(tmp_path)),
                 "--results-dir", str(out)]) == 0
    attn, fp32 = json.loads((out / "decode_profile.json").read_text())["results"]["runs"]
    assert attn["dtype"] == "bf16-fp32attn" and attn["decode_ceiling_tokens_per_s"] == 400.0
    assert fp32["decode_ceiling_tokens_per_s"] == 100.0
    assert step_figures(0.05, 8, 100.0)["of_ceiling"] == pytest.approx(1.6)


@pytest.mark.parametrize("argv", [["--dtypes", "fp16"], ["--batches", "0"], ["--batches", "x"], ["--new", "1"]])
def test_bad_arguments_get_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and ": error: --" in err[-1]


def test_a_roofline_of_another_cpu_is_refused(tmp_path, capsys):
    path = write_result("roofline", {}, {"cpu_flags": ["not-this-cpu"], "ceilings": {}}, results_dir=tmp_path)
    with pytest.raises(SystemExit) as e:
        main(["--roofline", str(path)])
    assert e.value.code == 2 and "run bench/roofline.py here first" in capsys.readouterr().err
