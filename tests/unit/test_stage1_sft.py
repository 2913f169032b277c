"""`skills sft`: the held-out split, bad inputs, and real TRL SFT runs on a tiny random model."""

import json
import time

import pytest
import torch
from transformers import AutoModelForCausalLM

from seed_agents.app.cli import main
from seed_agents.chat_model import to_chat_dicts
from seed_agents.errors import ConfigError
from seed_agents.skills import build_analyzer_messages, parse_skill
from seed_agents.stage1.sft import SFTRunConfig, read_examples, run_sft, split_examples, to_dataset_rows
from seed_agents.testing import SKILL_JSON
from seed_agents.types import SkillExample


def example(i, task, *, valid=True, completion=SKILL_JSON, success=None, analyzer="rule-based-test"):
    """A short analyzer-like prompt (the real one is ~250 template tokens: too slow for a unit test)."""
    success = i % 2 == 0 if success is None else success
    messages = [{"role": "system", "content": "Analyze the episode; answer with JSON only."},
                {"role": "user", "content": f"Task: take the key ({task}). Outcome: {'success' if success else 'failure'}."}]
    return SkillExample(example_id=f"e{i}", trajectory_id=f"e{i}", task_id=task, success=success, messages=messages,
                        completion=completion if valid else "no json here", valid=valid,
                        reject_reason=None if valid else "not a JSON object", analyzer=analyzer)


def write(path, examples):
    path.write_text("".join(e.model_dump_json() + "\n" for e in examples))
    return path


# -- the split --------------------------------------------------------------------------


def test_split_holds_out_whole_tasks_deterministically():
    exs = [example(i, f"t{i // 2}") for i in range(10)]  # 5 tasks x 2 episodes
    train, held, info = split_examples(exs, 0.2, seed=0)
    assert info["mode"] == "task" and info["note"] is None
    assert len(info["heldout_task_ids"]) == 1 and len(held) == 2 and len(train) == 8
    assert not set(info["heldout_task_ids"]) & set(info["train_task_ids"])
    assert {e.task_id for e in held} == set(info["heldout_task_ids"])
    again = split_examples(exs, 0.2, seed=0)
    assert [e.example_id for e in again[1]] == [e.example_id for e in held]
    assert len({tuple(split_examples(exs, 0.2, seed=s)[2]["heldout_task_ids"]) for s in range(10)}) > 1


def test_split_falls_back_to_examples_when_there_are_too_few_tasks():
    exs = [example(i, f"t{i % 2}") for i in range(6)]  # 2 tasks: 0.2 of them rounds to none
    train, held, info = split_examples(exs, 0.2, seed=0)
    assert info["mode"] == "example" and "only 2 task(s)" in info["note"]
    assert len(held) == 1 and len(train) == 5
    assert split_examples(exs, 0.2, seed=0)[1][0].example_id == held[0].example_id
    with pytest.raises(ConfigError, match="at least 2"):
        split_examples(exs[:1], 0.2, seed=0)


