"""bench/update_memory.py's sides: "on" recomputes at every update (the trainer would keep
activations that fit), "off" never; ``--demo`` is the README's iteration from a given model."""

import argparse

import pytest

from bench import update_memory
from seed_agents.config import TrainConfig


@pytest.mark.parametrize("demo", [False, True])
def test_on_recomputes_at_every_update_and_off_never(tmp_path, demo):
    args = argparse.Namespace(demo=str(tmp_path) if demo else None, seed=3, model="smollm2-135m")
    on, off = (TrainConfig.model_validate(update_memory.config(tmp_path / s, s == "on", args)) for s in ("on", "off"))
    assert (on.trainer.gradient_checkpointing, on.trainer.keep_activations_gb) == (True, 0)
    assert off.trainer.gradient_checkpointing is False
    assert on.model_copy(update={"trainer": off.trainer, "out": off.out}) == off  # nothing else differs
    assert (on.iterations, on.seed, on.stage1.run) == (1, 3, "off")


def test_the_demo_form_is_the_embedded_demo_from_the_given_model(tmp_path):
    args = argparse.Namespace(demo=str(tmp_path), seed=0, model="smollm2-135m")
    got = TrainConfig.model_validate(update_memory.config(tmp_path / "off", False, args))
    demo = TrainConfig()
    assert got.backend == demo.backend.model_copy(update={"model": str(tmp_path)})
    restored = {"backend": demo.backend, "trainer": demo.trainer, "out": demo.out, "iterations": demo.iterations,
                "stage1": demo.stage1}
    assert got.model_copy(update=restored) == demo
    assert got.trainer.model_copy(update={"gradient_checkpointing": True}) == demo.trainer


def test_a_missing_model_folder_is_one_line_and_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        update_memory.main(["--demo", str(tmp_path / "nope"), "--results-dir", str(tmp_path)])
    assert e.value.code == 2 and "no such model folder" in capsys.readouterr().err
