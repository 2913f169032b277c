"""The continual loop's vLLM serving with replicas: every version loaded into every server.

The servers are ``FakeVLLM`` apps behind an ``httpx`` mock (``VLLMAdmin`` posts with
``httpx.post``): a version reaches every replica before its canary, a replica that fails to
load it is reported and the canary samples elsewhere, and only when none loads it does the
load fail (the cycle then stays ``trained``, to be retried).
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from seed_agents.app.serving import VLLMServing, serving_for
from seed_agents.config import BackendConfig
from seed_agents.errors import ConfigError, WeightSyncError
from seed_agents.gateway.testing import FakeVLLM
from seed_agents.store import ModelVersionRecord

URLS = ("http://replica-a:8000", "http://replica-b:8000")


@pytest.fixture
def servers(tokenizer: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, FakeVLLM]:
    fakes = {url: FakeVLLM(tokenizer, model="tiny") for url in URLS}
    clients = {url: TestClient(f.app, base_url=url) for url, f in fakes.items()}

    def post(url: str, **kwargs: Any) -> httpx.Response:
        base = next(u for u in URLS if url.startswith(u))
        if fakes[base].down:
            raise httpx.ConnectError("connection refused")
        kwargs.pop("timeout", None)
        return clients[base].post(url[len(base):], **kwargs)

    monkeypatch.setattr(httpx, "post", post)
    return fakes


def version(n: int, tmp_path: Any) -> ModelVersionRecord:
    return ModelVersionRecord(name="policy", version=n, path=str(tmp_path / f"v{n}"), status="candidate",
                              created_at=0.0, updated_at=0.0, metadata={})


def serving(lines: list[str]) -> VLLMServing:
    cfg = BackendConfig(kind="vllm", model="tiny", base_url=URLS[0], max_retries=0)
    return VLLMServing(cfg, tokenizer=None, replicas=[URLS[1], URLS[0]], log=lines.append)  # a duplicate is dropped


def test_a_version_is_loaded_into_every_replica(servers, tmp_path):
    lines: list[str] = []
    s = serving(lines)
    assert [a.base_url for a in s.admins] == list(URLS)
    assert s.load(version(1, tmp_path)) == "policy-v1"
    assert all("policy-v1" in f.served for f in servers.values()) and not lines
    s.unload(version(1, tmp_path))
    assert not any("policy-v1" in f.served for f in servers.values())
    s.unload(version(1, tmp_path))  # a name a server no longer holds is fine


def test_a_replica_that_fails_is_reported_and_the_canary_samples_elsewhere(servers, tmp_path):
    lines: list[str] = []
    s = serving(lines)
    servers[URLS[0]].fail_loads = True
    s.load(version(2, tmp_path))
    assert "policy-v2" in servers[URLS[1]].served and s.failed["policy-v2"].keys() == {URLS[0]}
    assert len(lines) == 1 and lines[0].startswith(f"replica {URLS[0]} did not load policy-v2")
    assert s.backend(version(2, tmp_path)).base_url.startswith(URLS[1])
    s.close()


def test_no_replica_loading_it_fails_the_load(servers, tmp_path):
    s = serving([])
    for f in servers.values():
        f.down = True
    with pytest.raises(WeightSyncError, match="replica-a"):
        s.load(version(3, tmp_path))


def test_replicas_need_a_vllm_backend():
    with pytest.raises(ConfigError, match="backend.kind vllm"):
        serving_for(BackendConfig(kind="local"), replicas=[URLS[1]])
