"""Two vLLM replicas, two gateways, one PostgreSQL store: a deployment past one machine, on one.

Real parts throughout: two CPU vLLM servers of the tiny model (the session's server and one
of this test's own), two gateway processes started by the CLI (``python -m seed_agents.gateway``)
that follow the store's version registry, and PostgreSQL. The story:

1. traffic across both gateways, each session continued on the other gateway;
2. a LoRA version loaded into both replicas by the continual loop's serving and promoted;
3. replica b killed (SIGKILL to its process group) mid-traffic, then restarted: it comes back
   without the adapter, the gateways load it from the registry path and put it back;
4. a rollback, which reaches both replicas.

Asserts: every answered call is stored exactly once, in the session it was sent in; none is
stored that was not answered; every stored call's stamp is the version its replica served
(its logprobs are what that replica computes under the stamped version's served name, and
not what the other version computes); both gateways and their spools are seen in the store;
every process this test started is stopped at the end.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

pytestmark = pytest.mark.integration

from seed_agents.app.serving import VLLMServing  # noqa: E402
from seed_agents.backends.vllm import VLLMBackend  # noqa: E402
from seed_agents.config import BackendConfig  # noqa: E402
from seed_agents.continual import VersionRegistry  # noqa: E402
from seed_agents.serve import VLLMServer, free_port, group_members  # noqa: E402
from seed_agents.store import TraceStore  # noqa: E402
from tests.conftest import TINY_SERVED_NAME, require_vllm  # noqa: E402
from tests.gateway_procs import stop, wait_up  # noqa: E402
from tests.pg_fixture import PostgresServer, postgres_server  # noqa: E402,F401 - the session fixture

NAME = "replicated"  # the registry name: its adapters' served names are its own (replicated-v1)
GATEWAYS = ("gw-1", "gw-2")


@pytest.fixture(scope="session")
def replica_b(tiny_model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMServer]:
    """A second server of the tiny model, started without waiting (session scope, asked for
    before the session's server, so both boot at once); a fixed port, so a restart comes back
    where the gateways look. The test kills and restarts it; only it uses it."""
    require_vllm()
    server = VLLMServer(tiny_model_dir, served_model_name=TINY_SERVED_NAME, work_dir=tmp_path_factory.mktemp("replica-b"),
                        port=free_port(), stop_grace_s=10)
    server.start()
    try:
        yield server
    finally:
        server.stop()


class Traffic:
    """Chat calls through the gateways; remembers every answer (and every failure)."""

    def __init__(self, gateways: list[str]) -> None:
        self.gateways = gateways
        self.answered: list[dict[str, Any]] = []  # {"gateway", "session", "call_id", "version"}
        self.failed: list[str] = []
        self._lock = threading.Lock()
        self._n = 0
        self._client = httpx.Client(timeout=180)

    def session(self, tag: str) -> None:
        """A two-turn session: the first turn on one gateway, the second on the other."""
        with self._lock:
            self._n += 1
            k = self._n
        sid = f"{tag}-{k}"
        messages = [{"role": "user", "content": f"Say something about {tag} number {k}."}]
        for turn in range(2):
            gateway = self.gateways[(k + turn) % 2]
            reply = self.send(gateway, sid, messages)
            if reply is None:
                return
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "And then?"}]

    def send(self, gateway: str, sid: str, messages: list[dict[str, Any]]) -> str | None:
        body = {"model": TINY_SERVED_NAME, "messages": messages, "max_tokens": 8, "temperature": 1.0}
        try:
            r = self._client.post(f"{gateway}/v1/chat/completions", json=body, headers={"X-Session-Id": sid})
        except httpx.HTTPError as e:
            with self._lock:
                self.failed.append(f"{gateway} {sid}: {type(e).__name__}")
            return None
        if r.status_code != 200:
            with self._lock:
                self.failed.append(f"{gateway} {sid}: HTTP {r.status_code} {r.text[:200]}")
            return None
        version = int(r.json()["system_fingerprint"].removeprefix("policy-v"))
        with self._lock:
            self.answered.append({"gateway": gateway, "session": sid, "call_id": r.headers["x-call-id"], "version": version})
        return r.json()["choices"][0]["message"]["content"] or ""

    def until(self, check: Any, what: str, tag: str, timeout: float = 240) -> None:
        """Keep sending sessions until ``check()``."""
        deadline = time.monotonic() + timeout
        while not check():
            assert time.monotonic() < deadline, f"timed out waiting for {what}; failures: {self.failed[-5:]}"
            self.session(tag)

    def versions_since(self, start: int) -> set[int]:
        return {a["version"] for a in self.answered[start:]}

    def settled_on(self, version: int, start: int, n: int = 6) -> bool:
        """At least ``n`` answers since ``start``, the last ``n`` of them all stamped ``version``."""
        last = self.answered[start:][-n:]
        return len(last) == n and {a["version"] for a in last} == {version}

    def close(self) -> None:
        self._client.close()


def in_rotation(gateway: str) -> dict[str, bool]:
    body = httpx.get(f"{gateway}/v1/admin/replicas", timeout=10).json()
    return {r["url"]: r["in_rotation"] for r in body["replicas"]}


def wait_for(check: Any, what: str, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.5)


def make_adapter(tiny_model_dir: str, out: Path) -> Path:
    """A LoRA adapter with random (not zero) weights: the tiny model's output changes under it."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    lora = LoraConfig(r=8, lora_alpha=32, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(model, lora).save_pretrained(out)
    return out


def test_two_gateways_two_replicas_a_promotion_a_killed_replica_and_a_rollback(
        tmp_path: Path, tiny_model_dir: str, replica_b: VLLMServer, vllm_server: VLLMServer,
        postgres_server: PostgresServer) -> None:  # noqa: F811
    replica_a = vllm_server
    replica_b.wait_ready(timeout=600)
    urls = [replica_a.url, replica_b.url]
    store_url = postgres_server.new_database()
    store = TraceStore.open(store_url)
    registry = VersionRegistry(store)
    registry.bootstrap(NAME, TINY_SERVED_NAME)
    procs: list[subprocess.Popen[bytes]] = []
    gateways: list[str] = []
    b_groups = [replica_b._pgid]  # noqa: SLF001 - every process group replica b ever had must be gone at the end
    traffic: Traffic | None = None
    try:
        for name in GATEWAYS:  # one working folder for both: their default spools must not collide
            port = free_port()
            config = tmp_path / f"{name}.yaml"
            config.write_text(yaml.safe_dump({
                "upstream": urls, "model": TINY_SERVED_NAME, "tokenizer": tiny_model_dir, "store": store_url,
                "port": port, "name": name, "upstream_retries": 1,
                "registry": {"name": NAME, "refresh_s": 0.5}, "replicas": {"health_s": 1.0, "probe_timeout_s": 3.0}}))
            log = tmp_path / f"{name}.log"
            with open(log, "ab") as out:
                procs.append(proc := subprocess.Popen([sys.executable, "-m", "seed_agents.gateway", "--config", str(config)],
                                                      stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path))
            gateways.append(f"http://127.0.0.1:{port}")
            wait_up(gateways[-1], proc, log, "/health")
        traffic = Traffic(gateways)

        # 1. both gateways, sessions crossing between them, on the base model (v0)
        for _ in range(3):
            traffic.session("base")
        assert traffic.versions_since(0) == {0} and not traffic.failed

        # 2. a LoRA version: the loop's serving loads it into both replicas, then it is promoted
        adapter = make_adapter(tiny_model_dir, tmp_path / "adapters" / "v1")
        candidate = registry.add_candidate(NAME, str(adapter))
        serving = VLLMServing(BackendConfig(kind="vllm", model=TINY_SERVED_NAME, base_url=replica_a.url),
                              tokenizer=None, replicas=[replica_b.url])
        served_v1 = serving.load(candidate)
        assert not serving.failed[served_v1]
        registry.promote_manually(NAME, candidate.version, reason="integration test")
        mark = len(traffic.answered)
        traffic.until(lambda: traffic.settled_on(1, mark), "both gateways to serve v1", "promoted")

        # 3. replica b killed mid-traffic: nothing lost; it restarts without the adapter and rejoins
        stop_sending = threading.Event()

        def keep_sending() -> None:
            while not stop_sending.is_set():
                traffic.session("kill")

        senders = [threading.Thread(target=keep_sending) for _ in range(2)]
        for t in senders:
            t.start()
        mark = len(traffic.answered)
        wait_for(lambda: len(traffic.answered) - mark >= 4, "traffic before the kill")
        os.killpg(replica_b._pgid, signal.SIGKILL)  # noqa: SLF001 - kill -9, as a crashed machine would
        killed_at = time.time()
        mark = len(traffic.answered)
        wait_for(lambda: len(traffic.answered) - mark >= 6, "traffic after the kill")
        stop_sending.set()
        for t in senders:
            t.join(300)
        assert not traffic.failed, traffic.failed  # every request of the kill phase was answered
        assert all(not in_rotation(g)[replica_b.url] for g in gateways)
        replica_b.stop()
        replica_b.start()
        b_groups.append(replica_b._pgid)  # noqa: SLF001
        replica_b.wait_ready(timeout=600)
        wait_for(lambda: all(in_rotation(g)[replica_b.url] for g in gateways), "replica b back in both rotations")
        served_b = {m["id"] for m in httpx.get(f"{replica_b.url}/v1/models", timeout=10).json()["data"]}
        assert served_v1 in served_b  # the gateways loaded the promoted adapter into the restarted replica
        mark = len(traffic.answered)
        traffic.until(lambda: len(traffic.answered) - mark >= 8, "traffic after the restart", "restarted")

        # 4. a rollback reaches both replicas
        registry.rollback(NAME, reason="integration test")
        mark = len(traffic.answered)
        traffic.until(lambda: traffic.settled_on(0, mark), "both gateways to serve v0 again", "rolled-back")
        assert not traffic.failed, traffic.failed
    finally:
        for proc in procs:
            stop(proc)
        if traffic is not None:
            traffic.close()

    # no call lost, none stored twice, none stored unanswered; sessions crossed gateways
    by_session: dict[str, list[str]] = {}
    for a in traffic.answered:
        by_session.setdefault(a["session"], []).append(a["call_id"])
    stored = {sid: store.calls(sid) for sid in by_session}
    assert {sid: [c.call_id for c in calls] for sid, calls in stored.items()} == by_session
    assert len(store.sessions()) == len(by_session)
    crossed = {sid for sid in by_session if len({a["gateway"] for a in traffic.answered if a["session"] == sid}) == 2}
    assert len(crossed) >= len(by_session) // 2

    # every stamp is the version its replica served: its logprobs are that version's, on that replica
    names = {0: TINY_SERVED_NAME, 1: served_v1}
    calls = [c for cs in stored.values() for c in cs]
    on_b_after_kill = [c for c in calls if c.scope["replica"] == replica_b.url and c.started_at > killed_at]
    assert on_b_after_kill and {c.scope["replica"] for c in calls} == set(urls)
    backends = {(u, n): VLLMBackend(u, n, max_retries=1) for u in urls for n in names.values()}
    gaps = []
    try:
        for c in calls:
            assert c.scope["upstream_model"] == names[c.policy_version]
            own = backends[(c.scope["replica"], names[c.policy_version])].score(c.prompt_ids, c.completion_ids)
            assert max(abs(a - b) for a, b in zip(own, c.logprobs, strict=True)) < 1e-3, c.call_id
            other = backends[(c.scope["replica"], names[1 - c.policy_version])].score(c.prompt_ids, c.completion_ids)
            gaps.append(max(abs(a - b) for a, b in zip(other, c.logprobs, strict=True)))
    finally:
        for b in backends.values():
            b.close()
        httpx.post(f"{replica_a.url}/v1/unload_lora_adapter", json={"lora_name": served_v1}, timeout=30)
    assert sorted(gaps)[len(gaps) // 2] > 1e-2  # the check can tell the versions apart

    # every process this test started is gone (the session's server is the session's)
    assert all(p.returncode is not None for p in procs)
    replica_b.stop()
    assert all(not group_members(g) for g in b_groups)

    # status sees both gateways, stopped, each with its own drained spool
    rows = {g.name: g for g in store.gateways()}
    assert set(rows) == set(GATEWAYS) and all(g.state["stopped"] and g.state["spool_depth"] == 0 for g in rows.values())
    spools = sorted(p.name for p in (tmp_path / "runs").glob("gateway-spool-*.sqlite"))
    assert spools == [f"gateway-spool-{n}.sqlite" for n in GATEWAYS]
    from seed_agents.observe.data import read_overview
    from seed_agents.observe.status import render_status

    assert "GATEWAYS (2)" in render_status(read_overview(store), store_label="pg", width=200)
    store.close()
