"""SEEDTrainer on a tiny random model: a real TRL training step, in-process rollouts."""

import warnings

import pytest
import torch

datasets = pytest.importorskip("datasets")
from transformers import AutoModelForCausalLM  # noqa: E402
from trl import GRPOTrainer  # noqa: E402

from seed_agents.backends.local import LocalBackend  # noqa: E402
from seed_agents.chat_model import SeedChatModel  # noqa: E402
from seed_agents.graphs.env_agent import build_env_agent  # noqa: E402
from seed_agents.graphs.hindsight import with_hindsight  # noqa: E402
from seed_agents.runner import EpisodeRunner, RunnerConfig  # noqa: E402
from seed_agents.testing import SKILL_JSON, FakeBackend, ParityEnv  # noqa: E402
from seed_agents.trainers.rollout import GraphRollout  # noqa: E402
from seed_agents.trainers.seed_trainer import (  # noqa: E402
    SEEDConfig,
    SEEDTrainer,
    _chunk_cost,
    length_chunks,
    prefix_chunks,
    rows_to_tensors,
)
from seed_agents.types import Row  # noqa: E402
from seed_agents.trainers.weight_sync import InProcessSync  # noqa: E402
from seed_agents.types import SamplingParams, Task  # noqa: E402


def make_trainer(tiny_model_dir, tokenizer, tmp_path, *, opd_coef=0.01, skills="external", injector=None, **cfg):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    backend = LocalBackend(model, tokenizer=tokenizer, max_batch_size=8)
    llm = SeedChatModel(backend=backend, tokenizer=tokenizer, sampling=SamplingParams(max_tokens=6, temperature=1.0))
    graph = build_env_agent(llm, max_turns=1)
    if skills != "none":
        analyzer = SeedChatModel(backend=FakeBackend(tokenizer, SKILL_JSON), tokenizer=tokenizer)
        graph = with_hindsight(graph, analyzer)
    runner = EpisodeRunner(graph, RunnerConfig(progress=False, concurrency=8), make_env=lambda t: ParityEnv())
    rollout = GraphRollout(runner, llm, skills=skills, merge_rows=False, out_dir=tmp_path / "run", injector=injector)
    ds = datasets.Dataset.from_list([{"prompt": Task(task_id=f"t{i}").model_dump_json()} for i in range(2)])
    args = SEEDConfig(output_dir=str(tmp_path / "out"), per_device_train_batch_size=8, num_generations=4,
                      use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="no",
                      opd_coef=opd_coef, seed=0, **{"max_steps": 1, **cfg})
    trainer = SEEDTrainer(model=model, args=args, train_dataset=ds, rollout=rollout, processing_class=tokenizer)
    return trainer, backend


def test_one_seed_step_updates_the_policy_and_logs_the_method(tiny_model_dir, tokenizer, tmp_path):
    trainer, backend = make_trainer(tiny_model_dir, tokenizer, tmp_path, learning_rate=1e-2)
    before = {n: p.detach().clone() for n, p in trainer.model.named_parameters()}
    trainer.train()
    changed = [n for n, p in trainer.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed, "no parameter changed after a SEED step"
    logs = {k: v for entry in trainer.state.log_history for k, v in entry.items()}
    assert logs["skill_parse_rate"] == 1.0 and "loss/opd" in logs and 0.0 < logs["opd/gate"] < 1.0
    batch = trainer.last_batch
    assert len(batch.trajectories) == 8 and all(p is not None for p in batch.teacher_prompt_ids)
    assert all(len(t.calls) == 2 and t.calls[1].purpose == "analyzer" for t in batch.trajectories)
    assert (tmp_path / "run" / "skills.jsonl").read_text().count("\n") == 8


def test_seed_step_with_lambda_zero_equals_trl_grpo_loss(tiny_model_dir, tokenizer, tmp_path):
    """Our loss with lambda=0 is TRL's own GRPO (bnpo) loss on the identical batch."""
    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, opd_coef=0.0)
    rows = [trainer.train_dataset[i % 2] for i in range(8)]
    inputs = trainer._generate_and_score_completions(rows)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.train(); we call the loss directly
    ours = trainer._compute_loss(trainer.model, inputs)
    theirs = GRPOTrainer._compute_loss(trainer, trainer.model, {**inputs, "tool_mask": inputs["loss_mask"]})
    assert torch.allclose(ours, theirs, atol=1e-6), (ours.item(), theirs.item())
    # and the OPD term does change it when skills and lambda are on
    trainer.coef = trainer.coef.__class__(lam=1.0, entropy=trainer.coef.entropy, kl=trainer.coef.kl)
    inputs["teacher_per_token_logps"] = inputs["old_per_token_logps"] + 1.0
    inputs["opd_mask"] = inputs["loss_mask"]
    assert not torch.allclose(trainer._compute_loss(trainer.model, inputs), theirs)