def test_dataset_rows_are_conversational_prompt_completion():
    row = to_dataset_rows([example(0, "t0")])[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert row["completion"] == [{"role": "assistant", "content": SKILL_JSON}]


# -- bad inputs -------------------------------------------------------------------------


def test_bad_inputs_give_one_clear_error(tmp_path, tiny_model_dir):
    with pytest.raises(ConfigError, match="no examples files"):
        read_examples([])
    with pytest.raises(ConfigError, match="does not exist"):
        read_examples([tmp_path / "missing.jsonl"])
    bad = write(tmp_path / "bad.jsonl", [example(i, f"t{i}", valid=False) for i in range(3)])
    with pytest.raises(ConfigError, match="no valid examples .* 3 invalid"):
        read_examples([bad])
    (tmp_path / "garbage.jsonl").write_text('{"not": "an example"}\n{"x": 1}\n')
    with pytest.raises(ConfigError, match="not a file of SkillExample"):
        read_examples([tmp_path / "garbage.jsonl"])
    one = write(tmp_path / "one.jsonl", [example(0, "t0"), example(1, "t1", valid=False)])
    with pytest.raises(ConfigError, match="1 valid example"):
        run_sft(SFTRunConfig(examples=[one], model=tiny_model_dir, out=tmp_path / "out"))
    # duplicates (a collect run read twice) count once
    exs, counts = read_examples([one, one])
    assert len(exs) == 1 and counts["duplicate"] == 2


def test_cli_reports_bad_input_with_exit_code_2(tmp_path, capsys):
    assert main(["skills", "sft", "--examples", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path / "o")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["skills", "sft", "--examples", str(tmp_path / "nope.jsonl"), "--heldout", "1.5"]) == 2
    assert "heldout_fraction" in capsys.readouterr().err


# -- real SFT on a tiny random model ----------------------------------------------------


def _changed(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return [k for k in sa if not torch.equal(sa[k], sb[k])]


def test_full_sft_lowers_heldout_loss_and_saves_a_plain_model(tmp_path, tiny_model_dir):
    path = write(tmp_path / "examples.jsonl", [example(i, f"t{i // 2}") for i in range(6)]
                 + [example(9, "t9", valid=False)])
    cfg = SFTRunConfig(examples=[path], model=tiny_model_dir, out=tmp_path / "run", epochs=2, learning_rate=5e-3,
                       batch_size=4, eval_max_tokens=12, seed=0)
    s = run_sft(cfg)
    assert s["examples"]["valid"] == 6 and s["examples"]["invalid"] == 1
    assert s["split"]["mode"] == "task" and s["split"]["n_heldout"] == 2 and s["split"]["n_train"] == 4
    assert s["heldout_loss"]["after"] < s["heldout_loss"]["before"]
    # 12 tokens cannot hold a skill JSON: every held-out reply is rejected, before and after,
    # and the rate is the share of the recorded replies that parse
    assert s["parse_rate"] == {"before": 0.0, "after": 0.0, "n": 2}
    for when in ("before", "after"):
        g = s["generations"][when]
        assert g["n"] == 2 and sum(g["reject_reasons"].values()) == 2 and len(g["samples"]) == 2
        assert s["parse_rate"][when] == sum(parse_skill(t)[2] is None for t in g["samples"]) / 2
    assert [c["step"] for c in s["heldout_loss_curve"]] == [0, 1, 2]
    on_disk = json.loads((tmp_path / "run" / "sft_summary.json").read_text())
    assert on_disk["heldout_task_ids"] == s["split"]["heldout_task_ids"]
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model", dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    assert _changed(trained, base), "no parameter changed"
    assert not (tmp_path / "run" / "checkpoints").exists()
    with pytest.raises(ConfigError, match="already holds"):
        run_sft(cfg)


def test_lora_sft_from_the_cli_merges_the_adapter_into_a_plain_model(tmp_path, tiny_model_dir, capsys):
    path = write(tmp_path / "examples.jsonl", [example(i, f"t{i // 2}") for i in range(6)])
    rc = main(["skills", "sft", "--examples", str(path), "--model", tiny_model_dir, "--out", str(tmp_path / "run"),
               "--epochs", "1", "--lr", "5e-2", "--lora-r", "4", "--batch-size", "4", "--eval-max-tokens", "8",
               "--seed", "1"])
    assert rc == 0
    assert "skill parse rate" in capsys.readouterr().out
    s = json.loads((tmp_path / "run" / "sft_summary.json").read_text())
    assert s["lora_r"] == 4 and s["config"]["learning_rate"] == 5e-2
    assert s["heldout_loss"]["after"] < s["heldout_loss"]["before"]
    model_dir = tmp_path / "run" / "model"
    assert not (model_dir / "adapter_config.json").exists()
    trained = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    changed = _changed(trained, base)  # same keys: no lora_A/lora_B left
    assert changed and all("proj" in k for k in changed), changed


# -- slow: does SFT teach SmolLM2 the format? ---------------------------------------------

_OBJECTS = ["key", "apple", "book", "coin", "lamp", "box", "shoe", "cup", "map", "knife", "ring", "pen"]
_ROOMS = ["kitchen", "attic", "cellar", "garden", "hall", "study"]


def _rule_based_example(i, task_i):
    """An example shaped like the rule-based TextWorld analyzer's: a fixed JSON layout with
    task-specific content, success -> workflow, failure -> avoidance rule."""
    obj, room = _OBJECTS[task_i % len(_OBJECTS)], _ROOMS[task_i % len(_ROOMS)]
    success = i % 3 != 2
    steps = [(f"You are in the {room}. You see a {obj}.", f"take {obj}"),
             (f"You took the {obj}.", "go north" if success else "look"),
             ("You are in the hall. A chest is here.", f"put {obj} in chest" if success else "look")]
    task = f"Put the {obj} from the {room} into the chest in the hall."
    if success:
        summary = f"The agent took the {obj} in the {room}, went north to the hall and put it in the chest."
        skill = f"First take the {obj} in the {room}, then go north to the hall and put the {obj} in the chest."
    else:
        summary = f"The agent took the {obj} but kept looking around and never reached the chest."
        skill = f"Do not repeat look once you hold the {obj}; go north to the hall and put it in the chest."
    completion = json.dumps({"episode_summary": summary, "episode_skill": skill})
    messages = to_chat_dicts(build_analyzer_messages(task, success, steps))
    return SkillExample(example_id=f"e{task_i}-{i}", trajectory_id=f"e{task_i}-{i}", task_id=f"task{task_i}",
                        success=success, messages=messages, completion=completion, valid=True,
                        analyzer="rule-based-textworld")


@pytest.mark.slow
def test_sft_teaches_smollm2_the_skill_format(tmp_path, smollm2_dir):
    exs = [_rule_based_example(i, t) for t in range(10) for i in range(3)]  # 10 tasks x 3 episodes
    assert all(parse_skill(e.completion)[2] is None for e in exs)
    path = write(tmp_path / "examples.jsonl", exs)
    cfg = SFTRunConfig(examples=[path], model=smollm2_dir, out=tmp_path / "run", epochs=2, learning_rate=1e-4,
                       batch_size=4, eval_max_tokens=128, heldout_fraction=0.2, seed=0)
    t0 = time.perf_counter()
    s = run_sft(cfg)
    wall = time.perf_counter() - t0
    print(json.dumps({k: s[k] for k in ("split", "heldout_loss", "parse_rate")}, indent=1), f"wall {wall:.0f}s")
    print(s["generations"]["before"]["samples"][:1], s["generations"]["after"]["samples"][:1])
    assert s["split"]["mode"] == "task" and s["split"]["n_heldout"] == 6
    assert s["heldout_loss"]["after"] < s["heldout_loss"]["before"]
    assert s["parse_rate"]["after"] > max(0.5, s["parse_rate"]["before"])


def test_sft_prints_progress_between_epochs(capsys):
    """An epoch can take minutes on a loaded machine: a line with the step, the pace and the
    time left comes at most every ``every_s`` seconds, not only at the epoch's end."""
    from types import SimpleNamespace

    from seed_agents.stage1.sft import _epoch_printer

    printer = _epoch_printer(every_s=0.0)
    state = SimpleNamespace(global_step=0, max_steps=40, log_history=[])
    printer.on_train_begin(None, state, None)
    state.global_step = 10
    printer.on_step_end(None, state, None)
    line = capsys.readouterr().out.strip()
    assert line.startswith("SFT step 10/40") and "s/step" in line and "min left" in line
    quiet = _epoch_printer(every_s=3600.0)
    quiet.on_train_begin(None, state, None)
    quiet.on_step_end(None, state, None)
    assert capsys.readouterr().out == ""  # within the interval: silent


def test_bf16_sft_trains_fp32_master_weights_and_says_so(tmp_path, tiny_model_dir, capsys, monkeypatch):
    """``precision: bfloat16`` runs the SFT's matmuls under autocast (seen from inside every
    loss the trainer computes): the loss still falls and the saved model keeps fp32 weights
    (what `train` loads)."""
    from seed_agents.stage1.completion_sft import CompletionOnlySFTTrainer

    seen: list[torch.dtype] = []  # the output dtype of every linear layer inside a training loss
    in_loss: list[bool] = []
    compute_loss, linear = CompletionOnlySFTTrainer.compute_loss, torch.nn.Linear.forward

    def loss_spy(self, *args, **kwargs):
        in_loss.append(True)
        try:
            return compute_loss(self, *args, **kwargs)
        finally:
            in_loss.pop()

    def linear_spy(self, x):
        out = linear(self, x)
        if in_loss:
            seen.append(out.dtype)
        return out

    monkeypatch.setattr(CompletionOnlySFTTrainer, "compute_loss", loss_spy)
    monkeypatch.setattr(torch.nn.Linear, "forward", linear_spy)
    path = write(tmp_path / "examples.jsonl", [example(i, f"t{i // 2}") for i in range(6)])
    cfg = SFTRunConfig(examples=[path], model=tiny_model_dir, out=tmp_path / "run", epochs=2, learning_rate=5e-3,
                       batch_size=4, eval_max_tokens=12, seed=0, precision="bfloat16")
    s = run_sft(cfg)
    assert "SFT computes in bfloat16 (asked for)" in capsys.readouterr().out
    assert seen and set(seen) == {torch.bfloat16}
    assert s["heldout_loss"]["after"] < s["heldout_loss"]["before"]
    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "run" / "model")
    assert {p.dtype for p in trained.parameters()} == {torch.float32}
    assert _changed(trained, AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32))
