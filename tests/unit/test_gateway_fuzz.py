"""Hostile input, generated: the gateway's HTTP API fuzzed from its own OpenAPI document.

Schemathesis (on Hypothesis) draws requests that fit the documented schema and requests
that break it (wrong types, missing fields, odd headers and path ids) for every operation,
and sends them to the in-process ASGI app in front of the fake upstream. Every reply must
be a documented status, never a 500; every 4xx must carry the OpenAI error body; and a
refused request must leave the store exactly as it was (rows counted before and after).
The example budget is fixed and the generation is derandomized, so a run is repeatable and
bounded (about 20 s for the open gateway, 10 s for the keyed one, on 2 quiet cores).
A longer random hunt is the same code with bigger budgets and ``derandomize=False``.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance, response_schema_conformance, status_code_conformance

from seed_agents.gateway.app import build_app
from seed_agents.gateway.config import GatewayConfig
from seed_agents.gateway.openapi import openapi_schema
from seed_agents.gateway.testing import FakeVLLM
from seed_agents.gateway.upstream import Upstream
from seed_agents.store import TraceStore

MODEL = "tiny"
EXAMPLES = {GenerationMode.POSITIVE: 30, GenerationMode.NEGATIVE: 20}  # per operation
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]


def row_counts(db: Path) -> dict[str, int]:
    """Rows per table, read over a connection of our own (what another process would see)."""
    con = sqlite3.connect(db)
    try:
        return {t: con.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("sessions", "calls", "rewards")}
    finally:
        con.close()


def fuzz(app: Any, db: Path, headers: dict[str, str] | None = None, share: float = 1.0) -> dict[int, int]:
    """Fuzz every operation in both modes (``share`` of the example budget); return how
    many replies had each status."""
    doc = openapi_schema(app)
    schema = schemathesis.openapi.from_dict(doc)
    schema.app = app
    seen: dict[int, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        spec = doc["paths"][operation.path][operation.method.lower()]
        for mode, n in EXAMPLES.items():
            constrained = "requestBody" in spec or any(p["schema"] != {"type": "string"} for p in spec["parameters"])
            if mode is GenerationMode.NEGATIVE and not constrained:
                continue  # nothing to break: any string is a valid free-text id

            @settings(max_examples=max(1, round(n * share)), deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def one(case: Any) -> None:
                before = row_counts(db)
                response = case.call(headers=headers)
                seen[response.status_code] = seen.get(response.status_code, 0) + 1
                case.validate_response(response, checks=CHECKS, headers=headers)
                if response.status_code >= 400:
                    error = response.json()["error"]
                    assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str)
                    assert row_counts(db) == before, f"{case.method} {case.path} -> {response.status_code} changed the store"

            one()
    return seen


@pytest.fixture
def db(tmp_path):
    return tmp_path / "fuzz.db"


@pytest.fixture
def app_for(tokenizer, db):
    stores: list[TraceStore] = []

    def make(**overrides: Any) -> Any:
        stores.append(store := TraceStore.open(f"sqlite:///{db}"))
        fake = FakeVLLM(tokenizer, model=MODEL)
        upstream = Upstream("http://fake", MODEL, transport=fake.transport(), retries=0)
        return build_app(GatewayConfig(upstream="http://fake", model=MODEL, **overrides), store, upstream, tokenizer=tokenizer)

    yield make
    for s in stores:
        s.close()


def test_fuzz_open_gateway(app_for, db):
    seen = fuzz(app_for(), db)
    assert 500 not in seen
    assert seen.get(200, 0) > 0 and seen.get(400, 0) > 0  # the fuzz reached both sides of validation
    assert row_counts(db)["calls"] > 0  # and some generated chats were answered and stored


def test_fuzz_keyed_gateway(app_for, db, monkeypatch):
    monkeypatch.setenv("SEED_GATEWAY_FEEDBACK_KEYS", "feedback-key-123")
    seen = fuzz(app_for(), db, headers={"Authorization": "Bearer feedback-key-123"}, share=0.4)
    assert 500 not in seen and seen.get(403, 0) > 0  # a feedback key reaches chat and admin routes: refused
