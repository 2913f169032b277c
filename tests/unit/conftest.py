import pytest


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    """The SmolLM2 tokenizer and ChatML template (saved beside the tiny random model)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


GATEWAY_MODEL = "tiny"
"""The served name the gateway tests' fake vLLM answers to."""


@pytest.fixture
def fake(tokenizer):
    """A fake vLLM ``/v1/completions`` upstream (streaming included) for the gateway tests."""
    from seed_agents.gateway.testing import FakeVLLM

    return FakeVLLM(tokenizer, model=GATEWAY_MODEL)


@pytest.fixture
def store(tmp_path):
    """A fresh SQLite trace store."""
    from seed_agents.store import TraceStore

    s = TraceStore.open(f"sqlite:///{tmp_path}/traces.db")
    yield s
    s.close()
