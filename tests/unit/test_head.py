"""The LM head at the kept positions only equals the full head there, gradients included
(tiny random model); the positions it skips read 0."""

import pytest
import torch

from seed_agents.trainers.head import completion_logps, plain_head
from seed_agents.trainers.shared_prefix import shared_prefix_logps
from seed_agents.types import Row
from tests.tiny import row_inputs, train_mode_model


def _rows(shared: int, shapes: list[tuple[int, int]], seed: int = 5) -> list[Row]:
    """Rows whose completions hold untrained stretches, as merged multi-turn rows do."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(5, 1000, (shared,), generator=g).tolist()
    rows = []
    for i, (p, c) in enumerate(shapes):
        loss_mask = (torch.rand(c, generator=g) < 0.3).long().tolist()
        loss_mask[0] = 1
        rows.append(Row(trajectory_id=f"t{i}", task_id="t", group_id="g", call_ids=[f"c{i}"],
                        prompt_ids=prefix + torch.randint(5, 1000, (p,), generator=g).tolist(),
                        completion_ids=torch.randint(5, 1000, (c,), generator=g).tolist(),
                        old_logprobs=[0.0] * c, loss_mask=loss_mask))
    return rows


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("shared", [0, 50])
@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_kept_positions_equal_the_full_head_with_gradients(tiny_model_dir, shared, checkpointing):
    model = train_mode_model(tiny_model_dir, checkpointing=checkpointing)
    rows = _rows(50, [(30, 20), (2, 31), (17, 7), (9, 26)])
    t, ids, mask = row_inputs(rows)
    c = t["completion_ids"].size(1)
    keep = t["loss_mask"].bool()
    assert 0 < int(keep.sum()) < int(t["completion_mask"].sum()), "the rows hold untrained positions"

    def score(kept):
        model.zero_grad()
        if shared:
            lp, ent = shared_prefix_logps(model, ids, mask, c, shared, compute_entropy=True, keep=kept)
        elif kept is None:  # the full path: the model's own forward and head
            logits = model(input_ids=ids, attention_mask=mask, logits_to_keep=c + 1).logits[:, :-1].float()
            logp_all = logits.log_softmax(-1)
            lp = logp_all.gather(-1, t["completion_ids"][..., None]).squeeze(-1)
            ent = -(logp_all.exp() * logp_all).sum(-1)
        else:
            lp, ent = completion_logps(model, ids, mask, c, kept, compute_entropy=True)
        # a loss shaped like the objective's terms: masked means of log-probs and entropies
        ((lp * t["loss_mask"]).sum() + 0.1 * (ent * t["loss_mask"]).sum()).backward()
        return lp.detach(), ent.detach(), _grads(model)

    full_lp, full_ent, full_grads = score(None)
    lp, ent, grads = score(keep)
    assert torch.allclose(lp[keep], full_lp[keep], atol=1e-4), (lp[keep] - full_lp[keep]).abs().max()
    assert torch.allclose(ent[keep], full_ent[keep], atol=1e-4)
    assert torch.all(lp[~keep] == 0) and torch.all(ent[~keep] == 0), "skipped positions read 0"
    assert grads.keys() == full_grads.keys() and grads
    for name, want in full_grads.items():
        assert torch.allclose(grads[name], want, atol=1e-4, rtol=1e-3), (name, (grads[name] - want).abs().max())


def test_nothing_kept_still_backpropagates(tiny_model_dir):
    """A chunk whose rows train no token (all observation) gives a differentiable zero."""
    model = train_mode_model(tiny_model_dir, checkpointing=False)
    rows = _rows(10, [(5, 4), (3, 6)])
    t, ids, mask = row_inputs(rows)
    keep = torch.zeros_like(t["loss_mask"], dtype=torch.bool)
    lp, ent = completion_logps(model, ids, mask, t["completion_ids"].size(1), keep, compute_entropy=True)
    assert torch.all(lp == 0) and torch.all(ent == 0)
    (lp.sum() + ent.sum()).backward()  # no error: still attached to the graph


def test_scaled_logits_keep_the_full_path(tiny_model_dir):
    model = train_mode_model(tiny_model_dir, checkpointing=False)
    assert plain_head(model) is not None
    model.config.final_logit_softcapping = 30.0
    assert plain_head(model) is None
    with pytest.raises(ValueError, match="plain_head"):
        completion_logps(model, torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.long), 1,
                         torch.ones(1, 1, dtype=torch.bool))
