"""The gateway's Prometheus ``/metrics``: traffic, tokens, errors, latency, feedback, versions.

Two kinds of numbers, both in the text exposition format of ``prometheus_client``:

- This gateway process (reset on restart, as Prometheus counters are): HTTP requests by
  route template and status, their duration (for a stream: until its last byte), chat
  calls stored and their prompt/completion tokens and model latency by policy version,
  calls spooled during a store outage and flushed after it, and the spool's depth now,
  feedback and error counters (from the gateway's own ``stats``, the counts
  ``/v1/admin/stats`` shows), and the version this gateway serves right now.
- The trace store, read at scrape time (a few short reads; shared by every gateway and the
  continual loop): the promoted version per model name, versions by status, decisions by
  action and actor, rewards by source, queue lengths. When the store cannot be read, the
  scrape still answers, with ``seed_store_up 0`` and no store series.

Each app has its own ``CollectorRegistry`` (no process-global state), so several gateways
in one process, as in tests, do not collide.
"""

from __future__ import annotations

import logging
import time
from collections import Counter as Tally
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector
from sqlalchemy.exc import SQLAlchemyError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from seed_agents.gateway.config import StoreOutageConfig
from seed_agents.gateway.recording import Recorder
from seed_agents.gateway.replicas import ReplicaSet
from seed_agents.gateway.spool import SpoolEntry
from seed_agents.observe.data import decision_counts, queue_lengths, reward_counts
from seed_agents.store import StoreError, TraceStore
from seed_agents.types import LLMCall

log = logging.getLogger("seed_agents.gateway")

LATENCY_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Seconds: from a GPU-served call, well under a second, to a CPU-served one, several seconds."""

FEEDBACK_EVENTS = {"rewards_stored": "reward", "sessions_ended": "session_end", "verifier_rewards": "verifier_reward",
                   "judge_runs": "judge_run"}
"""Gateway stats key -> ``seed_gateway_feedback_total{kind}``."""

ERROR_EVENTS = {"store_errors": "store", "spool_errors": "spool", "spool_rejected": "spool_rejected",
                "verifier_errors": "verifier", "judge_failures": "judge",
                "policy_refresh_errors": "policy_refresh", "policy_not_served": "policy_not_served",
                "streams_not_stored": "stream_not_stored", "http_500": "internal", "http_502": "upstream",
                "http_503": "upstream", "http_504": "upstream_timeout"}
"""Gateway stats key -> ``seed_gateway_errors_total{kind}`` (client errors, 4xx, are in the
request counter's ``status`` label, not here: they are the client's fault, not ours)."""


class GatewayMetrics:
    """The metrics of one gateway app; ``observe_call`` is fed by ``MeteredRecorder``."""

    def __init__(self, store: TraceStore, upstream: ReplicaSet, stats: Tally[str]) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("seed_gateway_http_requests", "HTTP requests answered, by route template and status.",
                                ["method", "route", "status"], registry=r)
        self.duration = Histogram("seed_gateway_http_request_duration_seconds",
                                  "Time to answer a request (a stream: until its last byte), by route template.",
                                  ["route"], buckets=LATENCY_BUCKETS, registry=r)
        self.calls = Counter("seed_gateway_calls", "Chat calls stored in the trace store, by policy version.",
                             ["policy_version"], registry=r)
        self.tokens = Counter("seed_gateway_tokens", "Tokens of stored chat calls, by kind and policy version.",
                              ["kind", "policy_version"], registry=r)
        self.model_latency = Histogram("seed_gateway_model_call_seconds",
                                       "Model latency of stored chat calls (request start to last token).",
                                       buckets=LATENCY_BUCKETS, registry=r)
        self.spooled = Counter("seed_gateway_spooled_calls",
                               "Chat calls answered while the trace store was down, kept in the local spool.", registry=r)
        self.flushed = Counter("seed_gateway_spool_flushed_calls",
                               "Spooled chat calls written to the trace store after it came back.", registry=r)
        self.spool_depth = Gauge("seed_gateway_spool_depth", "Chat calls waiting in the local spool for the trace store.",
                                 registry=r)
        r.register(_GatewayState(stats, upstream))
        r.register(_StoreState(store))

    def observe_call(self, call: LLMCall) -> None:
        version = str(call.policy_version)
        self.calls.labels(version).inc()
        self.tokens.labels("prompt", version).inc(len(call.prompt_ids))
        self.tokens.labels("completion", version).inc(len(call.completion_ids))
        self.model_latency.observe(call.latency_s)

    def observe_request(self, method: str, route: str, status: int, seconds: float) -> None:
        self.requests.labels(method, route, str(status)).inc()
        self.duration.labels(route).observe(seconds)

    def exposition(self, accept: str | None) -> tuple[bytes, str]:
        """The scrape body and its content type, in the format the scraper's ``Accept``
        asks for (Prometheus text, or OpenMetrics), negotiated by ``prometheus_client``."""
        encode, content_type = choose_encoder(accept or "")
        return encode(self.registry), content_type


class MeteredRecorder(Recorder):
    """The gateway's ``Recorder``, counting every call it stored (tokens, latency, version),
    spooled and flushed, and showing the spool's depth."""

    def __init__(self, store: TraceStore, renderer: Any, redactor: Any, stats: Tally[str], metrics: GatewayMetrics,
                 outage: StoreOutageConfig | None = None, *, gateway: str | None = None) -> None:
        super().__init__(store, renderer, redactor, stats, outage, gateway=gateway)
        self.metrics = metrics
        metrics.spool_depth.set_function(lambda: self.spool.depth if self.spool is not None else 0)

    def stored(self, entry: SpoolEntry, *, flushed: bool) -> None:
        super().stored(entry, flushed=flushed)
        self.metrics.observe_call(entry.call)
        if flushed:
            self.metrics.flushed.inc()

    def spooled(self, entry: SpoolEntry) -> None:
        super().spooled(entry)
        self.metrics.spooled.inc()


