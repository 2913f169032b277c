"""Scoring rows over one shared prefix equals scoring each row on its own (tiny random model)."""

import pytest
import torch
from transformers import AutoModelForCausalLM

from seed_agents.trainers.seed_trainer import rows_to_tensors
from seed_agents.backends.prefix import common_prefix_len, prefix_batches, prefix_groups, worth_sharing
from seed_agents.trainers.shared_prefix import logps_on_prompt_kv, shared_prefix_logps, supported
from seed_agents.types import Row
from tests.tiny import row_inputs, train_mode_model


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


def test_prefix_groups_share_within_groups_what_the_batch_does_not():
    """Two tasks' hindsight prompts: everyone shares the instructions' start, each task's
    prompts share far more; the groups skip more tokens than the batch-wide prefix."""
    start = list(range(40))
    task_a, task_b = start + [100] * 60, start + [200] * 50
    seqs = [task_a + [1], task_b + [1], task_a + [2], task_b + [2], task_a + [3], [5, 6, 7]]
    assert worth_sharing(seqs[:5]) == 40
    assert prefix_groups(seqs) == [([0, 2, 4], 100), ([1, 3], 90)]  # (3 - 1) x 100 + 90 skipped, not 4 x 40
    # one group across all pays more than two small ones: 3 x 40 against 1 x 41 + 1 x 41
    near = [start + [9, 1], start + [9, 2], start + [8, 1], start + [8, 2]]
    assert prefix_groups(near) == [([0, 1, 2, 3], 40)]
    assert prefix_groups([start + [1], [3] * 50]) == [] and prefix_groups([]) == []
    assert prefix_groups([start, start + [2]]) == [([0, 1], 39)], "every sequence keeps a token of its own"


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
    model = train_mode_model(tiny_model_dir, checkpointing=checkpointing)
    assert supported(model)
    rows = _rows(60, [(30, 5), (2, 12), (17, 1), (9, 9)])
    t, ids, mask = row_inputs(rows)
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


@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_teacher_scored_on_the_rows_prompt_kv_equals_its_whole_prompt_scored_alone(tiny_model_dir, checkpointing):
    """SEED's teacher prompt is the row's prompt with a skill put in: after it (last_turn),
    before a prefill the row ends with, or inside the shared system block (before the
    chunk's prefix ends). Scored on the prompt keys and values the training forward kept,
    the completion's log-probs are those of the whole teacher prompt scored from scratch;
    and keeping them changes nothing the training forward computes."""
    model = train_mode_model(tiny_model_dir, checkpointing=checkpointing)
    rows = _rows(60, [(30, 5), (2, 12), (17, 1), (9, 9)])
    t, ids, mask = row_inputs(rows)
    keep = t["completion_ids"].size(1)
    plain, _ = shared_prefix_logps(model, ids, mask, keep, 60)
    kept = []
    logps, _ = shared_prefix_logps(model, ids, mask, keep, 60, keep_kv=kept)
    logps.sum().backward()  # the replays of checkpointed layers keep nothing twice
    assert torch.equal(logps.detach(), plain.detach()) and len(kept) == 1

    skill = [7, 8, 9, 10, 11]
    shared = [len(rows[0].prompt_ids),       # after the whole prompt
              len(rows[1].prompt_ids) - 1,   # before a one-token prefill
              20,                            # inside the chunk's shared prefix (the system block)
              len(rows[3].prompt_ids) - 4]   # before a longer prefill
    teachers = [r.prompt_ids[:n] + skill[:2 + i] + r.prompt_ids[n:] for i, (r, n) in enumerate(zip(rows, shared))]
    tails = [tp[n:] + r.completion_ids for tp, n, r in zip(teachers, shared, rows)]
    sel = [0, 1, 2, 3]
    got = logps_on_prompt_kv(model, kept[0], sel, shared, tails, [len(r.completion_ids) for r in rows])
    with torch.no_grad():
        want, _ = _one_by_one(model, [r.model_copy(update={"prompt_ids": tp}) for r, tp in zip(rows, teachers)])
    for i, r in enumerate(rows):
        n = len(r.completion_ids)
        assert torch.allclose(got[i, :n], want[i], atol=1e-4), (i, (got[i, :n] - want[i]).abs().max())
        assert (got[i, n:] == 0).all()
    # the head at chosen completion tokens only (sampled_head): those equal, the others 0
    lens = [len(r.completion_ids) for r in rows]
    keep = torch.zeros_like(got, dtype=torch.bool)
    keep[0, 1:4], keep[1, ::2], keep[3, -1] = True, True, True  # row 2 keeps nothing
    keep[1, lens[1]:] = False
    part = logps_on_prompt_kv(model, kept[0], sel, shared, tails, lens, keep=keep)
    assert torch.allclose(part[keep], got[keep], atol=1e-5) and (part[~keep] == 0).all()
    one = logps_on_prompt_kv(model, kept[0], [2], [shared[2]], [tails[2]], [len(rows[2].completion_ids)])
    assert torch.allclose(one[0, :1], want[2], atol=1e-4)  # a subset of the rows, in any order
    with pytest.raises(ValueError, match="keep one prompt token"):
        logps_on_prompt_kv(model, kept[0], [0], [shared[0]], [rows[0].completion_ids], [len(rows[0].completion_ids)])


