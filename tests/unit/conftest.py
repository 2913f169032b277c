import pytest


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    """The SmolLM2 tokenizer and ChatML template (saved beside the tiny random model)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)
