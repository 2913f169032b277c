"""The gateway's Prometheus ``/metrics``, scraped over a real socket and parsed as exposition text.

The gateway runs under uvicorn on a loopback port (its upstream is the in-process
``FakeVLLM``); traffic goes through ``httpx``; the scrape is parsed by
``prometheus_client``'s own parser, so a malformed exposition fails here as it would in
Prometheus.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as openmetrics_families,
)
from prometheus_client.parser import text_string_to_metric_families

from examples.library_service import DemoServer
from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig, RegistryConfig
from seed_agents.gateway.upstream import Upstream
from seed_agents.observe.testing import MODEL, populate
from seed_agents.store import StoreError

ADMIN = {"Authorization": "Bearer adm-key-123456"}
CLIENT = {"Authorization": "Bearer cli-key-123456"}


@pytest.fixture
def gateway(fake, store, tokenizer) -> Iterator[str]:
    fake.served.append("policy-v1")  # the promoted adapter of the populated store
    cfg = GatewayConfig(upstream="http://fake", model="tiny", registry=RegistryConfig(name=MODEL, refresh_s=0),
                        security={"admin_keys": ["adm-key-123456"], "client_keys": ["cli-key-123456"]})
    upstream = Upstream("http://fake", "tiny", transport=fake.transport(), retries=0)
    app = build_app(cfg, store, upstream, tokenizer=tokenizer)
    with DemoServer(app) as server:
        yield server.url


def scrape(url: str, *, openmetrics: bool = False) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """Sample name -> {sorted labels: value}, parsed from the real endpoint in the format
    asked for (Prometheus text, or OpenMetrics as Prometheus itself asks first)."""
    accept = "application/openmetrics-text;version=1.0.0,text/plain;q=0.5" if openmetrics else "text/plain"
    r = httpx.get(f"{url}/metrics", headers={**ADMIN, "Accept": accept})
    assert r.status_code == 200
    kind = r.headers["content-type"].split(";")[0]
    assert kind == ("application/openmetrics-text" if openmetrics else "text/plain")
    parse = openmetrics_families if openmetrics else text_string_to_metric_families
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in parse(r.text):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


def one(samples: dict[str, dict[Any, float]], sample: str, /, **labels: str) -> float:
    return samples[sample][tuple(sorted(labels.items()))]


def test_metrics_count_traffic_tokens_feedback_versions_and_decisions(gateway, store, fake):
    url = gateway
    populate(store, hours=2, per_hour=2)
    with httpx.Client(base_url=url, headers=CLIENT) as c:
        replies = [c.post("/v1/chat/completions", json={"model": "tiny", "messages": [{"role": "user", "content": f"hi {i}"}]})
                   for i in range(3)]
        assert [r.status_code for r in replies] == [200, 200, 200]
        assert c.post("/v1/chat/completions", json={"model": "nope", "messages": []}).status_code in (400, 404)
        sid = replies[0].headers["x-session-id"]
    r = httpx.post(f"{url}/v1/sessions/{sid}/reward", json={"value": 1.0, "source": "user"}, headers=ADMIN)
    assert r.status_code == 200
    assert httpx.post(f"{url}/v1/sessions/{sid}/end", headers=ADMIN).status_code == 200

    m = scrape(url)
    # requests by route template and status; the session id in a path does not make a series
    assert one(m, "seed_gateway_http_requests_total", method="POST", route="/v1/chat/completions", status="200") == 3
    assert sum(v for k, v in m["seed_gateway_http_requests_total"].items() if dict(k)["status"].startswith("4")) == 1
    assert one(m, "seed_gateway_http_requests_total", method="POST", route="/v1/sessions/{session_id}/reward", status="200") == 1
    assert one(m, "seed_gateway_http_request_duration_seconds_count", route="/v1/chat/completions") == 4
    # tokens and calls of what was stored, stamped with the promoted version
    stored = store.calls(sid) + [c for r in replies[1:] for c in store.calls(r.headers["x-session-id"])]
    assert len(stored) == 3 and {c.policy_version for c in stored} == {1}
    assert one(m, "seed_gateway_calls_total", policy_version="1") == 3
    assert one(m, "seed_gateway_tokens_total", kind="prompt", policy_version="1") == sum(len(c.prompt_ids) for c in stored)
    assert one(m, "seed_gateway_tokens_total", kind="completion", policy_version="1") == sum(len(c.completion_ids) for c in stored)
    assert one(m, "seed_gateway_model_call_seconds_count") == 3
    # feedback handled here, and rewards in the store by source
    assert one(m, "seed_gateway_feedback_total", kind="reward") == 1
    assert one(m, "seed_gateway_feedback_total", kind="session_end") == 1
    by_source = [r.source for s in store.sessions() for r in store.rewards(s.session_id)]
    assert one(m, "seed_store_rewards", source="user") == by_source.count("user") == 2 + 1 + 1  # populate's 3, ours
    assert one(m, "seed_store_rewards", source="verifier") == by_source.count("verifier")
    # versions and decisions
    assert one(m, "seed_model_promoted_version", name=MODEL) == 1
    assert one(m, "seed_gateway_serving_policy_version", upstream_model="policy-v1") == 1
    assert one(m, "seed_model_versions", name=MODEL, status="candidate") == 1
    assert one(m, "seed_store_decisions", name=MODEL, action="reject", actor="gate") == 1
    assert one(m, "seed_store_decisions", name=MODEL, action="promote", actor="gate") == 1
    assert one(m, "seed_store_queue_length", queue="open") == 1 + 2  # populate's open one, our 2 not ended
    assert one(m, "seed_store_up") == 1
    assert one(m, "seed_gateway_errors_total", kind="upstream") == 0
    om = scrape(url, openmetrics=True)  # the same numbers in the format Prometheus prefers
    assert one(om, "seed_gateway_calls_total", policy_version="1") == 3
    assert one(om, "seed_model_promoted_version", name=MODEL) == 1


def test_upstream_failures_count_as_errors(gateway, fake):
    url = gateway
    fake.fail_status = 503
    r = httpx.post(f"{url}/v1/chat/completions", headers=CLIENT,
                   json={"model": "tiny", "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code >= 500
    m = scrape(url)
    assert sum(m["seed_gateway_errors_total"].values()) >= 1
    assert one(m, "seed_gateway_http_requests_total", method="POST", route="/v1/chat/completions", status=str(r.status_code)) == 1


def test_metrics_need_the_admin_key_and_survive_a_broken_store(gateway, store, monkeypatch):
    url = gateway
    assert httpx.get(f"{url}/metrics").status_code == 401
    assert httpx.get(f"{url}/metrics", headers=CLIENT).status_code == 403

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise StoreError("database is gone")

    monkeypatch.setattr(store, "model_versions", broken)
    m = scrape(url)
    assert one(m, "seed_store_up") == 0 and "seed_model_promoted_version" not in m
    assert "seed_gateway_http_requests_total" in m  # the gateway's own numbers still come
