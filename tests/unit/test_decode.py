"""A finished row leaves the forward (``drop_finished``, an engine option) and nothing a row samples
changes: the decode loop against transformers' ``generate`` on the same batches."""

import pytest
import torch

from seed_agents.backends.decode import fewest_moves
from seed_agents.backends.local import LocalBackend
from seed_agents.types import SamplingParams


class _Episode:
    """Stands in for a capture scope: the turn cache's owner key."""


def _prompts(tok):
    system = "You walk through rooms and answer with one short action. " * 2
    return [tok(f"<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{q}<|im_end|>\n<|im_start|>assistant\n",
                add_special_tokens=False)["input_ids"] for q in ("a", "you see a door", "x y z", "north or south?", "go")]


def _stops_that_end_rows_early(backend, prompts, params, seeds):
    """Stop ids chosen from what the rows sample unstopped, so that rows end at different steps."""
    free = backend._generate_batch(prompts, params, seeds=seeds)
    stops = sorted({c.token_ids[k] for k, c in zip((1, 3, 5, 8, 10), free)})
    return stops


@pytest.mark.parametrize("kv_cache,compute", [("dynamic", None), ("concat", None), ("static", None),
                                              ("dynamic", torch.bfloat16)])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_rows_that_finish_early_leave_and_every_row_samples_what_generate_samples(tiny_model_dir, kv_cache,
                                                                                     compute, temperature):
    """Seeded rows (per-row generators), a shared prefix, then a second turn from the turn cache:
    the same ids, finish reasons and log-probs as ``generate``; the forward shrank as rows ended
    (not with a static cache, whose batch is fixed); every row's prompt reached the turn cache."""
    runs, widths = [], []
    for drop in (False, True):
        backend = LocalBackend(tiny_model_dir, max_batch_size=8, kv_cache=kv_cache, compute_dtype=compute,
                               fp32_attention=compute is not None, drop_finished=drop)
        prompts = _prompts(backend.tokenizer)
        seeds = list(range(1, len(prompts) + 1))
        probe = SamplingParams(max_tokens=12, temperature=temperature)
        params = probe.model_copy(update={"stop_token_ids": _stops_that_end_rows_early(backend, prompts, probe, seeds)})
        rows: list[int] = []
        hook = backend.model.register_forward_pre_hook(lambda m, a, kw, rows=rows: rows.append(kw["input_ids"].shape[0]),
                                                       with_kwargs=True)
        owners = [_Episode() for _ in prompts]
        try:
            first = backend._generate_batch(prompts, params, seeds=seeds, owners=owners)
            assert len(backend.turn_cache) == len(prompts), "every row's prompt reached the turn cache"
            follow = [p + c.token_ids + backend.tokenizer("\nnext", add_special_tokens=False)["input_ids"]
                      for p, c in zip(prompts, first)]
            second = backend._generate_batch(follow, params, seeds=[s + 10 for s in seeds], owners=owners)
        finally:
            hook.remove()
            backend.close()
        assert backend.turn_cache.hits == len(prompts)
        lengths = {len(c.token_ids) for c in first}
        assert len(lengths) > 1 and any(c.finish_reason == "stop" for c in first), "rows must end at different steps"
        runs.append(first + second)
        widths.append(rows)
    before, after = runs
    for b, a in zip(before, after):
        assert a.token_ids == b.token_ids and a.finish_reason == b.finish_reason
        assert max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs)), default=0.0) < 1e-4
    if kv_cache == "static":
        assert set(widths[1]) <= {len(_prompts(backend.tokenizer))}, "a static cache's batch stays whole"
    else:
        assert min(widths[1]) < max(widths[1]), f"no row left the forward: {widths[1]}"
    assert max(widths[0]) == min(widths[0])  # generate ran every row to the end


def test_should_stop_ends_the_batch_and_a_grammar_still_holds(tiny_model_dir):
    """The loop's stop check (a client gone, the process exiting) ends every row at once, and a
    constrained batch whose rows finish apart parses as generate's does."""
    from seed_agents.backends.grammar import skill_tag

    backend = LocalBackend(tiny_model_dir, max_batch_size=8)
    prompts = _prompts(backend.tokenizer)[:3]
    calls = iter(range(100))
    cut = backend._generate_batch(prompts, SamplingParams(max_tokens=12, temperature=0.9), seeds=[1, 2, 3],
                                  should_stop=lambda: next(calls) >= 3)
    assert all(len(c.token_ids) == 4 for c in cut), [len(c.token_ids) for c in cut]
    tag = skill_tag(min_words=2, max_tokens=96, summary_max_chars=40, skill_max_chars=40)
    params = SamplingParams(max_tokens=96, temperature=0.9, structural_tag=tag)
    got = []
    for drop in (True, False):
        backend.drop_finished = drop
        got.append(backend._generate_batch(prompts, params, seeds=[4, 5, 6]))
    backend.close()
    assert [c.token_ids for c in got[0]] == [c.token_ids for c in got[1]]
    for a, b in zip(*got):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_a_shrinking_batch_keeps_rows_in_their_slots_and_fills_the_gaps_from_the_end():
    for keep in ([1, 0, 1, 1, 0, 1, 1, 0], [0, 0, 0, 1], [1, 1, 1, 0], [1, 1], [0, 1, 0, 1, 1, 0, 0, 1]):
        mask = torch.tensor(keep, dtype=torch.bool)
        order = fewest_moves(mask).tolist()
        assert sorted(order) == mask.nonzero().squeeze(-1).tolist()
        n = len(order)
        assert all(src == j or src >= n for j, src in enumerate(order)), (keep, order)
    assert fewest_moves(torch.tensor([1, 0, 1, 1, 0, 1, 1, 0], dtype=torch.bool)).tolist() == [0, 5, 2, 3, 6]