def _record_teachers(monkeypatch):
    """The teacher log-probs each SEED loss is handed, in call order (seed_objective wrapped)."""
    import seed_agents.trainers.seed_trainer as seed_module

    seen = []
    objective = seed_module.seed_objective
    monkeypatch.setattr(seed_module, "seed_objective",
                        lambda *a, **kw: seen.append(kw["teacher_logp_B_T"].detach().clone()) or objective(*a, **kw))
    return seen


def _loss_and_grads(trainer, inputs):
    """One loss and its gradients on ``inputs``, from zeroed gradients."""
    trainer.model.zero_grad()
    loss = trainer._compute_loss(trainer.model, inputs)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("injector", ["system", "last_turn"])
def test_a_fused_teacher_gives_the_loss_what_a_teacher_pass_of_its_own_does(tiny_model_dir, tokenizer, tmp_path,
                                                                            monkeypatch, injector):
    """fuse_teacher scores the teacher on the prompt keys and values of the loss forward
    (gradient checkpointing on, TRL's default here): the teacher log-probs, the loss and its
    gradients are those of the teacher's own pass, whether the skill sits in the system block
    (inside the prefix the rows share) or after the prompt; every skill row was fused."""
    import seed_agents.trainers.seed_trainer as seed_module
    from seed_agents.skills import make_injector

    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, opd_coef=1.0, injector=make_injector(injector),
                              gradient_checkpointing=True)
    rows = [trainer.train_dataset[i % 2] for i in range(8)]
    trainer._generate_and_score_completions(rows)
    batch = trainer.last_batch
    assert all(p is not None for p in batch.teacher_prompt_ids)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    seen = _record_teachers(monkeypatch)

    def loss_and_grads(fuse):
        trainer.args.fuse_teacher = fuse
        inputs = trainer.score_batch(batch)
        assert ("teacher_prompt_ids" in inputs) == fuse
        return _loss_and_grads(trainer, inputs)

    (alone, grads_alone), (fused, grads_fused) = loss_and_grads(False), loss_and_grads(True)
    assert trainer._metrics["train"]["teacher/fused_rows"] == [1.0]
    mask = trainer.score_batch(batch)["opd_mask"].bool()
    assert mask.any() and torch.allclose(seen[0][mask], seen[1][mask], atol=1e-4), (seen[0] - seen[1]).abs().max()
    assert torch.allclose(alone, fused, atol=1e-5) and grads_alone.keys() == grads_fused.keys()
    for name, g in grads_alone.items():
        assert torch.allclose(g, grads_fused[name], atol=1e-5, rtol=1e-3), name
    # the fused rows scored in several forwards (one per row, in reverse): the same log-probs, each in its place
    monkeypatch.setattr(seed_module, "tail_groups", lambda lengths, fixed_cost=128: [[i] for i in range(len(lengths))][::-1])
    loss_and_grads(True)
    assert torch.allclose(seen[0][mask], seen[2][mask], atol=1e-4), (seen[0] - seen[2]).abs().max()


def test_fuse_teacher_refuses_a_batch_that_more_than_one_step_uses(tmp_path):
    with pytest.raises(ValueError, match="fuse_teacher"):
        SEEDConfig(output_dir=str(tmp_path), fuse_teacher=True, num_iterations=2, use_cpu=True, report_to=[])


def _score_rows(model, prompts, completions):
    """Per-row log-probs of each completion after its prompt: one unpadded forward each,
    independent of the trainer's batched scoring."""
    out = []
    with torch.no_grad():
        for p, c in zip(prompts, completions, strict=True):
            logits_T_V = model(torch.tensor([p + c])).logits[0, len(p) - 1:-1].float()
            out.append(torch.log_softmax(logits_T_V, -1).gather(-1, torch.tensor(c)[:, None]).squeeze(-1))
    return out


