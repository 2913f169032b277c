"""Scoring rows over one shared prefix equals scoring each row on its own (tiny random model)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from seed_agents.trainers.seed_trainer import rows_to_tensors
from seed_agents.backends.prefix import common_prefix_len, prefix_batches, worth_sharing
from seed_agents.trainers.shared_prefix import shared_prefix_logps, supported
from seed_agents.types import Row


def test_common_prefix_len():
    assert common_prefix_len([[1, 2, 3], [1, 2, 4], [1, 2]]) == 2
    assert common_prefix_len([[1, 2], [1, 2]]) == 2
    assert common_prefix_len([[5], [1]]) == 0
    assert common_prefix_len([]) == 0
    long = list(range(100))
    assert worth_sharing([long + [1], long + [2]]) == 100
    assert worth_sharing([long, long + [2]]) == 99, "every sequence keeps a token of its own"
    assert worth_sharing([long[:20] + [1], long[:20] + [2]]) == 0, "too short to pay"
    assert worth_sharing([long + [1]]) == 0, "one sequence shares with nobody"


def test_prefix_batches_break_where_sharing_ends():
    a, b = list(range(40)), [999] * 40
    seqs = [a + [1], a + [2], a + [3], b + [1], [7, 8], b + [2], b + [3]]
    assert prefix_batches(seqs, 8) == [[0, 1, 2], [3], [4], [5, 6]]
    assert prefix_batches(seqs, 2) == [[0, 1], [2], [3], [4], [5, 6]]
    assert prefix_batches([], 4) == []


def _rows(shared: int, shapes: list[tuple[int, int]], seed: int = 3) -> list[Row]:
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(5, 1000, (shared,), generator=g).tolist()
    return [Row(trajectory_id=f"t{i}", task_id="t", group_id="g", call_ids=[f"c{i}"],
                prompt_ids=prefix + torch.randint(5, 1000, (p,), generator=g).tolist(),
                completion_ids=torch.randint(5, 1000, (c,), generator=g).tolist(),
                old_logprobs=[0.0] * c, loss_mask=[1] * c) for i, (p, c) in enumerate(shapes)]


def _one_by_one(model, rows):
    """Each row alone, unpadded: the oracle."""
    logps, ents = [], []
    for r in rows:
        logits = model(torch.tensor([r.prompt_ids + r.completion_ids])).logits[0, len(r.prompt_ids) - 1:-1].float()
        lp = torch.log_softmax(logits, -1)
        logps.append(lp.gather(-1, torch.tensor(r.completion_ids)[:, None]).squeeze(-1))
        ents.append(-(lp.exp() * lp).sum(-1))
    return logps, ents


@pytest.mark.parametrize("checkpointing", [False, True])
def test_shared_prefix_equals_each_row_alone_with_gradients(tiny_model_dir, checkpointing):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    model.train()
    if checkpointing:
        if hasattr(model, "activation_checkpointing_enable"):  # transformers 5's name
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert supported(model)
    rows = _rows(60, [(30, 5), (2, 12), (17, 1), (9, 9)])
    t = rows_to_tensors(rows, torch.zeros(len(rows)), pad_id=0)
    ids = torch.cat([t["prompt_ids"], t["completion_ids"]], 1)
    mask = torch.cat([t["prompt_mask"], t["completion_mask"]], 1)
    keep = t["completion_ids"].size(1)

    model.zero_grad()
    logps, ents = shared_prefix_logps(model, ids, mask, keep, 60, compute_entropy=True)
    (logps * t["loss_mask"]).sum().backward()
    got = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    model.zero_grad()
    want_lp, want_ent = _one_by_one(model, rows)
    sum(lp.sum() for lp in want_lp).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    for i, r in enumerate(rows):
        n = len(r.completion_ids)
        assert torch.allclose(logps[i, :n], want_lp[i], atol=1e-4), (i, (logps[i, :n] - want_lp[i]).abs().max())
        assert torch.allclose(ents[i, :n], want_ent[i], atol=1e-4), i
    assert got.keys() == want.keys() and got
    for name in want:
        assert torch.allclose(got[name], want[name], atol=1e-4, rtol=1e-3), (name, (got[name] - want[name]).abs().max())
    # checkpointing is as it was: the context managers put every layer back
    assert all(getattr(m, "gradient_checkpointing", checkpointing) == checkpointing
               for m in model.modules() if hasattr(m, "_can_checkpoint_with_cache"))


def test_a_prefix_that_would_swallow_a_prompt_is_refused(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    rows = _rows(10, [(0, 3), (4, 2)])
    t = rows_to_tensors(rows, torch.zeros(2), pad_id=0)
    ids = torch.cat([t["prompt_ids"], t["completion_ids"]], 1)
    mask = torch.cat([t["prompt_mask"], t["completion_mask"]], 1)
    with pytest.raises(ValueError, match="shortest prompt"):
        shared_prefix_logps(model, ids, mask, t["completion_ids"].size(1), 10)
