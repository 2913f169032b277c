"""The gate's anchor with the parts a deployment has: the real CPU vLLM server (every
version a runtime LoRA adapter, v0 the base model's served name) and a real PostgreSQL
store.

The unit tier runs the anchor on in-process models over SQLite; what only these parts can
break: three versions of one name served side by side by one server during a canary (the
server holds at most ``max_loras`` adapters per batch, the base model is none of them), the
anchor's episodes stored beside the pair's in PostgreSQL, and the decision's evidence read
back from there. Tiny random model: every episode scores 0, so each candidate ties and is
promoted; the verdicts themselves are tested in test_gate.py.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration
pytest.importorskip("trl")

from seed_agents.app.continual import ContinualLoop  # noqa: E402
from seed_agents.store import TraceStore  # noqa: E402
from tests.pg_fixture import PostgresServer, postgres_server  # noqa: E402,F401 - the session fixture
from tests.unit.test_continual_loop import make_config, prod, seed_sessions  # noqa: E402,F401 - prod: a fixture


def served_requests(url: str) -> float:
    """The server's count of finished requests (its Prometheus counter, every label summed)."""
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total"))


def test_the_anchor_plays_as_a_third_adapter_on_vllm_and_its_evidence_lands_in_postgres(
        tmp_path: Path, tiny_model_dir: str, vllm_server, postgres_server: PostgresServer, prod) -> None:  # noqa: F811
    url = postgres_server.new_database()
    backend = {"kind": "vllm", "model": vllm_server.served_model_name, "base_url": vllm_server.url,
               "tokenizer": tiny_model_dir, "weights": tiny_model_dir, "timeout_s": 300, "max_retries": 1}
    cfg = make_config(tmp_path, tiny_model_dir, prod.url, store=url, backend=backend,
                      gate={"min_tasks": 2, "resamples": 200, "anchor_margin": 0.1})
    store = TraceStore.open(cfg.store)
    assert store.dialect == "postgresql"
    seed_sessions(store, 4)
    loop = ContinualLoop(cfg, store=store, log=lambda _: None)
    before = served_requests(vllm_server.url)
    try:
        outcomes = loop.run(cycles=2)
        assert [o.state for o in outcomes] == ["decided", "decided"]
        decisions = sorted((d for d in loop.registry.decisions(cfg.name) if d.actor == "gate"),
                           key=lambda d: d.decision_id)
        assert [d.action for d in decisions] == ["promote", "promote"]
        for d, sides in zip(decisions, ([("candidate", 1), ("promoted", 0)],
                                        [("anchor", 0), ("candidate", 2), ("promoted", 1)])):
            episodes = store.canary_episodes([d.decision_id])
            assert sorted({(e.side, e.version) for e in episodes}) == sides and len(episodes) == 2 * len(sides)
            # played by the server under each version's own served name, none faulted
            assert all(e.fault is None for e in episodes), [e.fault for e in episodes]
            anchor = d.evidence["gate"]["anchor"]
            assert anchor["n_tasks"] == 2 and anchor["n_pairs"] == 2 and "vs the anchor" in d.summary
        canary_calls = sum(e.trace["turns"] for d in decisions for e in store.canary_episodes([d.decision_id]))
        assert canary_calls > 0 and served_requests(vllm_server.url) - before >= canary_calls  # the server played them
        served = {m["id"] for m in httpx.get(f"{vllm_server.url}/v1/models", timeout=10).json()["data"]}
        assert f"{cfg.name}-v2" in served  # the version the gate promoted last serves from the server
        assert prod.log.mutating() == 0
    finally:
        for name in (f"{cfg.name}-v1", f"{cfg.name}-v2"):  # the session's server outlives this test
            httpx.post(f"{vllm_server.url}/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30)
        loop.close()
