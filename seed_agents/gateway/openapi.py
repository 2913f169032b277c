"""The gateway's HTTP contract as an OpenAPI 3.1 document: what clients may send, what comes back.

FastAPI derives the paths and path parameters from the routes, but the gateway reads its
bodies and headers itself (to bound a body's size while reading and to answer every
refusal OpenAI-style), so the routes cannot declare them. This module adds them: request
bodies from the same pydantic models that validate them, the session / task / key
headers, and every status a route answers with, errors in the one shape
``{"error": {"message", "type", "code"}}``. The document is what the property-based tests
fuzz the gateway with (``tests/unit/test_gateway_fuzz.py``); it is not served (the gateway
keeps its surface small), ``openapi_schema(app)`` returns it.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from fastapi import FastAPI

from seed_agents.gateway.feedback import RewardIn
from seed_agents.gateway.render import ChatRequest

ERROR_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["message", "type"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"}, "code": {"type": ["string", "null"]}},
    }},
}

_REASONS = {400: "Bad JSON, schema or header", 401: "Missing or invalid key", 403: "The key's role may not do this",
            404: "Unknown session, model, task or route", 409: "Conflicts with the gateway's or the session's state",
            413: "Body larger than security.max_request_bytes", 429: "Too many requests in flight; retry after Retry-After",
            502: "The upstream failed", 503: "The upstream or the store is unavailable; retry",
            504: "The upstream timed out"}

_KEYED = (401, 403)
_BODY = (400, 413)
#: Error statuses per operation, besides the ones every keyed route has (401, 403).
_ERRORS: dict[tuple[str, str], tuple[int, ...]] = {
    ("post", "/v1/chat/completions"): (*_BODY, 404, 409, 502, 503, 504),
    ("post", "/s/{session_id}/v1/chat/completions"): (*_BODY, 404, 409, 502, 503, 504),
    ("get", "/s/{session_id}/v1/models"): (),
    ("get", "/v1/models"): (),
    ("post", "/v1/sessions/{session_id}/reward"): (*_BODY, 404, 503),
    ("post", "/v1/sessions/{session_id}/end"): (404, 503),
    ("post", "/v1/tasks/{task_key}/judge"): (404, 503),
    ("get", "/v1/admin/sessions/{session_id}"): (404, 503),
    ("get", "/v1/admin/policy"): (),
    ("put", "/v1/admin/policy"): (*_BODY, 409, 502, 503),
    ("get", "/v1/admin/replicas"): (),
    ("get", "/v1/admin/stats"): (),
    ("get", "/metrics"): (503,),
    ("get", "/dashboard"): (400, 503),
}
_DEFAULT_ERRORS = (400, 404, 409, 413, 503)  # a route added without an entry above
_OPEN = {("get", "/health")}  # needs no key
_MEDIA = {("get", "/metrics"): "text/plain", ("get", "/dashboard"): "text/html"}  # 200 bodies that are not JSON

SESSION_ID = {"type": "string", "pattern": r"^[A-Za-z0-9._:-]{1,128}$"}
_CHAT_HEADERS = [
    {"name": "X-Session-Id", "in": "header", "required": False,
     "description": "The session this call belongs to; made and echoed when absent.", "schema": SESSION_ID},
    {"name": "X-Task-Key", "in": "header", "required": False,
     "description": "What the session attempts: `train --from-store` trains the sessions of one key as one "
                    "group, the judge compares them; the continual loop replays each session as a group of its own.",
     "schema": {"type": "string", "minLength": 1, "maxLength": 256}},
]


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_MESSAGE = {
    "type": "object", "required": ["role", "content"],
    "properties": {"role": {"enum": ["system", "user", "assistant", "tool"]}, "content": {"type": ["string", "null"]},
                   "tool_call_id": {"type": "string"}, "name": {"type": "string"}},
}
_TOOL = {
    "type": "object", "required": ["type", "function"],
    "properties": {"type": {"const": "function"}, "function": {
        "type": "object", "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}, "description": {"type": "string"},
                       "parameters": {"type": "object"}}}},
}


def request_bodies(model: str, max_tokens: int) -> dict[tuple[str, str], dict[str, Any]]:
    """The JSON body of each operation that takes one: the pydantic models that validate
    them, with what ``parse_request`` adds (one model name, n = 1, no unknown fields)."""
    from seed_agents.gateway.app import PolicyIn  # app imports the gateway's modules: import it late

    chat = ChatRequest.model_json_schema()
    props = chat["properties"]
    props["model"]["enum"] = [model]  # any other name: 404
    props["messages"]["items"] = _MESSAGE
    props["tools"] = {"anyOf": [{"type": "array", "items": _TOOL}, {"type": "null"}]}
    props["tool_choice"] = {"anyOf": [{"enum": ["auto", "none", "required"]}, {"type": "null"}, {
        "type": "object", "required": ["type", "function"],
        "properties": {"type": {"const": "function"}, "function": {
            "type": "object", "required": ["name"], "properties": {"name": {"type": "string"}}}}}]}
    props["n"] = {"anyOf": [{"const": 1}, {"type": "null"}]}
    for name in ("max_tokens", "max_completion_tokens"):
        props[name] = {"anyOf": [{"type": "integer", "minimum": 1, "maximum": max_tokens}, {"type": "null"}]}
    chat["additionalProperties"] = False  # unknown fields that would change sampling: 400
    return {
        ("post", "/v1/chat/completions"): _json_body(chat),
        ("post", "/s/{session_id}/v1/chat/completions"): _json_body(chat),
        ("post", "/v1/sessions/{session_id}/reward"): _json_body(RewardIn.model_json_schema()),
        ("put", "/v1/admin/policy"): _json_body(PolicyIn.model_json_schema()),
    }


def openapi_schema(app: FastAPI) -> dict[str, Any]:
    """The gateway app's OpenAPI document with bodies, headers and every documented status."""
    doc = copy.deepcopy(app.openapi())
    cfg = app.state.gateway.cfg
    bodies = request_bodies(cfg.model, cfg.max_tokens_limit)
    doc.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    doc["components"]["securitySchemes"] = {
        "bearer": {"type": "http", "scheme": "bearer", "description": "A client, feedback, verifier or admin key."}}
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            key = (method, path)
            params = [p for p in op.get("parameters", []) if p["in"] != "path"]
            params += [{"name": n, "in": "path", "required": True,
                        "schema": SESSION_ID if path.startswith("/s/") else {"type": "string"}}
                       for n in re.findall(r"{(\w+)}", path)]
            if path.endswith("/chat/completions"):  # under /s/{id} the path names the session
                params += _CHAT_HEADERS if path.startswith("/v1/") else _CHAT_HEADERS[1:]
            op["parameters"] = params
            if key in bodies:
                op["requestBody"] = bodies[key]
            responses = {"200": op["responses"].get("200", {"description": "OK"})}
            if key in _MEDIA:
                responses["200"] = {"description": "OK", "content": {_MEDIA[key]: {"schema": {"type": "string"}}}}
            elif path.endswith("/chat/completions"):  # "stream": true answers server-sent events
                responses["200"] = {"description": "A chat.completion, or chat.completion.chunk events ending in [DONE]",
                                    "content": {"application/json": {"schema": {"type": "object"}},
                                                "text/event-stream": {"schema": {}}}}
            errors = set(_ERRORS.get(key, _DEFAULT_ERRORS)) | ({400} if params else set())
            if key not in _OPEN:  # keys are checked, and a full gateway refuses (admission)
                errors |= {*_KEYED, 503}
                op["security"] = [{}, {"bearer": []}]
            for status in sorted(errors):
                responses[str(status)] = {"description": _REASONS[status],
                                          "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
            op["responses"] = responses
    return doc
