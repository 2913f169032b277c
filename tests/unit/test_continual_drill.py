"""``seed-agents continual drill``: the gate rehearsed on a deliberately regressed candidate.

The regression is real weights (``perturb_lora`` on the tiny model: only LoRA B moves, by
the norm asked for, and the output distribution moves with it). The canary runs through
the loop's own ``ContinualLoop.evaluate`` with the demo library in process as the sandbox;
sampling goes through a fake serving (a random tiny model solves nothing, so it could not
show a regression): the promoted version's backend solves the borrow tasks, every other
version babbles. What must hold: the gate rejects, production stays on the promoted version
(also when the gate would promote), the episodes are stored with the drill's decision and
show in the report, and bad input is one line.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("peft")

import torch
from safetensors.torch import load_file

from examples.library_service import LIBRARY_TASKS, DemoServer
from seed_agents.app.cli import main
from seed_agents.app.continual_config import ContinualConfig
from seed_agents.app.drill import lora_b_noise, perturb_lora, run_drill
from seed_agents.continual import VersionRegistry
from seed_agents.continual.versions import served_name_of
from seed_agents.errors import ContinualError
from seed_agents.observe.data import canary_views
from seed_agents.observe.report import build_report
from seed_agents.store import ModelVersionRecord, TraceStore
from seed_agents.testing import FakeBackend

NAME = "library-agent"
SOLUTIONS = {"'Dune'": {"book_id": 1, "member_id": "ann"}, "'The Hobbit'": {"book_id": 2, "member_id": "bob", "days": 7}}


class FakeServing:
    """``Serving`` over scripted backends: versions in ``good`` borrow the asked book, then say
    so; any other version answers gibberish. Records what was loaded and unloaded."""

    def __init__(self, tokenizer: Any, good: set[int]) -> None:
        self.tokenizer, self.good = tokenizer, good
        self.loaded: list[int] = []
        self.unloaded: list[int] = []

    def _solve(self, prompt_ids: list[int]) -> str:
        prompt = self.tokenizer.decode(prompt_ids)
        if "<tool_response>" in prompt:
            return "Done: the book is borrowed."
        args = next(a for title, a in SOLUTIONS.items() if title in prompt)
        return f'<tool_call>\n{json.dumps({"name": "borrow_book", "arguments": args})}\n</tool_call>'

    def load(self, version: ModelVersionRecord) -> str:
        self.loaded.append(version.version)
        return served_name_of(version)

    def backend(self, version: ModelVersionRecord) -> FakeBackend:
        reply = self._solve if version.version in self.good else "zq xv blorp"
        return FakeBackend(self.tokenizer, reply, policy_version=version.version)

    def unload(self, version: ModelVersionRecord) -> None:
        self.unloaded.append(version.version)


@pytest.fixture
def prod() -> Iterator[DemoServer]:
    with DemoServer() as server:
        yield server


def make_config(tmp_path: Path, tiny_model_dir: str, prod_url: str) -> dict[str, Any]:
    canary = tmp_path / "canary.jsonl"
    canary.write_text("".join(json.dumps(t) + "\n" for t in LIBRARY_TASKS[:2]))  # the two borrow tasks
    return {
        "name": NAME, "store": f"sqlite:///{tmp_path / 'traces.db'}", "out": str(tmp_path / "run"),
        "backend": {"kind": "local", "model": tiny_model_dir},
        "sampling": {"max_tokens": 64, "temperature": 1.0},
        "trainer": {"learning_rate": 1e-3, "lora_r": 4, "kl_coef": 0.0, "gradient_checkpointing": False},
        "runner": {"concurrency": 2, "progress": False},
        "agent": {"tools": {"base_url": prod_url, "allow_hosts": ["127.0.0.1"]}, "max_turns": 3,
                  "reward": "examples.library_service:library_reward"},
        "canary": {"tasks": str(canary), "seeds": 2, "sandbox_app": "examples.library_service:create_app"},
        "gate": {"min_tasks": 2, "resamples": 200},
    }


# ------------------------------------------------------------------------ the regression


def test_lora_b_noise_has_the_asked_norm():
    weight = torch.tensor([[3.0, 0.0], [0.0, 4.0]])  # |W| = 5
    a = torch.tensor([[1.0, 0.0]])  # rank 1
    noise = torch.tensor([[1.0], [0.0]])  # scaling 2: |2 * noise @ A| = 2
    db = lora_b_noise(weight, a, 2.0, noise, strength=0.5)  # wanted: 0.5 * 5 = 2.5, so noise * 1.25
    assert torch.equal(db, torch.tensor([[1.25], [0.0]]))
    assert (2.0 * db @ a).norm().item() == pytest.approx(2.5)
    with pytest.raises(ContinualError, match="LoRA A matrix is zero"):
        lora_b_noise(weight, torch.zeros(1, 2), 2.0, noise, strength=1.0)


def test_perturb_lora_moves_only_b_and_the_model_with_it(tiny_model_dir):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    def fresh() -> Any:
        base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        return get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))

    ids = torch.tensor([[1, 50, 200, 300, 7, 9, 12]])
    model = fresh()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        logp0 = model(ids).logits.log_softmax(-1)  # B = 0: the base model
    assert perturb_lora(model, strength=1.0, seed=0) == 14  # 2 layers x 7 linear modules
    after = model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("lora_B" in k for k in changed) and len(changed) == 14
    kls = []
    for strength, m in ((1.0, model), (0.01, fresh())):
        if m is not model:
            perturb_lora(m, strength=strength, seed=0)
        with torch.no_grad():
            logp = m(ids).logits.log_softmax(-1)
        kls.append((logp0.exp() * (logp0 - logp)).sum(-1).mean().item())
    assert kls[0] > 0.5 and kls[1] < 0.01  # strength 1 moves the next-token distribution, 0.01 barely


# -------------------------------------------------------------------------------- the drill


def test_the_drill_is_rejected_stored_shown_and_changes_nothing(tmp_path, tiny_model_dir, tokenizer, prod):
    cfg = ContinualConfig.model_validate(make_config(tmp_path, tiny_model_dir, prod.url))
    store = TraceStore.open(cfg.store)
    registry = VersionRegistry(store)
    registry.bootstrap(NAME, served_name="tiny")
    stale = registry.add_candidate(NAME, "/gone", metadata={"drill": {"strength": 1.0}})  # a killed drill's
    serving = FakeServing(tokenizer, good={0})

    outcome = run_drill(cfg, store=store, serving=serving, log=lambda _: None)

    assert outcome.decision.verdict == "reject" and outcome.caught
    assert (outcome.decision.promoted_mean, outcome.decision.candidate_mean) == (1.0, 0.0)
    assert registry.resolve(NAME).version == 0  # type: ignore[union-attr] - production did not move
    drill = outcome.candidate
    assert {v.version: v.status for v in registry.versions(NAME)} == {0: "promoted", stale.version: "rejected", drill: "rejected"}
    assert serving.unloaded == [drill] and drill in serving.loaded and registry.pending(NAME) == []
    record = registry.decisions(NAME)[-1]
    assert (record.action, record.actor, record.version, record.from_version, record.to_version) == ("drill", "drill", drill, 0, 0)
    assert record.evidence["would_promote"] is False and record.evidence["drill"]["strength"] == 1.0
    assert registry.decisions(NAME)[-2].summary.startswith(f"drill: discard v{stale.version}")

    version = next(v for v in registry.versions(NAME) if v.version == drill)
    assert version.metadata["drill"]["matrices"] == 14 and version.metadata["drill"]["from_adapter"] is None
    tensors = load_file(str(Path(version.path) / "adapter_model.safetensors"))
    assert all(t.abs().sum() > 0 for k, t in tensors.items() if "lora_B" in k)  # a fresh LoRA has B = 0: noise went in

    episodes = registry.canary_episodes(record.decision_id)
    assert len(episodes) == 2 * 2 * 2 == outcome.episodes  # tasks x seeds x sides
    good = [e for e in episodes if e.side == "promoted"]
    bad = [e for e in episodes if e.side == "candidate"]
    assert all(e.success and e.version == 0 for e in good) and not any(e.success for e in bad)
    assert good[0].trace["tool_calls"][0]["name"] == "borrow_book" and good[0].trace["tool_calls"][0]["result"]
    assert bad[0].trace["answer"] == "zq xv blorp" and bad[0].trace["tool_calls"] == []

    view = canary_views(store, registry.decisions(NAME))[0]
    assert view.decision.decision_id == record.decision_id and view.tally("candidate") == (0, 0, 4)
    page = build_report(store, store_label="s")
    assert f'id="canary-{record.decision_id}" data-canary="{record.decision_id}" data-action="drill"' in page

    block = outcome.block()
    assert "PASSED: the gate rejected the regressed candidate" in block and "v0, unchanged" in block
    assert f"decision #{record.decision_id}" in block
    store.close()


def test_a_drill_the_gate_would_promote_still_changes_nothing(tmp_path, tiny_model_dir, tokenizer, prod):
    """The drill's candidate plays as well as the promoted version: the gate says promote,
    the drill reports a miss, and production stays where it was."""
    cfg = ContinualConfig.model_validate(make_config(tmp_path, tiny_model_dir, prod.url))
    store = TraceStore.open(cfg.store)
    registry = VersionRegistry(store)
    registry.bootstrap(NAME, served_name="tiny")
    outcome = run_drill(cfg, store=store, serving=FakeServing(tokenizer, good={0, 1}), log=lambda _: None)
    assert outcome.decision.verdict == "promote" and not outcome.caught
    assert registry.resolve(NAME).version == 0  # type: ignore[union-attr]
    assert {v.version: v.status for v in registry.versions(NAME)} == {0: "promoted", 1: "rejected"}
    assert registry.decisions(NAME)[-1].evidence["would_promote"] is True
    assert "the gate would have PROMOTED it" in registry.decisions(NAME)[-1].summary
    assert "FAILED: the gate would have PROMOTED" in outcome.block()
    store.close()


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path, tiny_model_dir, prod, capsys):
    raw = make_config(tmp_path, tiny_model_dir, prod.url)
    path = tmp_path / "loop.yaml"
    path.write_text(json.dumps(raw))
    assert main(["continual", "drill", "--config", str(path)]) == 2  # a fresh store: nothing promoted yet
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "has no promoted version" in err and "seed-agents continual drill" in err
    with TraceStore.open(raw["store"]) as store:
        assert store.model_versions() == []  # the drill bootstrapped nothing

    assert main(["continual", "drill", "--config", str(tmp_path / "missing.yaml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "cannot read config" in err
    assert main(["continual", "drill"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--config is required" in err
