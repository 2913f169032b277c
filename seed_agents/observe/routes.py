"""The watch endpoints on the capture gateway: ``GET /metrics`` and ``GET /dashboard``.

Both sit behind the admin key (the dashboard shows users' text; the metrics name model
versions): Prometheus sends it with ``authorization: {credentials: ...}`` in its scrape
config. A browser cannot add that header, so with keys configured open the static report
(``seed-agents report``) or put an authenticating proxy in front; with no keys at all
(loopback use) both are open like every other gateway route.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import HTMLResponse, Response
from sqlalchemy.exc import SQLAlchemyError

from seed_agents.gateway.errors import GatewayError
from seed_agents.observe.metrics import GatewayMetrics, HttpMetricsMiddleware
from seed_agents.observe.report import CSP, MAX_PAGE_SESSIONS, build_report
from seed_agents.store import StoreError, TraceStore


def install(app: FastAPI, metrics: GatewayMetrics, store: TraceStore, dependencies: Sequence[Any]) -> None:
    """Add the two routes (behind ``dependencies``: the admin key check) and the request
    middleware to a gateway app; call before the app starts."""
    app.add_middleware(HttpMetricsMiddleware, metrics=metrics)

    @app.get("/metrics", dependencies=list(dependencies))
    def scrape(request: Request) -> Response:  # a plain def: FastAPI runs it in a worker thread (it reads the store)
        body, content_type = metrics.exposition(request.headers.get("accept"))
        return Response(body, headers={"Content-Type": content_type})

    @app.get("/dashboard", dependencies=list(dependencies))
    def dashboard(sessions: int = Query(50, ge=0, le=MAX_PAGE_SESSIONS)) -> HTMLResponse:
        try:
            html = build_report(store, store_label=f"{store.dialect} trace store", sessions=sessions)
        except (StoreError, SQLAlchemyError):
            raise GatewayError(503, "the trace store cannot be read right now", type="store_unavailable",
                               code="store_error") from None
        return HTMLResponse(html, headers={"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                                           "Cache-Control": "no-store"})
