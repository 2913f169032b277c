"""bench/page_faults.py: each allocator setting runs in its own process and reports its steps."""

import json

import pytest

from bench import page_faults


def test_each_variant_reports_its_own_steps_and_bad_variants_are_one_line(tiny_model_dir, tmp_path, capsys):
    page_faults.main(["--model", tiny_model_dir, "--rows", "1", "--tokens", "8", "--steps", "2", "--repeats", "1",
                      "--threads", "1", "--variants", "default,no_mmap", "--results-dir", str(tmp_path)])
    doc = json.loads((tmp_path / "page_faults.json").read_text())
    steps = doc["results"]["steps"]
    assert set(steps) == {"default", "no_mmap"} and all(len(rows) == 2 for rows in steps.values())
    for rows in steps.values():
        assert all(r["faults"] >= 0 and r["user_s"] >= 0 and r["sys_s"] >= 0 and r["wall_s"] > 0 for r in rows)
    assert 0 <= doc["results"]["kernel_share_default"] < 1
    assert "kernel's share of the default step" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        page_faults.main(["--variants", "default,jemalloc", "--results-dir", str(tmp_path)])
    assert "--variants: choose from" in capsys.readouterr().err


def test_a_failing_variant_is_one_line_naming_it(tmp_path):
    with pytest.raises(SystemExit, match="variant default failed"):
        page_faults.main(["--model", str(tmp_path / "no-such-model"), "--repeats", "1", "--variants", "default",
                          "--results-dir", str(tmp_path)])
