"""The version registry (promote, reject, rollback, crash recovery), the gateway following
it, and the ``versions`` command. SQLite here; the store-level promises (atomic switch,
one promoted version under racing threads and processes, kill -9 inside a promotion,
migration) run on SQLite and PostgreSQL in tests/store_suite.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from seed_agents.app.commands import continual as versions_cli
from seed_agents.continual import CanaryResult, GateConfig, GateDecision, VersionRegistry, decide
from seed_agents.errors import ConfigError
from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig, RegistryConfig
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import StoreError, TraceStore

REPO_ROOT = Path(__file__).resolve().parents[2]
MODEL = "tiny"  # the public name, and the base model's served name in the fake upstream
NAME = "policy"  # the registry name


def verdict(kind: str) -> GateDecision:
    """A real gate decision of the wanted verdict, from hand-built canary results."""
    promoted = [CanaryResult(task_id=f"t{i}", seed=0, reward=1.0) for i in range(8)]
    reward = {"promote": 1.0, "reject": 0.0}[kind]
    candidate = [CanaryResult(task_id=f"t{i}", seed=0, reward=reward) for i in range(8)]
    d = decide(promoted, candidate, GateConfig(margin=0.05))
    assert d.verdict == kind
    return d


@pytest.fixture
def registry(store: TraceStore) -> VersionRegistry:
    r = VersionRegistry(store)
    r.bootstrap(NAME, MODEL)
    return r


def statuses(registry: VersionRegistry) -> dict[int, str]:
    return {v.version: v.status for v in registry.versions(NAME)}


# -- the registry ----------------------------------------------------------------------------------


def test_bootstrap_serves_the_base_model_once(store):
    registry = VersionRegistry(store)
    assert registry.resolve(NAME) is None
    served = registry.bootstrap(NAME, MODEL, path="/models/base")
    assert (served.version, served.served_name) == (0, MODEL)
    registry.add_candidate(NAME, "/ckpt/1")
    registry.promote_manually(NAME, 1)
    assert registry.bootstrap(NAME, MODEL).version == 1  # already serving something: no change
    assert [d.actor for d in registry.decisions(NAME)] == ["bootstrap", "operator"]


def test_gate_decisions_promote_or_reject_with_their_evidence(registry):
    v1 = registry.add_candidate(NAME, "/ckpt/1")
    v2 = registry.add_candidate(NAME, "/ckpt/2", served_name="custom-adapter")
    assert (v1.version, v2.version, v1.status) == (1, 2, "candidate")
    assert registry.resolve(NAME).version == 0  # candidates never serve

    rejected = registry.record_decision(NAME, 1, verdict("reject"), baseline=0)
    assert (rejected.action, rejected.actor, rejected.from_version, rejected.to_version) == ("reject", "gate", 0, 0)
    assert GateDecision.model_validate(rejected.evidence["gate"]) == verdict("reject")
    assert rejected.summary.startswith("gate: v1 vs v0: reject: mean diff -1.000")
    assert statuses(registry) == {0: "promoted", 1: "rejected", 2: "candidate"}

    promoted = registry.record_decision(NAME, 2, verdict("promote"), baseline=0)
    assert (promoted.action, promoted.from_version, promoted.to_version) == ("promote", 0, 2)
    assert statuses(registry) == {0: "retired", 1: "rejected", 2: "promoted"}
    served = registry.resolve(NAME)
    assert (served.version, served.served_name) == (2, "custom-adapter")
    assert registry.versions(NAME, "promoted")[0].metadata["last_decision"]["decision_id"] == promoted.decision_id


def test_the_gate_path_refuses_what_it_must_not_promote(registry):
    registry.add_candidate(NAME, "/ckpt/1")
    registry.add_candidate(NAME, "/ckpt/2")
    with pytest.raises(StoreError, match="verdict .* is 'reject', not 'promote'"):
        registry.promote(NAME, 1, verdict("reject"), baseline=0)
    registry.promote_manually(NAME, 2)  # an operator switched while the canary of v1 ran against v0
    with pytest.raises(StoreError, match="is v2, not v0"):
        registry.promote(NAME, 1, verdict("promote"), baseline=0)
    registry.record_decision(NAME, 1, verdict("reject"), baseline=2)
    with pytest.raises(StoreError, match="cannot promote policy v1: it is rejected"):
        registry.promote(NAME, 1, verdict("promote"), baseline=2)
    with pytest.raises(StoreError, match="cannot reject policy v1: it is rejected"):
        registry.record_decision(NAME, 1, verdict("reject"), baseline=2)
    assert registry.resolve(NAME).version == 2


def test_rollback_walks_back_one_promotion_at_a_time(registry):
    for v in (1, 2, 3):
        registry.add_candidate(NAME, f"/ckpt/{v}")
    registry.promote(NAME, 1, verdict("promote"), baseline=0)
    registry.promote(NAME, 2, verdict("promote"), baseline=1)
    first = registry.rollback(NAME, reason="users complain")
    assert (first.action, first.version, first.from_version, first.to_version) == ("rollback", 1, 2, 1)
    assert first.summary == "operator: roll back v2 -> v1: users complain"
    assert statuses(registry) == {0: "retired", 1: "promoted", 2: "rejected", 3: "candidate"}
    assert registry.rollback(NAME).to_version == 0
    with pytest.raises(StoreError, match="nothing to roll back to"):
        registry.rollback(NAME)
    # an operator brings back the rejected v2; a rollback then undoes that override
    manual = registry.promote_manually(NAME, 2, reason="false alarm")
    assert (manual.actor, manual.from_version, manual.evidence) == ("operator", 0, {"reason": "false alarm", "manual": True})
    assert registry.rollback(NAME).to_version == 0
    with pytest.raises(StoreError, match="cannot promote policy v0: it is promoted"):
        registry.promote_manually(NAME, 0)


def test_rollback_skips_versions_rejected_since(registry):
    for v in (1, 2):
        registry.add_candidate(NAME, f"/ckpt/{v}")
    registry.promote_manually(NAME, 1)  # 0 -> 1
    registry.promote_manually(NAME, 2)  # 1 -> 2
    registry.rollback(NAME)  # 2 -> 1, v2 rejected
    registry.promote_manually(NAME, 2)  # 1 -> 2 again, by hand
    registry.rollback(NAME)  # 2 -> 1 ... v1 serves, v2 rejected again
    assert registry.rollback(NAME).to_version == 0  # v1 replaced v0


def test_a_loop_killed_after_loading_its_candidate_leaves_it_unserved(store, tmp_path):
    """kill -9 between "candidate loaded" and "decision": the candidate stays a candidate,
    the promoted version keeps serving, and the restarted loop finds it in ``pending``."""
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent("""
        import sys, time
        from seed_agents.continual import VersionRegistry
        from seed_agents.store import TraceStore

        registry = VersionRegistry(TraceStore.open(sys.argv[1]))
        registry.bootstrap("policy", "tiny")
        registry.add_candidate("policy", "/ckpt/1", served_name="policy-v1")
        print("candidate loaded", flush=True)  # ... the canary would run now
        time.sleep(600)
    """))
    url = str(store._engine.url)  # noqa: SLF001 - the fixture's database
    proc = subprocess.Popen([sys.executable, str(script), url], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)})
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "candidate loaded"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)
    registry = VersionRegistry(store)
    assert registry.resolve(NAME).version == 0
    assert [v.version for v in registry.pending(NAME)] == [1]
    assert [d.action for d in registry.decisions(NAME)] == ["promote"]  # the bootstrap only
    discarded = registry.discard(NAME, 1, reason="canary interrupted by a restart")
    assert (discarded.actor, discarded.evidence) == ("recovery", {"reason": "canary interrupted by a restart"})
    assert registry.pending(NAME) == [] and statuses(registry) == {0: "promoted", 1: "rejected"}


def test_racing_threads_keep_exactly_one_promoted_version(registry, store):
    for v in range(1, 9):
        registry.add_candidate(NAME, f"/ckpt/{v}")
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def operator(i: int) -> None:
        barrier.wait()
        try:
            for _ in range(3):
                for step in (lambda: registry.promote_manually(NAME, i + 1), lambda: registry.rollback(NAME)):
                    try:
                        step()
                    except StoreError as e:
                        # refused as a whole: another thread switched first (compare-and-swap),
                        # or a rollback already brought this thread's version back
                        assert any(m in str(e) for m in ("not v", "came after", "nothing to roll back", "it is promoted")), e
        except BaseException as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=operator, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    history = registry.decisions(NAME)
    assert [d.from_version for d in history[1:]] == [d.to_version for d in history[:-1]]
    assert len(store.model_versions(NAME, status="promoted")) == 1
    assert registry.resolve(NAME).version == history[-1].to_version


# -- the gateway follows the registry -----------------------------------------------------------------


def gateway_app(fake: Any, store: TraceStore, tokenizer: Any, *, refresh_s: float = 0.0,
                transport: httpx.AsyncBaseTransport | None = None) -> Any:
    cfg = GatewayConfig(upstream="http://fake", model=MODEL, registry=RegistryConfig(name=NAME, refresh_s=refresh_s))
    upstream = Upstream("http://fake", MODEL, transport=transport or fake.transport(), retries=0)
    return build_app(cfg, store, upstream, tokenizer=tokenizer)


def chat(client: TestClient) -> tuple[str, int]:
    """One chat call; what went upstream and the version its stored call carries."""
    r = client.post("/v1/chat/completions", json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 200, r.text
    (call,) = client.app.state.gateway.store.calls(r.headers["x-session-id"])
    return client.app.state.gateway.upstream.model, call.policy_version


def test_promotions_and_rollbacks_reach_users_without_a_restart(fake, store, tokenizer, registry):
    registry.add_candidate(NAME, "/ckpt/1", served_name="tiny-v1")
    fake.served.append("tiny-v1")
    with TestClient(gateway_app(fake, store, tokenizer)) as client:
        assert chat(client) == (MODEL, 0) and fake.requests[-1]["model"] == MODEL
        registry.promote(NAME, 1, verdict("promote"), baseline=0)
        assert chat(client) == ("tiny-v1", 1) and fake.requests[-1]["model"] == "tiny-v1"
        assert client.get("/v1/admin/policy").json() == {"upstream_model": "tiny-v1", "policy_version": 1}
        registry.rollback(NAME)
        assert chat(client) == (MODEL, 0) and fake.requests[-1]["model"] == MODEL
        assert client.get("/v1/models").json()["data"][0]["id"] == MODEL  # one public name throughout
        r = client.put("/v1/admin/policy", json={"upstream_model": "tiny-v1", "policy_version": 1})
        assert r.status_code == 409 and r.json()["error"]["code"] == "policy_follows_registry"
        assert client.get("/v1/admin/stats").json()["policy_switches"] == 2


def test_the_promoted_version_is_reread_at_most_every_refresh_interval(fake, store, tokenizer, registry):
    registry.add_candidate(NAME, "/ckpt/1", served_name="tiny-v1")
    fake.served.append("tiny-v1")
    now = [100.0]
    app = gateway_app(fake, store, tokenizer, refresh_s=10.0)
    app.state.gateway.policy._clock = lambda: now[0]  # noqa: SLF001 - a test clock
    with TestClient(app) as client:
        assert chat(client) == (MODEL, 0)
        registry.promote_manually(NAME, 1)
        now[0] = 109.0
        assert chat(client) == (MODEL, 0)  # read at t=100: still fresh
        now[0] = 110.5
        assert chat(client) == ("tiny-v1", 1)


def test_a_promoted_adapter_the_upstream_does_not_serve_is_not_switched_to(fake, store, tokenizer, registry):
    registry.add_candidate(NAME, "/ckpt/1", served_name="tiny-v1")
    registry.promote_manually(NAME, 1)  # e.g. by hand, before the adapter was loaded
    fake.fail_loads = True  # and the gateway cannot load it either (e.g. its path is not on the server's machine)
    with TestClient(gateway_app(fake, store, tokenizer)) as client:
        assert chat(client) == (MODEL, 0)  # users keep a working version; stamps say which
        assert client.get("/v1/admin/stats").json()["policy_not_served"] >= 1
        fake.served.append("tiny-v1")  # the adapter is loaded now
        assert chat(client) == ("tiny-v1", 1)


def test_an_unreadable_store_keeps_the_current_version_serving(fake, store, tokenizer, registry, monkeypatch):
    with TestClient(gateway_app(fake, store, tokenizer)) as client:
        assert chat(client) == (MODEL, 0)

        def down(name: str) -> None:
            raise StoreError("database is gone")

        monkeypatch.setattr(client.app.state.gateway.policy.registry, "resolve", down)
        assert chat(client) == (MODEL, 0)
        assert client.get("/v1/admin/stats").json()["policy_refresh_errors"] >= 1


class HoldFirstCompletion(httpx.AsyncBaseTransport):
    """Forwards to the fake upstream, holding the first completion until released."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.entered = asyncio.Event()
        self.release = asyncio.Event()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/completions") and not self.entered.is_set():
            self.entered.set()
            await self.release.wait()
        return await self.inner.handle_async_request(request)