def test_teacher_logprobs_use_the_skill_prompt_and_pre_update_weights(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    """The OPD teacher is the policy as it was when the batch was sampled, with the skill in
    the prompt: its log-probs are scored once and stay frozen while the batch is reused
    after an optimizer update (num_iterations=2), like the old log-probs."""
    import trl.trainer.grpo_trainer as grpo_module

    import seed_agents.trainers.seed_trainer as seed_module

    monkeypatch.setattr(grpo_module, "shuffle_sequence_dict", lambda d: d)  # rows keep the batch's order
    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, learning_rate=1e-2, num_iterations=2, max_steps=2)
    snapshots, seen = [], []
    generate = trainer._generate_and_score_completions

    def spy_generate(rows):
        # the weights that sampled this batch, in a fresh model: a deepcopy would keep the
        # forward that accelerate binds to the live model, and score with the updated weights
        snapshot = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
        snapshot.load_state_dict(trainer.model.state_dict())
        snapshots.append(snapshot)
        return generate(rows)

    def spy_objective(*args, **kw):
        seen.append((kw["teacher_logp_B_T"].detach().clone(), kw["opd_mask_B_T"].detach().clone()))
        return objective(*args, **kw)

    objective = seed_module.seed_objective
    monkeypatch.setattr(trainer, "_generate_and_score_completions", spy_generate)
    monkeypatch.setattr(seed_module, "seed_objective", spy_objective)
    trainer.train()
    assert len(snapshots) == 1 and len(seen) == 2, "one batch, used by two optimizer steps"

    batch = trainer.last_batch
    assert "Answer with a short word of even length." in tokenizer.decode(batch.teacher_prompt_ids[0])
    assert "Answer with a short word" not in tokenizer.decode(batch.rows[0].prompt_ids)
    completions = [r.completion_ids for r in batch.rows]
    pre = _score_rows(snapshots[0], batch.teacher_prompt_ids, completions)
    post = _score_rows(trainer.model.eval(), batch.teacher_prompt_ids, completions)
    student = _score_rows(snapshots[0], [r.prompt_ids for r in batch.rows], completions)
    for step, (teacher_B_T, mask_B_T) in enumerate(seen):
        assert mask_B_T.sum() > 0
        for i, c in enumerate(completions):
            m = mask_B_T[i, :len(c)].bool()
            got = teacher_B_T[i, :len(c)][m]
            # pre-update weights, skill prompt: equal (batched vs one-row scoring, float tolerance)
            assert torch.allclose(got, pre[i][m], atol=1e-4), (step, i, got, pre[i][m])
            if m.any():
                # not the weights after the update, not the prompt without the skill
                assert (got - post[i][m]).abs().max() > 1e-3, (step, i)
                assert (got - student[i][m]).abs().max() > 1e-3, (step, i)


def test_an_ungated_step_runs_no_teacher_and_imitates_at_a_flat_half(tiny_model_dir, tokenizer, tmp_path, monkeypatch):
    """gate_sharpness 0 (the imitation control): the teacher cannot move the gradient, so no
    teacher pass runs; the OPD term still covers the skill-bearing rows, its gate 0.5."""
    import seed_agents.trainers.seed_trainer as seed_module

    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, gate_sharpness=0.0, opd_coef=0.1)

    def no_teacher(*args, **kw):
        raise AssertionError("an ungated step scored a teacher")

    seen = []

    def spy_objective(*args, **kw):
        seen.append((kw["teacher_logp_B_T"].detach().clone(), kw["opd_mask_B_T"].detach().clone(), args[1].detach()))
        return objective(*args, **kw)

    objective = seed_module.seed_objective
    monkeypatch.setattr(trainer, "_teacher_pass", no_teacher)
    monkeypatch.setattr(seed_module, "seed_objective", spy_objective)
    trainer.train()
    teacher, mask, old = seen[0]
    assert mask.sum() > 0
    assert torch.equal(teacher, old)  # the recorded log-probs stand in
    gates = [h["opd/gate"] for h in trainer.state.log_history if "opd/gate" in h]
    assert gates and all(g == pytest.approx(0.5) for g in gates)
    with pytest.raises(ValueError, match="gate_sharpness"):
        SEEDConfig(output_dir=str(tmp_path), gate_sharpness=-1.0, use_cpu=True, bf16=False, report_to=[])


def test_in_process_sync_bumps_the_version_stamped_on_new_calls(tiny_model_dir, tokenizer, tmp_path):
    trainer, backend = make_trainer(tiny_model_dir, tokenizer, tmp_path)
    sync = InProcessSync(backend)
    assert sync.sync(trainer.model) == 1
    rows = [trainer.train_dataset[i % 2] for i in range(8)]
    trainer._generate_and_score_completions(rows)
    assert {c.policy_version for t in trainer.last_batch.trajectories for c in t.policy_calls} == {1}


