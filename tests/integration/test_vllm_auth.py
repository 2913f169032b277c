"""A real vLLM server started with an API key: every route but /health refuses a request
without it (the /v1 API and dev mode's admin routes alike), and every client of ours sends
it: the backend built from a config (`eval --backend vllm`), full-weight sync, and the
continual loop's serving (LoRA load/unload). One key-protected server for the module.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import httpx
import pytest
import torch

from seed_agents.backends import make_backend
from seed_agents.backends.base import BackendError
from seed_agents.backends.vllm import VLLMBackend
from seed_agents.config.core import BackendConfig
from seed_agents.types import SamplingParams
from tests.conftest import _serve

pytestmark = pytest.mark.integration

KEY = "sk-seed-test-2b7e41d09a5c"
KEY_VAR = "SEED_TEST_VLLM_KEY"  # a variable of the user's choosing (backend.api_key_env)
NAME = "tiny-llama-auth"
GREEDY = SamplingParams(max_tokens=4, temperature=0.0)

# Each route with a body good enough that, with the key, vLLM itself would act on it.
ROUTES = [
    ("POST", "/v1/completions", {"model": NAME, "prompt": [1, 2, 3], "max_tokens": 1}),
    ("GET", "/v1/models", None),
    ("POST", "/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": "/nonexistent"}}),
    ("POST", "/reset_prefix_cache", {}),
    ("POST", "/v1/load_lora_adapter", {"lora_name": "evil", "lora_path": "/nonexistent"}),
    ("POST", "/v1/unload_lora_adapter", {"lora_name": "evil"}),
]


@pytest.fixture(scope="module")
def keyed_server(tiny_model_dir, tmp_path_factory):
    yield from _serve(tiny_model_dir, NAME, tmp_path_factory.mktemp("vllm-auth"), api_key=KEY)


@pytest.fixture(scope="module")
def tiny_prompt_ids(tiny_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [{"role": "user", "content": "Go north, then take the key."}]
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def _group_cmdlines(pgid: int, *, live_only: bool = False) -> list[bytes]:
    """The command lines of the processes in group ``pgid`` (zombies: empty, unless left out)."""
    out = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{entry}/stat").read_bytes()
            fields = stat[stat.rindex(b")") + 2 :].split()
            if int(fields[2]) == pgid and not (live_only and fields[0] in (b"Z", b"X")):
                out.append(Path(f"/proc/{entry}/cmdline").read_bytes())
        except OSError:
            continue
    return out


@pytest.mark.parametrize(("method", "path", "body"), ROUTES, ids=[r[1] for r in ROUTES])
def test_every_route_refuses_a_request_without_the_key(keyed_server, method, path, body):
    for headers in ({}, {"Authorization": "Bearer not-the-key"}):
        r = httpx.request(method, keyed_server.url + path, json=body, headers=headers, timeout=30)
        assert r.status_code == 401, (path, r.status_code, r.text[:200])
        assert r.json()["error"]["code"] == "invalid_api_key" and KEY not in r.text


def test_health_stays_open_for_probes_and_the_key_opens_the_api(keyed_server):
    assert httpx.get(keyed_server.url + "/health", timeout=10).status_code == 200
    r = httpx.get(keyed_server.url + "/v1/models", headers=keyed_server.headers, timeout=10)
    assert r.status_code == 200 and r.json()["data"][0]["id"] == NAME


def test_the_key_is_in_no_argv_and_no_log(keyed_server):
    pgid = os.getpgid(keyed_server.process.pid)
    cmdlines = _group_cmdlines(pgid)
    assert len(cmdlines) >= 3  # watchdog, api_server, EngineCore (+ worker)
    assert not [c for c in cmdlines if KEY.encode() in c]
    assert KEY not in keyed_server.log_path.read_text(errors="replace")


def test_backend_from_config_sends_the_key(keyed_server, tiny_model_dir, tiny_prompt_ids, monkeypatch):
    cfg = BackendConfig(kind="vllm", base_url=keyed_server.url, model=NAME, tokenizer=tiny_model_dir,
                        max_retries=0, api_key_env=KEY_VAR)
    monkeypatch.delenv(KEY_VAR, raising=False)
    keyless, _ = make_backend(cfg)
    with pytest.raises(BackendError, match="401"):
        keyless.generate(tiny_prompt_ids, GREEDY)
    keyless.close()
    monkeypatch.setenv(KEY_VAR, KEY)
    backend, _ = make_backend(cfg)
    try:
        assert len(backend.generate(tiny_prompt_ids, GREEDY).token_ids) == 4
        assert KEY not in repr(backend) and KEY not in str(cfg.model_dump())
    finally:
        backend.close()


def test_full_weight_sync_reloads_through_the_key(keyed_server, tiny_model_dir, tiny_prompt_ids, tmp_path):
    from transformers import AutoModelForCausalLM

    from seed_agents.trainers.weight_sync import FullWeightSync, WeightSyncError

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    keyless = VLLMBackend(keyed_server.url, NAME, max_retries=0)
    with pytest.raises(WeightSyncError, match="401"):
        FullWeightSync(keyless, tmp_path / "nokey").sync(model)
    backend = VLLMBackend(keyed_server.url, NAME, max_retries=0, api_key=KEY)
    try:
        before = backend.generate(tiny_prompt_ids, GREEDY)
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.5)
        assert FullWeightSync(backend, tmp_path / "full", method="seed_reload_weights").sync(model) == 1
        after = backend.generate(tiny_prompt_ids, GREEDY)
        assert after.logprobs != before.logprobs  # the new weights serve
    finally:
        original = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
        FullWeightSync(backend, tmp_path / "restore", method="seed_reload_weights").sync(original)
        backend.close()


def test_continual_serving_loads_and_unloads_an_adapter_with_the_key(keyed_server, tiny_model_dir, tmp_path,
                                                                     monkeypatch):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from seed_agents.app.serving import VLLMServing
    from seed_agents.store import ModelVersionRecord

    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    get_peft_model(base, LoraConfig(r=8, target_modules="all-linear", task_type="CAUSAL_LM")).save_pretrained(
        tmp_path / "adapter")
    monkeypatch.setenv(KEY_VAR, KEY)
    cfg = BackendConfig(kind="vllm", base_url=keyed_server.url, model=NAME, tokenizer=tiny_model_dir,
                        api_key_env=KEY_VAR, max_retries=0)
    serving = VLLMServing(cfg, tokenizer=None)
    version = ModelVersionRecord(name="auth", version=1, path=str(tmp_path / "adapter"), status="candidate",
                                 created_at=0.0, updated_at=0.0, metadata={})
    name = serving.load(version)
    try:
        models = httpx.get(keyed_server.url + "/v1/models", headers=keyed_server.headers, timeout=10).json()
        assert name in {m["id"] for m in models["data"]}
        assert len(serving.backend(version).generate([1, 2, 3], GREEDY).token_ids) == 4
    finally:
        serving.unload(version)
        serving.close()
    models = httpx.get(keyed_server.url + "/v1/models", headers=keyed_server.headers, timeout=10).json()
    assert name not in {m["id"] for m in models["data"]}


def test_stop_reaps_the_whole_group_and_frees_the_port(keyed_server):
    """Last in the module: ``VLLMServer.stop`` (what every test fixture and bench uses)."""
    pgid, port = os.getpgid(keyed_server.process.pid), keyed_server.port
    keyed_server.stop()
    assert _group_cmdlines(pgid, live_only=True) == []  # stop() returns once none runs
    deadline = time.monotonic() + 30  # SIGKILLed orphans are init's to reap: soon, not at once
    while _group_cmdlines(pgid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _group_cmdlines(pgid) == []
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