async def test_a_request_in_flight_finishes_on_the_version_it_started_with(fake, store, tokenizer, registry):
    registry.add_candidate(NAME, "/ckpt/1", served_name="tiny-v1")
    fake.served.append("tiny-v1")
    hold = HoldFirstCompletion(fake.transport())
    app = gateway_app(fake, store, tokenizer, transport=hold)
    body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gateway") as client:
        slow = asyncio.create_task(client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "slow"}))
        await asyncio.wait_for(hold.entered.wait(), 30)  # the slow request is upstream, on v0
        registry.promote(NAME, 1, verdict("promote"), baseline=0)
        fast = await client.post("/v1/chat/completions", json=body, headers={"X-Session-Id": "fast"})
        hold.release.set()
        slow_reply = await asyncio.wait_for(slow, 30)
    assert fast.status_code == slow_reply.status_code == 200
    assert [r["model"] for r in fake.requests] == ["tiny-v1", MODEL]  # the fast one went out first
    assert store.calls("slow")[0].policy_version == 0 and store.calls("fast")[0].policy_version == 1
    assert slow_reply.json()["system_fingerprint"] == "policy-v0"


# -- seed-agents versions -------------------------------------------------------------------------------


def run_cli(*argv: str) -> int:
    parser = argparse.ArgumentParser()
    versions_cli.add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["versions", *argv])
    return args.func(args)