def test_config_rejects_a_scoring_temperature(tmp_path):
    with pytest.raises(ValueError, match="temperature"):
        SEEDConfig(output_dir=str(tmp_path), temperature=0.7, use_cpu=True, bf16=False, report_to=[])


def test_resumed_run_equals_an_uninterrupted_one(tiny_model_dir, tokenizer, tmp_path):
    """Optimizer, scheduler, RNG and data order come back from the checkpoint: 1 + 1
    resumed steps give the same weights as 2 straight (deterministic scripted rollouts)."""

    def build(out, max_steps):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        replies = lambda ids: "ab" if sum(ids) % 3 else "abc"  # noqa: E731 - reward depends on the prompt
        llm = SeedChatModel(backend=FakeBackend(tokenizer, replies), tokenizer=tokenizer,
                            sampling=SamplingParams(max_tokens=6))
        analyzer = SeedChatModel(backend=FakeBackend(tokenizer, SKILL_JSON), tokenizer=tokenizer)
        graph = with_hindsight(build_env_agent(llm, max_turns=1), analyzer)
        runner = EpisodeRunner(graph, RunnerConfig(progress=False), make_env=lambda t: ParityEnv())
        rollout = GraphRollout(runner, llm, skills="self", merge_rows=False)
        ds = datasets.Dataset.from_list([{"prompt": Task(task_id=f"t{i}").model_dump_json()} for i in range(4)])
        args = SEEDConfig(output_dir=str(out), per_device_train_batch_size=4, num_generations=2, max_steps=max_steps,
                          use_cpu=True, bf16=False, report_to=[], logging_steps=1, save_strategy="steps", save_steps=1,
                          learning_rate=1e-2, seed=0, opd_coef=0.5)
        return SEEDTrainer(model=model, args=args, train_dataset=ds, rollout=rollout, processing_class=tokenizer)

    from transformers import TrainerCallback

    class Crash(TrainerCallback):  # the interrupted run: same config, stops after step 1
        def on_step_end(self, args, state, control, **kw):
            control.should_training_stop = True

    straight = build(tmp_path / "a", 2)
    straight.train()
    first = build(tmp_path / "b", 2)
    first.add_callback(Crash())
    first.train()
    assert first.state.global_step == 1
    resumed = build(tmp_path / "b", 2)
    resumed.train(resume_from_checkpoint=str(tmp_path / "b" / "checkpoint-1"))
    for (n, p), (_, q) in zip(straight.model.named_parameters(), resumed.model.named_parameters()):
        assert torch.allclose(p, q, atol=1e-6), n
    assert resumed.state.global_step == 2


