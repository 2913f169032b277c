"""bench/activation_trim.py on the tiny random model: four ways, each timed, written out."""

import json

import pytest

from bench import activation_trim


def test_every_way_is_timed_and_written(tiny_model_dir, tmp_path, capsys):
    activation_trim.main(["--model", tiny_model_dir, "--precision", "float32", "--rows", "2", "--tokens", "100",
                          "--repeats", "2", "--results-dir", str(tmp_path)])
    r = json.loads((tmp_path / "activation_trim.json").read_text())["results"]
    assert set(r["passes"]) == set(activation_trim.WAYS) and all(len(p) == 2 for p in r["passes"].values())
    assert r["kept_over_recompute"] == pytest.approx(r["median_s"]["kept"] / r["median_s"]["recompute"], rel=1e-4)
    assert "kept / recompute:" in capsys.readouterr().out


def test_rows_too_short_for_the_head_are_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        activation_trim.main(["--rows", "8", "--tokens", "90", "--results-dir", str(tmp_path)])
    assert e.value.code == 2 and "80 real tokens" in capsys.readouterr().err


def test_each_way_asks_for_its_own_recompute_and_trim(tiny_model_dir, tmp_path, monkeypatch):
    """The ways differ in what they switch: the layers' recompute and the heap trim after a pass."""
    import contextlib

    import seed_agents.memory as memory
    import seed_agents.trainers.activations as activations

    seen = []
    real = activations.recompute

    @contextlib.contextmanager
    def recording(model, on):
        seen.append(("recompute", on))
        with real(model, on):
            yield

    monkeypatch.setattr(activations, "recompute", recording)
    monkeypatch.setattr(memory, "release_free_memory", lambda: seen.append(("trim",)) or True)
    activation_trim.main(["--model", tiny_model_dir, "--precision", "float32", "--rows", "1", "--tokens", "90",
                          "--repeats", "1", "--results-dir", str(tmp_path)])
    # untimed then timed, untrimmed pair first: recompute, kept, kept, recompute (alternating) ...
    assert seen[:4] == [("recompute", True), ("recompute", False), ("recompute", True), ("recompute", False)]
    assert seen[4:] == [("recompute", True), ("trim",), ("recompute", False), ("trim",)] * 2