def test_versions_command_lists_promotes_and_rolls_back(tmp_path, capsys):
    url = f"sqlite:///{tmp_path}/traces.db"
    with TraceStore.open(url) as store:
        registry = VersionRegistry(store)
        registry.bootstrap(NAME, MODEL)
        registry.add_candidate(NAME, "/ckpt/1")
        registry.add_candidate(NAME, "/ckpt/2", served_name="adapter-two")
        registry.record_decision(NAME, 1, verdict("reject"), baseline=0)

    assert run_cli("list", "--store", url) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "model 'policy': 3 versions"
    assert lines[1].split() == ["VERSION", "STATUS", "SERVED", "AS", "CREATED", "LAST", "DECISION"]
    assert lines[2].split()[:3] == ["v0", "promoted", MODEL] and "bootstrap: v0" in lines[2]
    assert lines[3].split()[:3] == ["v1", "rejected", "policy-v1"] and "gate: v1 vs v0: reject: mean diff -1.000" in lines[3]
    assert lines[4].split()[:3] == ["v2", "candidate", "adapter-two"]

    assert run_cli("promote", "2", "--store", url, "--reason", "hotfix") == 0
    assert capsys.readouterr().out.strip().startswith("policy: v2 promoted (was v0); decision #3 stored")
    assert run_cli("rollback", "--store", url, "--model", NAME) == 0
    assert "rolled back v2 -> v0 (v2 is now rejected)" in capsys.readouterr().out
    run_cli("list", "--store", url)
    listed = capsys.readouterr().out
    assert "operator: roll back v2 -> v0" in listed and "operator: promote v2: hotfix" not in listed
    with TraceStore.open(url) as store:
        assert [d.summary for d in VersionRegistry(store).decisions(NAME)][-2:] == [
            "operator: promote v2: hotfix", "operator: roll back v2 -> v0"]