@pytest.mark.parametrize("kwargs", [{}, {"gradient_checkpointing": False}, {"gradient_checkpointing": True}])
def test_seed_config_sets_checkpointing_without_transformers_deprecation_warning(tmp_path, kwargs):
    """TRL's default sets the old ``gradient_checkpointing`` name, which transformers 5 warns
    about on every run; SEEDConfig carries it over under the new name."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        args = SEEDConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to=[], **kwargs)
    assert args.gradient_checkpointing is kwargs.get("gradient_checkpointing", True)  # what TRL reads


def test_length_chunks_cover_every_row_once_within_the_budget():
    prompts, completions = [300, 10, 290, 12, 305, 11, 50], [5, 60, 4, 64, 6, 2, 30]
    chunks = length_chunks(prompts, completions, budget=700)
    assert sorted(i for c in chunks for i in c) == list(range(7))
    for c in chunks:
        width = max(prompts[i] for i in c) + max(completions[i] for i in c)
        assert len(c) == 1 or len(c) * width <= 700, (c, width)
    assert {0, 2, 4} & set(chunks[-1]) and not {1, 3, 5} & set(chunks[-1]), "long rows are grouped apart from short ones"
    assert all(len(c) <= 2 for c in length_chunks(prompts, completions, budget=10**6, max_rows=2))
    assert length_chunks([900], [100], budget=10) == [[0]], "a row over the budget still gets its own forward"


def episode_rows(seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """Prompts as SEED's teacher rows look: one system prompt, then per episode its own
    skill and question, then per turn the turns before it; completions of mixed length."""
    g = torch.Generator().manual_seed(seed)
    system = torch.randint(5, 1000, (40,), generator=g).tolist()
    prompts, completions = [], []
    for _ in range(4):  # episodes
        prompt = system + torch.randint(5, 1000, (50,), generator=g).tolist()
        for _ in range(3):  # turns
            prompt = prompt + torch.randint(5, 1000, (int(torch.randint(10, 40, (1,), generator=g)),), generator=g).tolist()
            prompts.append(prompt)
            completions.append(int(torch.randint(2, 30, (1,), generator=g)))
    return prompts, completions


def test_prefix_chunks_keep_an_episodes_rows_together_and_cost_less():
    prompts, completions = episode_rows()
    chunks = prefix_chunks(prompts, completions, budget=10**6)
    assert sorted(i for c in chunks for i in c) == list(range(len(prompts)))
    assert sorted(sorted(c) for c in chunks) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    by_length = length_chunks([len(p) for p in prompts], completions, budget=10**6)
    cost = sum(_chunk_cost(prompts, completions, c) for c in chunks)
    assert cost < 0.8 * sum(_chunk_cost(prompts, completions, c) for c in by_length)
    # the same bound as length_chunks: rows x (widest prompt + widest completion), max_rows
    for budget, max_rows in ((400, None), (10**6, 2)):
        for c in prefix_chunks(prompts, completions, budget=budget, max_rows=max_rows):
            width = max(len(prompts[i]) for i in c) + max(completions[i] for i in c)
            assert len(c) == 1 or len(c) * width <= budget
            assert max_rows is None or len(c) <= max_rows
    # rows that share nothing: each alone costs no more than together, so they may group
    # only where that is free; every row is still scored once
    flat = prefix_chunks([[i] * 10 for i in range(5)], [3] * 5, budget=10**6)
    assert sorted(i for c in flat for i in c) == list(range(5))


def test_prefix_chunked_scoring_of_teacher_like_rows_equals_trls_layout(tiny_model_dir, tokenizer, tmp_path):
    """Rows that share long prefixes (an episode's turns under one skill), scored without
    gradients as the teacher pass is: the token-ordered, prefix-sharing forwards give TRL's
    padded layout's log-probs and entropies, one prefix forward per episode."""
    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, opd_coef=0.0)
    prompts, completions = episode_rows(seed=3)
    g = torch.Generator().manual_seed(4)
    rows = [Row(trajectory_id=f"t{i}", task_id="t", group_id="g", call_ids=[f"c{i}"], prompt_ids=p,
                completion_ids=torch.randint(5, 1000, (c,), generator=g).tolist(), old_logprobs=[0.0] * c,
                loss_mask=[1] * c) for i, (p, c) in enumerate(zip(prompts, completions, strict=True))]
    t = rows_to_tensors(rows, torch.zeros(len(rows)), pad_id=0)
    ids = torch.cat([t["prompt_ids"], t["completion_ids"]], 1)
    mask = torch.cat([t["prompt_mask"], t["completion_mask"]], 1)
    keep = t["completion_ids"].size(1)
    widths: list[int] = []
    hook = trainer.model.register_forward_pre_hook(lambda _m, args, kw: widths.append(
        (kw.get("input_ids") if kw.get("input_ids") is not None else args[0]).shape[-1]), with_kwargs=True)
    results = {}
    try:
        for budget in (0, 4000):  # 0: TRL's own layout
            trainer.args.chunk_tokens = budget
            widths.clear()
            with torch.no_grad():
                logps, ent, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep,
                                                                          compute_entropy=True)
            results[budget] = (logps * t["loss_mask"], ent * t["loss_mask"], list(widths))
    finally:
        hook.remove()
    for a, b in zip(results[0][:2], results[4000][:2]):
        assert a.shape == b.shape and torch.allclose(a, b, atol=2e-4, rtol=1e-4), (a - b).abs().max()
    # the prefix ran once per episode: 4 prefix forwards, 4 forwards of the rows' own tokens
    assert len(results[4000][2]) == 8, results[4000][2]