class _GatewayState(Collector):
    """This process's counters (``Gateway.stats``) and what it serves, read at scrape time."""

    def __init__(self, stats: Tally[str], upstream: ReplicaSet) -> None:
        self.stats = stats
        self.upstream = upstream

    def collect(self) -> Iterator[Metric]:
        stats = dict(self.stats)
        feedback = CounterMetricFamily("seed_gateway_feedback", "Feedback handled by this gateway, by kind.", labels=["kind"])
        for key, kind in FEEDBACK_EVENTS.items():
            feedback.add_metric([kind], stats.get(key, 0))
        yield feedback
        errors = CounterMetricFamily("seed_gateway_errors", "Failures on the gateway's side, by kind.", labels=["kind"])
        by_kind: Tally[str] = Tally()
        for key, kind in ERROR_EVENTS.items():
            by_kind[kind] += stats.get(key, 0)
        for kind, n in sorted(by_kind.items()):
            errors.add_metric([kind], n)
        yield errors
        events = CounterMetricFamily("seed_gateway_events", "Every counter of /v1/admin/stats, by name.", labels=["event"])
        for key, n in sorted(stats.items()):
            events.add_metric([key], n)
        yield events
        serving = GaugeMetricFamily("seed_gateway_serving_policy_version",
                                    "The policy version this gateway sends new requests to.", labels=["upstream_model"])
        serving.add_metric([str(self.upstream.model)], self.upstream.policy_version)
        yield serving
        rotation = GaugeMetricFamily("seed_gateway_replica_in_rotation",
                                     "1 while the upstream replica serves the current version and gets requests.",
                                     labels=["replica"])
        busy = GaugeMetricFamily("seed_gateway_replica_in_flight", "Requests this gateway has in flight at the replica.",
                                 labels=["replica"])
        for replica in self.upstream.state():
            rotation.add_metric([replica["url"]], int(replica["in_rotation"]))
            busy.add_metric([replica["url"]], replica["in_flight"])
        yield rotation
        yield busy


class _StoreState(Collector):
    """The trace store's state, read at scrape time (one failure: ``seed_store_up 0``)."""

    def __init__(self, store: TraceStore) -> None:
        self.store = store

    def collect(self) -> Iterator[Metric]:
        t0 = time.perf_counter()
        try:
            versions = self.store.model_versions()
            decisions = decision_counts(self.store)
            rewards = reward_counts(self.store)
            queues = queue_lengths(self.store)
        except (StoreError, SQLAlchemyError) as e:
            log.warning("/metrics: cannot read the trace store: %s", (str(e).splitlines() or [type(e).__name__])[0][:300])
            yield GaugeMetricFamily("seed_store_up", "1 when the trace store could be read for this scrape.", value=0)
            return
        yield GaugeMetricFamily("seed_store_up", "1 when the trace store could be read for this scrape.", value=1)
        yield GaugeMetricFamily("seed_store_scrape_seconds", "Time to read the store's metrics.",
                                value=time.perf_counter() - t0)
        promoted = GaugeMetricFamily("seed_model_promoted_version", "The promoted (serving) version per model name.",
                                     labels=["name"])
        by_status: Tally[tuple[str, str]] = Tally()
        for v in versions:
            by_status[(v.name, v.status)] += 1
            if v.status == "promoted":
                promoted.add_metric([v.name], v.version)
        yield promoted
        yield _gauge("seed_model_versions", "Model versions by name and status.", ["name", "status"], by_status)
        yield _gauge("seed_store_decisions", "Stored version decisions by model name, action and actor.",
                     ["name", "action", "actor"], decisions)
        yield _gauge("seed_store_rewards", "Rewards stored, by source.", ["source"], {(k,): n for k, n in rewards.items()})
        yield _gauge("seed_store_queue_length", "Work waiting, per queue (see seed_agents.observe.data.QUEUES).",
                     ["queue"], {(k,): n for k, n in queues.items()})


def _gauge(name: str, doc: str, labels: list[str], values: dict[tuple[str, ...], int]) -> GaugeMetricFamily:
    family = GaugeMetricFamily(name, doc, labels=labels)
    for key, n in sorted(values.items()):
        family.add_metric(list(key), n)
    return family


class HttpMetricsMiddleware:
    """Counts and times every HTTP request by route template (bounded labels: a session id
    in the path does not make a new series). A pure ASGI middleware, so a stream is timed
    to its last byte and an exception that escapes the app counts as a 500."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()
        status = 500

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, send_and_note)
        finally:
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.observe_request(scope.get("method", "?"), route, status, time.perf_counter() - t0)

