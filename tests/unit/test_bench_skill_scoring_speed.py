"""bench/skill_scoring_speed.py's own parts: its baseline is the former scorer and agrees
with the new one; the Delta it compares is the eval's; bad flags are one clear line."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.skill_scoring_speed import deltas, distinct_tokens, main, scorer_sums, whole_sums


def test_the_baseline_and_both_new_arms_agree_on_the_numbers(tiny_model_dir):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(4)
    system = torch.randint(5, 1000, (48,), generator=g).tolist()
    pairs = [(system + torch.randint(5, 1000, (n,), generator=g).tolist(), torch.randint(5, 1000, (m,), generator=g).tolist())
             for n, m in [(4, 3), (20, 7), (9, 1), (2, 12), (33, 5)]]
    pairs.append(pairs[1])  # a repeated pair is scored once, by every arm
    base = whole_sums(model, pairs, pad_token_id=0)
    plain, plain_tokens = scorer_sums(model, pairs, pad_token_id=0, batch_size=8, share_prefix=False)
    shared, shared_tokens = scorer_sums(model, pairs, pad_token_id=0, batch_size=8, share_prefix=True)
    assert plain == pytest.approx(base, abs=1e-4) and shared == pytest.approx(base, abs=1e-4)
    assert plain_tokens == distinct_tokens(pairs) == sum(len(p) + len(c) for p, c in pairs[:-1]) == shared_tokens + 4 * 48


def test_deltas_are_per_token_with_minus_without():
    sums = [-1.0, -2.0, -0.5, -1.0]  # one episode: calls 0, 1 without the skill; 2, 3 with it
    assert deltas(sums, [([0, 1], [2, 3], 6)]) == [pytest.approx((-1.5 + 3.0) / 6)]


@pytest.mark.parametrize("argv, says", [(["--repeats", "0"], "--repeats"), (["--episodes", "nowhere.jsonl"], "no file")])
def test_bad_flags_are_one_clear_line(argv, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main([*argv, "--results-dir", str(tmp_path)])
    assert e.value.code == 2 and says in capsys.readouterr().err
