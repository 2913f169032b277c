"""Keeping an update's activations when they fit (trainers/activations.py): the estimate, the
switch, and the trainer's choice per update, on the tiny random model."""

import contextlib

import pytest
import torch

pytest.importorskip("datasets")
from seed_agents.trainers import activations  # noqa: E402
from seed_agents.trainers.activations import ActivationCost, _saved_bytes, measure, recompute  # noqa: E402
from tests.tiny import enable_checkpointing, train_mode_model  # noqa: E402
from tests.unit.test_seed_trainer import make_trainer  # noqa: E402


def _layer_calls(model):
    """A list that grows by one each time a decoder layer's first module (its input norm) runs:
    in the forward and in a recompute. (Hooks on the layer itself stay outside the checkpoint,
    and a recompute stops as soon as backward has what it needs.)"""
    calls = []
    norms = [m.input_layernorm for m in model.modules() if type(m).__name__.endswith("DecoderLayer")]
    assert norms
    for m in norms:
        m.register_forward_pre_hook(lambda *_: calls.append(1))
    return calls


@pytest.mark.parametrize("bf16", [False, True])
def test_the_estimate_is_linear_in_tokens_and_matches_a_third_size(tiny_model_dir, bf16):
    """Fixed and per-token bytes come from two small forwards; a forward of another size
    saves what the line says (the saved bytes really are linear: flash-style attention keeps
    no tokens x tokens tensor). Under bf16 autocast the weights' bf16 copies are the fixed part."""
    model = train_mode_model(tiny_model_dir, checkpointing=True)
    autocast = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if bf16 else contextlib.nullcontext
    cost = measure(model, autocast)
    assert cost.per_token > 0 and (cost.fixed > 0.1 * cost.estimate(96)) is bf16, cost
    with recompute(model, False):
        actual = _saved_bytes(model.get_decoder(), torch.zeros((1, 300), dtype=torch.long), autocast)
    assert abs(cost.estimate(300) - actual) <= 0.02 * actual, (cost, actual)


def test_measuring_leaves_the_rng_and_the_checkpointing_as_they_were(tiny_model_dir):
    model = train_mode_model(tiny_model_dir, checkpointing=True)
    rng = torch.get_rng_state()
    measure(model)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(m.gradient_checkpointing for m in model.modules() if hasattr(m, "gradient_checkpointing")
               and type(m).__name__.endswith("DecoderLayer"))


@pytest.mark.parametrize("on", [True, False])
def test_the_switch_decides_at_the_forward_and_the_backward_follows(tiny_model_dir, on):
    """A forward run inside ``recompute(model, on)`` recomputes in its backward (after the block)
    only if ``on``; the layers checkpoint again after the block."""
    model = train_mode_model(tiny_model_dir, checkpointing=True)
    calls = _layer_calls(model)
    with recompute(model, on):
        loss = model(input_ids=torch.arange(12)[None], use_cache=False).logits.float().pow(2).mean()
    forwards = len(calls)
    loss.backward()
    assert len(calls) - forwards == (forwards if on else 0)
    assert all(m.gradient_checkpointing for m in model.modules() if type(m).__name__.endswith("DecoderLayer"))


def _one_update(trainer, inputs, calls):
    """(loss, gradients, decoder-layer forwards run in the backward: its recomputes)."""
    trainer.model.zero_grad()
    loss = trainer.compute_loss(trainer.model, inputs)
    calls.clear()
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, len(calls)


def test_the_trainer_keeps_what_fits_recomputes_what_does_not_and_the_numbers_agree(tiny_model_dir, tokenizer,
                                                                                    tmp_path, monkeypatch, capsys):
    """Under the budget the update recomputes nothing; over it, every layer recomputes; the
    loss and the gradients are the same either way. The estimate and the choice are in the
    step's metrics; the choice is printed when it changes. The default budget is a third of
    the available memory."""
    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, opd_coef=1.0, gradient_checkpointing=True,
                              keep_activations_gb=None)
    enable_checkpointing(trainer.model)
    trainer._generate_and_score_completions([trainer.train_dataset[i % 2] for i in range(8)])
    batch = trainer.last_batch
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = trainer.score_batch(batch)
    trainer._activation_cost = measure(trainer.model)  # as the first update would, outside the count
    calls = _layer_calls(trainer.model)
    tokens = sum(len(r.prompt_ids) + len(r.completion_ids) for r in batch.rows)

    results = {}
    for name, available in (("kept", 1e15), ("recomputed", 1.0)):
        monkeypatch.setattr(activations, "available_bytes", lambda device, available=available: available)
        results[name] = _one_update(trainer, inputs, calls)
    (loss_k, grads_k, n_k), (loss_r, grads_r, n_r) = results["kept"], results["recomputed"]
    assert n_k == 0 and n_r > 0  # only the recomputing update ran layer forwards again in backward
    assert torch.equal(loss_k, loss_r)  # the recompute replays the same kernels: the same bits
    assert grads_k.keys() == grads_r.keys() and all(torch.equal(grads_k[n], grads_r[n]) for n in grads_k)
    metrics = trainer._metrics["train"]
    assert metrics["update/recompute"] == [0.0, 1.0]
    cost = trainer._activation_cost
    assert metrics["update/activations_gb"] == [pytest.approx(cost.estimate(tokens) / 1e9)] * 2
    out = capsys.readouterr().out
    assert "kept, nothing recomputed" in out and "recomputed in backward" in out and "a third of the free memory" in out


@pytest.mark.parametrize("keep_gb, recomputes", [(0.0, True), (1e6, False), (1e-12, True)])
def test_a_given_budget_decides_and_zero_always_recomputes(tiny_model_dir, tokenizer, tmp_path, keep_gb, recomputes):
    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, opd_coef=0.0, gradient_checkpointing=True,
                              keep_activations_gb=keep_gb)
    enable_checkpointing(trainer.model)
    inputs = trainer._generate_and_score_completions([trainer.train_dataset[i % 2] for i in range(8)])
    trainer.model.train()
    assert trainer._keeps_activations(trainer.model, inputs) is not recomputes
    assert ("update/recompute" in trainer._metrics["train"]) is (keep_gb != 0)


def test_a_negative_budget_is_refused_and_the_default_always_recomputes(tmp_path):
    from seed_agents.trainers.seed_trainer import SEEDConfig

    with pytest.raises(ValueError, match="keep_activations_gb"):
        SEEDConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[], keep_activations_gb=-1.0)
    assert SEEDConfig(output_dir=str(tmp_path), use_cpu=True, report_to=[]).keep_activations_gb == 0


def test_the_budget_is_a_third_of_the_free_memory_of_the_update_s_device(monkeypatch):
    import psutil

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (6e9, 8e9))
    assert activations.budget_bytes(None, torch.device("cuda", 0)) == pytest.approx(2e9)
    free = psutil.virtual_memory().available
    assert activations.budget_bytes(None, torch.device("cpu")) == pytest.approx(free / 3, rel=0.25)
    assert activations.budget_bytes(1.5, torch.device("cuda", 0)) == 1.5e9


def test_the_estimate_is_fixed_plus_per_token():
    assert ActivationCost(fixed=10.0, per_token=2.0).estimate(5) == 20.0
