"""Several upstream replicas behind one gateway, with fake vLLM servers (``FakeVLLM``).

What the replica set promises (``seed_agents.gateway.replicas``): requests spread over the
replicas in rotation; a new version is taken only after every replica was asked, and one
that cannot serve it leaves the rotation (reported) instead of serving the old version under
the new stamp; a dead replica's requests go to another (none lost); a replica comes back once
it answers and serves the current version, the adapter loaded into it from the registry when
it lacks it; a rollback reaches every replica; every stored call names its replica, and its
stamp is the version that replica served.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from seed_agents.continual import VersionRegistry
from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig, RegistryConfig
from seed_agents.gateway.replicas import ReplicaSet
from seed_agents.gateway.testing import FakeVLLM
from seed_agents.gateway.upstream import Upstream, UpstreamError
from seed_agents.store import TraceStore
from seed_agents.types import SamplingParams

MODEL = "tiny"  # the public name and the base model's served name
NAME = "policy"  # the registry name
URLS = ("http://replica-a:8000", "http://replica-b:8000")


@pytest.fixture
def fakes(tokenizer: Any) -> list[FakeVLLM]:
    return [FakeVLLM(tokenizer, model=MODEL) for _ in URLS]


@pytest.fixture
def registry(store: TraceStore) -> VersionRegistry:
    r = VersionRegistry(store)
    r.bootstrap(NAME, MODEL)
    return r


def replica_set(fakes: list[FakeVLLM], **options: Any) -> ReplicaSet:
    return ReplicaSet([Upstream(url, MODEL, transport=f.transport(), retries=0) for url, f in zip(URLS, fakes, strict=True)],
                      **options)


def client_for(fakes: list[FakeVLLM], store: TraceStore, tokenizer: Any, *, registry: bool = True,
               **options: Any) -> TestClient:
    follow = RegistryConfig(name=NAME, refresh_s=0.0) if registry else None
    cfg = GatewayConfig(upstream=list(URLS), model=MODEL, registry=follow, name="gw-test")
    return TestClient(build_app(cfg, store, replica_set(fakes, **options), tokenizer=tokenizer))


def chat(client: TestClient, session: str | None = None) -> httpx.Response:
    headers = {"X-Session-Id": session} if session else {}
    r = client.post("/v1/chat/completions", headers=headers, json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    return r


def stored(client: TestClient, response: httpx.Response) -> tuple[str, str, int]:
    """(replica, served name, stamped version) of the call behind ``response``."""
    calls = client.app.state.gateway.store.calls(response.headers["x-session-id"])
    call = next(c for c in calls if c.call_id == response.headers["x-call-id"])
    return call.scope["replica"], call.scope["upstream_model"], call.policy_version


def rotation(client: TestClient) -> dict[str, bool]:
    body = client.get("/v1/admin/replicas").json()
    return {r["url"]: r["in_rotation"] for r in body["replicas"]}


def check(client: TestClient) -> None:
    """One health check now (the gateway runs one every ``replicas.health_s``)."""
    client.portal.call(client.app.state.gateway.upstream.check)


def adapter(registry: VersionRegistry, version: int) -> str:
    registry.add_candidate(NAME, f"/adapters/v{version}", served_name=f"tiny-v{version}")
    return f"tiny-v{version}"


# -- picking --------------------------------------------------------------------------------------


def test_requests_spread_over_the_replicas_and_each_call_names_the_one_that_sampled_it(fakes, store, tokenizer, registry):
    with client_for(fakes, store, tokenizer) as c:
        seen = [stored(c, chat(c)) for _ in range(6)]
    assert sorted(replica for replica, _, _ in seen) == sorted(URLS * 3)  # idle replicas: strictly in turn
    assert {(m, v) for _, m, v in seen} == {(MODEL, 0)} and [len(f.requests) for f in fakes] == [3, 3]


async def test_least_busy_sends_to_the_replica_with_fewer_requests_in_flight(fakes):
    replicas = replica_set(fakes)
    params = SamplingParams(max_tokens=4)
    async with AsyncExitStack() as stack:
        _, first = await replicas.open_stream([1, 2, 3], params, stack)  # a stream holds its replica until it ends
        picks = [(await replicas.complete([1, 2, 3], params))[1].replica for _ in range(3)]
        assert first.replica.in_flight == 1 and first.replica not in picks
    assert first.replica.in_flight == 0
    round_robin = replica_set(fakes, pick="round_robin")
    async with AsyncExitStack() as stack:
        _, first = await round_robin.open_stream([1, 2, 3], params, stack)
        picks = [(await round_robin.complete([1, 2, 3], params))[1].replica for _ in range(2)]
        assert first.replica in picks  # round robin ignores how busy a replica is
    await replicas.aclose()
    await round_robin.aclose()


# -- versions ----------------------------------------------------------------------------------------


def test_a_promotion_reaches_every_replica_and_loads_the_adapter_where_it_is_missing(fakes, store, tokenizer, registry):
    served = adapter(registry, 1)
    fakes[0].served.append(served)  # the loop loaded it into replica a only
    with client_for(fakes, store, tokenizer) as c:
        assert stored(c, chat(c))[1:] == (MODEL, 0)
        registry.promote_manually(NAME, 1)
        seen = [stored(c, chat(c)) for _ in range(4)]
        assert {(m, v) for _, m, v in seen} == {(served, 1)} and {r for r, _, _ in seen} == set(URLS)
        assert fakes[1].loads == [{"lora_name": served, "lora_path": "/adapters/v1"}] and not fakes[0].loads
        assert rotation(c) == dict.fromkeys(URLS, True)


def test_a_replica_that_fails_to_load_the_new_version_leaves_the_rotation_and_is_reported(fakes, store, tokenizer, registry):
    served = adapter(registry, 1)
    fakes[0].served.append(served)
    fakes[1].fail_loads = True
    with client_for(fakes, store, tokenizer) as c:
        chat(c)
        before = len(fakes[1].requests)
        registry.promote_manually(NAME, 1)
        seen = [stored(c, chat(c)) for _ in range(4)]
        assert seen == [(URLS[0], served, 1)] * 4 and len(fakes[1].requests) == before  # never the old version under v1
        assert rotation(c) == {URLS[0]: True, URLS[1]: False}
        (out,) = [r for r in c.get("/v1/admin/replicas").json()["replicas"] if not r["in_rotation"]]
        assert "cannot load 'tiny-v1'" in out["reason"] and "fake load failure" in out["reason"]
        metrics = {(s.name, s.labels.get("replica")): s.value for f in text_string_to_metric_families(c.get("/metrics").text)
                   for s in f.samples}
        assert metrics[("seed_gateway_replica_in_rotation", URLS[1])] == 0
        fakes[1].fail_loads = False
        check(c)  # the next health check loads it: back in rotation
        assert rotation(c) == dict.fromkeys(URLS, True)
        assert {stored(c, chat(c)) for _ in range(4)} == {(URLS[0], served, 1), (URLS[1], served, 1)}
    (gateway,) = store.gateways()  # what `status` reads, written at the gateway's stop
    assert gateway.name == "gw-test" and gateway.state["policy_version"] == 1 and gateway.state["stopped"]


def test_a_version_no_replica_can_serve_is_not_switched_to(fakes, store, tokenizer, registry):
    adapter(registry, 1)
    for f in fakes:
        f.fail_loads = True
    with client_for(fakes, store, tokenizer) as c:
        registry.promote_manually(NAME, 1)
        assert {stored(c, chat(c))[1:] for _ in range(3)} == {(MODEL, 0)}  # users keep a working version
        assert rotation(c) == dict.fromkeys(URLS, True)
        assert c.get("/v1/admin/stats").json()["policy_not_served"] >= 1


def test_a_rollback_reaches_every_replica_also_one_that_restarted_since(fakes, store, tokenizer, registry):
    one, two = adapter(registry, 1), adapter(registry, 2)
    with client_for(fakes, store, tokenizer) as c:
        registry.promote_manually(NAME, 1)
        assert {stored(c, chat(c))[1:] for _ in range(2)} == {(one, 1)}
        registry.promote_manually(NAME, 2)
        assert {stored(c, chat(c))[1:] for _ in range(2)} == {(two, 2)}
        fakes[1].down = True
        fakes[1].restart()  # replica b restarted: it forgot both adapters
        registry.rollback(NAME)
        seen = {stored(c, chat(c)) for _ in range(4)}
        assert seen == {(URLS[0], one, 1), (URLS[1], one, 1)}
        assert [x["lora_name"] for x in fakes[1].loads] == [one, two, one]


def test_an_admin_switch_needs_a_replica_that_serves_the_name(fakes, store, tokenizer):
    with client_for(fakes, store, tokenizer, registry=False) as c:
        r = c.put("/v1/admin/policy", json={"upstream_model": "nowhere", "policy_version": 3})
        assert r.status_code == 409 and r.json()["error"]["code"] == "model_not_served"
        fakes[1].served.append("tiny-v3")
        r = c.put("/v1/admin/policy", json={"upstream_model": "tiny-v3", "policy_version": 3})
        assert r.status_code == 200 and rotation(c) == {URLS[0]: False, URLS[1]: True}
        assert {stored(c, chat(c)) for _ in range(3)} == {(URLS[1], "tiny-v3", 3)}


# -- failures ----------------------------------------------------------------------------------------


def test_a_dead_replica_loses_no_call_and_rejoins_once_it_serves_the_current_version(fakes, store, tokenizer, registry):
    served = adapter(registry, 1)
    for f in fakes:
        f.served.append(served)
    with client_for(fakes, store, tokenizer) as c:
        registry.promote_manually(NAME, 1)
        chat(c)
        fakes[1].down = True  # killed mid-traffic
        seen = [stored(c, chat(c, session=f"s{i}")) for i in range(6)]  # every one answered and stored once
        assert set(seen) == {(URLS[0], served, 1)}
        assert rotation(c) == {URLS[0]: True, URLS[1]: False}
        assert c.get("/v1/admin/stats").json()["replica_failovers"] == 1  # taken out at its first failure
        fakes[1].restart()  # back, without the adapter
        check(c)
        assert rotation(c) == dict.fromkeys(URLS, True) and fakes[1].loads[-1]["lora_name"] == served
        assert {stored(c, chat(c)) for _ in range(4)} == {(URLS[0], served, 1), (URLS[1], served, 1)}
    assert sum(len(store.calls(f"s{i}")) for i in range(6)) == 6


def test_a_replica_that_forgot_the_adapter_fails_over_instead_of_erroring(fakes, store, tokenizer, registry):
    served = adapter(registry, 1)
    for f in fakes:
        f.served.append(served)
    with client_for(fakes, store, tokenizer, load_adapters=False) as c:
        registry.promote_manually(NAME, 1)
        fakes[0].restart()  # restarted between two health checks: it answers 404 for tiny-v1
        assert {stored(c, chat(c)) for _ in range(4)} == {(URLS[1], served, 1)}
        (out,) = [r for r in c.get("/v1/admin/replicas").json()["replicas"] if not r["in_rotation"]]
        assert out["url"] == URLS[0] and "does not serve" in out["reason"]
        check(c)  # without load_adapters it stays out until someone loads it
        assert rotation(c) == {URLS[0]: False, URLS[1]: True}


def test_with_every_replica_down_the_client_gets_the_upstream_error(fakes, store, tokenizer):
    for f in fakes:
        f.down = True
    with client_for(fakes, store, tokenizer, registry=False) as c:
        for _ in range(2):  # out of rotation, still tried: the alternative is a certain error
            r = c.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 502 and r.json()["error"]["code"] == "upstream_unreachable"
        fakes[0].down = False
        chat(c)  # it answers again: back in rotation without waiting for a health check
        assert rotation(c) == {URLS[0]: True, URLS[1]: False}
    assert store.sessions() != []


async def test_a_replica_that_is_down_at_start_starts_out_of_rotation(fakes):
    fakes[1].down = True
    replicas = replica_set(fakes)
    await replicas.check()
    assert [r.in_rotation for r in replicas.replicas] == [True, False]
    assert "unreachable" in replicas.replicas[1].reason
    with pytest.raises(UpstreamError):
        await replicas.replicas[1].upstream.probe(1.0)
    await replicas.aclose()


async def test_a_switch_and_the_rotation_change_together(fakes):
    """No request may see the new pair with the old rotation: the switch applies both in one step."""
    fakes[1].served.append("tiny-v1")
    replicas = replica_set(fakes, load_adapters=False)
    result = await replicas.switch("tiny-v1", 1)
    assert result.switched and list(result.out) == [URLS[0]]
    picks = [replicas.pick() for _ in range(4)]
    assert {(p.replica.url, p.model, p.policy_version) for p in picks} == {(URLS[1], "tiny-v1", 1)}
    assert not (await replicas.switch("nowhere", 2)).switched and (replicas.model, replicas.policy_version) == ("tiny-v1", 1)
    await asyncio.sleep(0)
    await replicas.aclose()


# -- the command line ----------------------------------------------------------------------------------


def test_the_cli_starts_with_an_unreachable_replica_out_of_rotation_and_says_so_in_one_line(tiny_model_dir, tmp_path,
                                                                                              capsys, monkeypatch):
    from seed_agents.app.cli import main
    from tests.gateway_procs import MODEL as FAKE_MODEL
    from tests.gateway_procs import gateway_on_fake_vllm

    dead = "http://127.0.0.1:9"  # nothing listens there
    with gateway_on_fake_vllm(tiny_model_dir, tmp_path, "--upstream", dead, "--name", "gw-cli") as (url, _, _):
        r = httpx.post(f"{url}/v1/chat/completions", json={"model": FAKE_MODEL, "messages": [{"role": "user", "content": "hi"}]},
                       timeout=60)
        assert r.status_code == 200
        replicas = {x["url"]: x["in_rotation"] for x in httpx.get(f"{url}/v1/admin/replicas", timeout=10).json()["replicas"]}
    assert replicas[dead] is False and sum(replicas.values()) == 1
    log = (tmp_path / "gateway.log").read_text()
    said = [line for line in log.splitlines() if dead in line and "out of rotation" in line]
    assert len(said) == 1 and "unreachable" in said[0] and "Traceback" not in log
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["gateway", "--upstream", "localhost:8000", "--model", "m"]) == 2  # a URL without its scheme
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "upstream" in err[0] and "http(s)://host[:port]" in err[0]
