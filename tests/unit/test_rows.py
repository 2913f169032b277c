"""Trajectories -> rows: merged when token prefixes continue, step-level otherwise."""

from seed_agents.rows import trajectory_to_rows
from seed_agents.types import LLMCall, Trajectory


def call(prompt, completion, version=0, purpose="policy"):
    return LLMCall(messages=[], prompt_ids=prompt, completion_ids=completion,
                   logprobs=[-0.1 * (i + 1) for i in range(len(completion))], policy_version=version, purpose=purpose)


def traj(*calls):
    return Trajectory(task_id="t", group_id="g", calls=list(calls))


def test_calls_whose_prompts_extend_exactly_merge_with_masked_gaps():
    c1 = call([1, 2, 3], [10, 11])
    c2 = call([1, 2, 3, 10, 11, 50, 51], [12])  # 50, 51: observation tokens
    c3 = call([1, 2, 3, 10, 11, 50, 51, 12, 60], [13, 14])
    rows = trajectory_to_rows(traj(c1, c2, c3))
    assert len(rows) == 1
    r = rows[0]
    assert r.prompt_ids == [1, 2, 3]
    assert r.completion_ids == [10, 11, 50, 51, 12, 60, 13, 14]
    assert r.loss_mask == [1, 1, 0, 0, 1, 0, 1, 1]
    assert r.old_logprobs == [-0.1, -0.2, 0.0, 0.0, -0.1, 0.0, -0.1, -0.2]
    assert r.call_ids == [c1.call_id, c2.call_id, c3.call_id]
    # every sampled token appears exactly once, with its own logprob
    assert r.num_sampled_tokens == sum(len(c.completion_ids) for c in (c1, c2, c3))


def test_a_template_that_rewrites_history_breaks_the_prefix_into_step_rows():
    # e.g. a template that drops earlier reasoning: the second prompt does not contain
    # the first completion verbatim, so it must not be merged
    c1 = call([1, 2, 3], [10, 11, 99])
    c2 = call([1, 2, 3, 10, 11, 50], [12])
    rows = trajectory_to_rows(traj(c1, c2))
    assert [r.prompt_ids for r in rows] == [[1, 2, 3], [1, 2, 3, 10, 11, 50]]
    assert [r.loss_mask for r in rows] == [[1, 1, 1], [1]]


def test_identical_prompt_prefix_without_extension_is_not_merged():
    """A call that repeats the previous prompt (a retry) or shares only its prefix, without
    the previous completion, starts a row of its own: nothing is appended to the last row."""
    c1 = call([1, 2, 3], [9])
    c2 = call([1, 2, 3], [9])  # same prompt again (e.g. a retry)
    c3 = call([1, 2, 3, 8], [7, 6])  # shares [1, 2, 3] but not the sampled 9
    rows = trajectory_to_rows(traj(c1, c2, c3))
    assert [(r.prompt_ids, r.completion_ids, r.loss_mask, r.old_logprobs, r.call_ids) for r in rows] == [
        ([1, 2, 3], [9], [1], [-0.1], [c1.call_id]),
        ([1, 2, 3], [9], [1], [-0.1], [c2.call_id]),
        ([1, 2, 3, 8], [7, 6], [1, 1], [-0.1, -0.2], [c3.call_id]),
    ]


def test_step_level_layout_and_version_boundaries_and_analyzer_calls():
    c1 = call([1], [2])
    c2 = call([1, 2, 7], [3], version=1)  # sampled by new weights: never merged across
    a = call([9, 9], [8], purpose="analyzer")
    t = traj(c1, c2, a)
    assert len(trajectory_to_rows(t)) == 2
    assert [r.policy_version for r in trajectory_to_rows(t)] == [0, 1]
    same = traj(call([1], [2]), call([1, 2, 7], [3]))
    assert len(trajectory_to_rows(same, merge=False)) == 2
    assert len(trajectory_to_rows(same, merge=True)) == 1


def test_merged_and_step_rows_carry_the_same_sampled_tokens_and_logprobs():
    calls = [call([1, 2], [3, 4]), call([1, 2, 3, 4, 5], [6]), call([1, 2, 3, 4, 5, 6, 7, 8], [9, 10])]
    t = traj(*calls)
    merged = trajectory_to_rows(t)
    steps = trajectory_to_rows(t, merge=False)

    def sampled(rows):
        return [(tok, lp) for r in rows for tok, m, lp in zip(r.completion_ids, r.loss_mask, r.old_logprobs) if m]

    assert sampled(merged) == sampled(steps)