@pytest.mark.parametrize(("argv", "message"), [
    (["promote", "9"], "unknown model version policy v9"),
    (["promote", "0"], "cannot promote policy v0: it is promoted"),
    (["rollback"], "nothing to roll back to"),
    (["list", "--model", "nope"], "--model 'nope': the store has no versions of it (models with versions: policy)"),
])
def test_versions_command_errors_are_one_line(tmp_path, argv, message):
    url = f"sqlite:///{tmp_path}/traces.db"
    with TraceStore.open(url) as store:
        VersionRegistry(store).bootstrap(NAME, MODEL)
    with pytest.raises(ConfigError) as info:
        run_cli(*argv, "--store", url)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_versions_command_needs_a_model_name_only_when_ambiguous(tmp_path):
    url = f"sqlite:///{tmp_path}/traces.db"
    with pytest.raises(ConfigError, match="holds no model versions yet"):
        run_cli("list", "--store", url)
    with TraceStore.open(url) as store:
        VersionRegistry(store).bootstrap("a", "base-a")
        VersionRegistry(store).bootstrap("b", "base-b")
    with pytest.raises(ConfigError, match=r"several models \(a, b\): pass --model NAME"):
        run_cli("list", "--store", url)
    assert run_cli("list", "--store", url, "--model", "b") == 0
    with pytest.raises(ConfigError, match="unsupported store URL scheme"):
        run_cli("list", "--store", "mysql://x/y")