def test_length_chunked_scoring_equals_trls_padded_layout(tiny_model_dir, tokenizer, tmp_path):
    """Rows of very different lengths: log-probs, entropies and the gradient of a masked loss
    agree between the trimmed, length-grouped forwards and TRL's one padded batch."""
    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, opd_coef=0.0)
    g = torch.Generator().manual_seed(1)
    shapes = [(120, 3), (8, 40), (100, 2), (6, 35), (60, 20), (9, 1)]
    rows = [Row(trajectory_id=f"t{i}", task_id="t", group_id="g", call_ids=[f"c{i}"],
                prompt_ids=torch.randint(5, 1000, (p,), generator=g).tolist(),
                completion_ids=torch.randint(5, 1000, (c,), generator=g).tolist(),
                old_logprobs=[0.0] * c, loss_mask=[1] * c) for i, (p, c) in enumerate(shapes)]
    t = rows_to_tensors(rows, torch.zeros(len(rows)), pad_id=0)
    ids = torch.cat([t["prompt_ids"], t["completion_ids"]], 1)
    mask = torch.cat([t["prompt_mask"], t["completion_mask"]], 1)
    keep = t["completion_ids"].size(1)
    results = {}
    for budget in (0, 600):  # 0: TRL's own layout
        trainer.args.chunk_tokens = budget
        trainer.model.zero_grad()
        logps, ent, _ = trainer._get_per_token_logps_and_entropies(trainer.model, ids, mask, keep, compute_entropy=True)
        (logps * t["loss_mask"]).sum().backward()
        grads = torch.cat([p.grad.flatten() for p in trainer.model.parameters() if p.grad is not None])
        results[budget] = (logps * t["loss_mask"], ent * t["loss_mask"], grads)
    for a, b in zip(results[0], results[600]):
        assert a.shape == b.shape and torch.allclose(a, b, atol=2e-4, rtol=1e-4), (a - b).abs().max()


def test_tail_groups_split_where_padding_costs_more_than_a_forward():
    from seed_agents.trainers.seed_trainer import tail_groups

    assert tail_groups([]) == []
    assert tail_groups([60, 68, 58, 66]) == [[2, 0, 3, 1]]  # alike: one forward
    # short tails beside long ones: padding the four short to 160 would compute 4 x ~95 extra tokens
    groups = tail_groups([68, 58, 66, 62, 144, 169, 156, 141])
    assert groups == [[1, 3, 2, 0], [7, 4, 6, 5]]
    assert sorted(i for g in groups for i in g) == list(range(8))
    assert tail_groups([10, 500], fixed_cost=10_000) == [[0, 1]]


@pytest.mark.parametrize("fuse", [False, True])
def test_the_head_at_the_trained_positions_leaves_the_update_as_it_was(tiny_model_dir, tokenizer, tmp_path, fuse,
                                                                        monkeypatch):
    """sampled_head: a SEED update (teacher and reference passes, KL and entropy terms on) on rows
    with untrained completion positions, as merged rows have between calls: the same loss and
    gradients as the head over every position. Fails if any pass reads a position the head skipped,
    the teacher fused into the loss forward (``fuse_teacher``, skill after the prompt) included."""
    from seed_agents.skills import make_injector

    trainer, _ = make_trainer(tiny_model_dir, tokenizer, tmp_path, opd_coef=1.0, beta=0.1, entropy_coef=0.1,
                              gradient_checkpointing=True, injector=make_injector("last_turn" if fuse else "system"))
    trainer.args.fuse_teacher = fuse
    trainer._generate_and_score_completions([trainer.train_dataset[i % 2] for i in range(8)])
    batch = trainer.last_batch
    for row in batch.rows:  # the first half of each completion stands in for an environment's answer
        row.loss_mask = [0] * (len(row.loss_mask) // 2) + row.loss_mask[len(row.loss_mask) // 2:]
    assert any(0 in row.loss_mask for row in batch.rows) and all(1 in row.loss_mask for row in batch.rows)
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    teachers = _record_teachers(monkeypatch)

    def loss_and_grads(sampled_head):
        trainer.args.sampled_head = sampled_head
        return _loss_and_grads(trainer, trainer.score_batch(batch))

    (full, grads_full), (sampled, grads_sampled) = loss_and_grads(False), loss_and_grads(True)
    assert trainer._metrics["train"]["teacher/fused_rows"] == ([1.0, 1.0] if fuse else [])
    # the head skipped the untrained positions in the teacher's pass too: they read 0 there only
    untrained = ~trainer.score_batch(batch)["loss_mask"].bool() & (teachers[0] != 0)
    assert untrained.any() and (teachers[1][untrained] == 0).all()
    assert torch.allclose(full, sampled, atol=1e-5), (full, sampled)
    assert grads_full.keys() == grads_sampled.keys() and grads_full
    for name, g in grads_full.items():
        assert torch.allclose(g, grads_sampled[name], atol=1e-5, rtol=1e-3), name
