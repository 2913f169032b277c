"""CompletionOnlySFTTrainer: the same loss and gradients as TRL's SFTTrainer, with the LM
head applied to the completion rows only."""

import datasets
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

from seed_agents.stage1.completion_sft import CompletionOnlySFTTrainer, completion_nll


def rows(n=6):
    return [{"prompt": [{"role": "user", "content": f"Say which door leads out of room {i}. " + "words " * (3 * i)}],
             "completion": [{"role": "assistant", "content": f'{{"skill": "door {i} is the way"}}'}]} for i in range(n)]


def loss_and_grads(cls, model_dir, tmp_path, *, lora=False, num_items=None):
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(model_dir)
    peft_config = None
    if lora:
        from peft import LoraConfig

        peft_config = LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM")
    args = SFTConfig(output_dir=str(tmp_path / cls.__name__), per_device_train_batch_size=3, completion_only_loss=True,
                     report_to=[], use_cpu=True, bf16=False, activation_checkpointing=False, disable_tqdm=True, seed=0)
    trainer = cls(model=model, args=args, processing_class=tok, peft_config=peft_config,
                  train_dataset=datasets.Dataset.from_list(rows()))
    batch = next(iter(trainer.get_train_dataloader()))
    assert (batch["labels"] == -100).any() and (batch["labels"] != -100).any()  # prompt masked, completion scored
    trainer.model.train()
    loss = trainer.compute_loss(trainer.model, dict(batch), num_items_in_batch=num_items)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in trainer.model.named_parameters() if p.grad is not None}
    return loss.detach(), grads


@pytest.mark.parametrize("lora", [False, True], ids=["full", "lora"])
@pytest.mark.parametrize("num_items", [None, 37], ids=["batch-count", "accumulated-count"])
def test_loss_and_gradients_match_trls_sft_trainer(tiny_model_dir, tmp_path, lora, num_items):
    ref_loss, ref_grads = loss_and_grads(SFTTrainer, tiny_model_dir, tmp_path, lora=lora, num_items=num_items)
    loss, grads = loss_and_grads(CompletionOnlySFTTrainer, tiny_model_dir, tmp_path, lora=lora, num_items=num_items)
    assert torch.isfinite(loss) and loss > 0
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    assert grads.keys() == ref_grads.keys() and grads
    for k in grads:
        torch.testing.assert_close(grads[k], ref_grads[k], rtol=1e-4, atol=1e-6, msg=k)


def test_completion_nll_projects_only_the_scored_rows():
    head = torch.nn.Linear(4, 7, bias=False)
    seen = []
    head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape[0]))
    hidden = torch.randn(2, 5, 4)
    labels = torch.full((2, 5), -100)
    labels[0, 3:] = torch.tensor([1, 2])
    labels[1, 4] = 6
    nll, n = completion_nll(hidden, labels, head)
    assert n == 3 and seen == [3]  # three rows met the head, not ten
    logp = torch.log_softmax(head(hidden), -1)
    expect = -(logp[0, 2, 1] + logp[0, 3, 2] + logp[1, 3, 6])
    torch.testing.assert_close(nll, expect)


def test_soft_capped_logits_take_trls_own_path(tiny_model_dir, tmp_path, monkeypatch):
    """A model whose logits are soft-capped (Gemma 2) is scored by TRL's path: the plain head
    reproduced here would drop the cap and train on another loss."""
    import seed_agents.stage1.completion_sft as sft
    from transformers import Gemma2Config, Gemma2ForCausalLM

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    torch.manual_seed(0)
    config = Gemma2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                          num_attention_heads=2, num_key_value_heads=1, head_dim=32, final_logit_softcapping=0.5,
                          pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    capped = tmp_path / "capped"
    model = Gemma2ForCausalLM(config)
    with torch.no_grad():  # logits of a random init are ~0, where the cap changes nothing: make them large
        model.get_output_embeddings().weight.mul_(50)
    model.save_pretrained(capped)
    tok.save_pretrained(capped)
    ref_loss, ref_grads = loss_and_grads(SFTTrainer, capped, tmp_path)
    loss, grads = loss_and_grads(CompletionOnlySFTTrainer, capped, tmp_path)
    torch.testing.assert_close(loss, ref_loss)
    assert grads.keys() == ref_grads.keys() and all(torch.equal(grads[k], ref_grads[k]) for k in grads)
    monkeypatch.setattr(sft, "SCALED", ())  # without the fallback the cap is lost: another loss
    uncapped, _ = loss_and_grads(CompletionOnlySFTTrainer, capped, tmp_path)
    assert not torch.allclose(uncapped, ref_loss, rtol=1e-3)