def test_prefix_groups_pick_the_best_runs_by_worth_sharings_own_rule():
    """The DP reads a run's prefix from its neighbours' (computed once); it must choose exactly
    what scoring every run with ``worth_sharing`` would (random batches, brute force)."""
    import random

    rng = random.Random(0)
    for _ in range(200):
        n = rng.randint(0, 7)
        base = [rng.randint(0, 2) for _ in range(60)]
        seqs = [base[:rng.randint(20, 60)] + [rng.randint(0, 3) for _ in range(rng.randint(1, 20))] for _ in range(n)]
        order = sorted(range(n), key=lambda i: seqs[i])
        best: list = [(0, [])]
        for j in range(1, n + 1):
            choice = best[j - 1]
            for i in range(j - 2, -1, -1):
                shared = worth_sharing([seqs[k] for k in order[i:j]])
                if shared and best[i][0] + (j - i - 1) * shared > choice[0]:
                    choice = (best[i][0] + (j - i - 1) * shared, [*best[i][1], (sorted(order[i:j]), shared)])
            best.append(choice)
        assert prefix_groups(seqs) == best[n][1], seqs


def _saved_for_backward(fn):
    """(fn's result, the bytes and shapes of the tensors autograd keeps for backward while it runs)."""
    seen, shapes = {}, []

    def pack(t):
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        shapes.append(tuple(t.shape))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(seen.values()), shapes


def _shared_forward(model, shared, monkeypatch=None):
    rows = _rows(shared, [(6, 8), (3, 5), (9, 4)])
    t, ids, mask = row_inputs(rows)
    keep = t["loss_mask"].bool()
    return shared_prefix_logps(model, ids, mask, t["completion_ids"].size(1), shared, compute_entropy=True, keep=keep)


def test_under_checkpointing_the_prefix_and_head_keep_no_activations_for_backward(tiny_model_dir):
    """A loss chunk's prefix forward and its LM head run again in backward where the layers are
    checkpointed: what they keep does not grow with the prefix beyond its keys and values, and no
    (positions, vocab) tensor is kept. Kept, they held most of an update's memory."""
    model = train_mode_model(tiny_model_dir, checkpointing=True)
    cfg = model.config
    _, short, _ = _saved_for_backward(lambda: _shared_forward(model, 40))
    _, long, shapes = _saved_for_backward(lambda: _shared_forward(model, 240))
    kv_per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads) * 4
    assert (long - short) / 200 <= 2 * kv_per_token, ((long - short) / 200, kv_per_token)
    assert not any(s and s[-1] == cfg.vocab_size for s in shapes), "the head's logits are kept"


def test_recomputing_the_prefix_and_head_changes_no_bit(tiny_model_dir, monkeypatch):
    """The replay runs the same operations on the same inputs: log-probs, entropies and every
    gradient equal those of the forward that kept its activations, bit for bit."""
    from seed_agents.trainers import shared_prefix

    model = train_mode_model(tiny_model_dir, checkpointing=True)

    def run():
        model.zero_grad()
        logps, ents = _shared_forward(model, 60)
        (logps.sum() + 0.1 * ents.sum()).backward()
        return logps.detach(), ents.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    lp, ent, grads = run()
    monkeypatch.setattr(shared_prefix, "recomputes", lambda model: False)
    kept_lp, kept_ent, kept_grads = run()
    assert torch.equal(lp, kept_lp) and torch.equal(ent, kept_ent)
    assert grads.keys() == kept_grads.keys() and grads
    assert all(torch.equal(grads[n], kept_grads[n]) for n in grads)
