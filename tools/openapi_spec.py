"""From an OpenAPI 3 document to typed operations: what ``seed_agents.tools.openapi`` turns
into LangChain tools.

``load_spec`` reads the document (a dict, a JSON/YAML file, or an http(s) URL on an allowed
host); ``operations`` walks its paths and builds, per operation, a pydantic model of the
arguments (path, query, header and body parameters, ``$ref``s resolved, names made into
identifiers) that the tool's schema and the model's grammar come from. Pure reading of the
spec: nothing here sends a request to the API itself.
"""

from __future__ import annotations

import keyword
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Union

import httpx
import yaml
from pydantic import BaseModel, ConfigDict, Field, create_model

log = logging.getLogger("seed_agents.tools.openapi")

READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
Transport = httpx.BaseTransport | httpx.AsyncBaseTransport


def load_spec(source: dict[str, Any] | str | Path, *, allow_hosts: Sequence[str] = (), transport: Transport | None = None,
              timeout_s: float = 10.0) -> dict[str, Any]:
    """An OpenAPI 3 document from a dict, a file (JSON or YAML) or an http(s) URL whose host
    is in ``allow_hosts``. Raises ``ValueError`` when it is not an OpenAPI 3 document."""
    if isinstance(source, dict):
        spec = source
    elif str(source).startswith(("http://", "https://")):
        url = httpx.URL(str(source))
        if url.host.lower() not in {h.lower() for h in allow_hosts}:
            raise ValueError(f"the spec URL's host {url.host!r} is not in allow_hosts {list(allow_hosts)}")
        sync = transport if isinstance(transport, httpx.BaseTransport) else None
        with httpx.Client(transport=sync, timeout=timeout_s) as client:
            response = client.get(url)
            response.raise_for_status()
            spec = yaml.safe_load(response.text)
    else:
        spec = yaml.safe_load(Path(source).read_text())  # YAML is a superset of JSON
    if not isinstance(spec, dict) or not str(spec.get("openapi", "")).startswith("3") or not isinstance(spec.get("paths"), dict):
        where = "the spec" if isinstance(source, dict) else str(source)[:200]
        raise ValueError(f"{where} is not an OpenAPI 3 document")
    return spec


class _Schemas:
    """OpenAPI schemas -> Python annotations for pydantic, with local ``$ref``s resolved.
    A schema that refers to itself stops at ``dict`` one level down (no infinite models)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.models: dict[str, type[BaseModel]] = {}
        self._building: set[str] = set()

    def resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        for _ in range(32):
            ref = node.get("$ref")
            if not isinstance(ref, str):
                return node
            if not ref.startswith("#/"):
                raise ValueError(f"only local $refs are supported, got {ref!r}")
            target: Any = self.spec
            for part in ref[2:].split("/"):
                key = part.replace("~1", "/").replace("~0", "~")  # JSON pointer escapes
                if not isinstance(target, dict) or key not in target:
                    raise ValueError(f"unresolvable $ref {ref!r}")
                target = target[key]
            node = target
        raise ValueError("a $ref chain longer than 32 hops")

    def annotation(self, schema: dict[str, Any], hint: str) -> Any:
        ref = schema.get("$ref")
        if isinstance(ref, str):
            name = _identifier(ref.rsplit("/", 1)[-1])
            if name in self.models:
                return self.models[name]
            if name in self._building:
                return dict[str, Any]
            self._building.add(name)
            try:
                return self.annotation(self.resolve(schema), name)
            finally:
                self._building.discard(name)
        if "enum" in schema:
            return _nullable(Literal[tuple(schema["enum"])], schema)
        if "const" in schema:
            return Literal[schema["const"]]
        for combo in ("anyOf", "oneOf"):
            if combo in schema:
                options = [s for s in schema[combo] if self.resolve(s).get("type") != "null"]
                kinds = [self.annotation(s, hint) for s in options] or [Any]
                inner = kinds[0] if len(kinds) == 1 else Union[tuple(kinds)]  # noqa: UP007 (built from a list)
                return inner | None if len(options) < len(schema[combo]) else inner
        if "allOf" in schema:
            parts = [self.resolve(s) for s in schema["allOf"]]
            if len(parts) == 1:
                return self.annotation(schema["allOf"][0], hint)
            merged = {"type": "object", "properties": {k: v for p in parts for k, v in p.get("properties", {}).items()},
                      "required": [r for p in parts for r in p.get("required", [])]}
            return self.annotation(merged, hint)
        kind = schema.get("type")
        if isinstance(kind, list):  # OpenAPI 3.1: ["string", "null"]
            rest = [k for k in kind if k != "null"]
            inner = self.annotation({**schema, "type": rest[0] if len(rest) == 1 else None}, hint)
            return inner | None if "null" in kind else inner
        return _nullable(self._typed(kind, schema, hint), schema)

    def _typed(self, kind: Any, schema: dict[str, Any], hint: str) -> Any:
        limits = _constraints(schema)
        if kind == "object" or (kind is None and "properties" in schema):
            return self.model(hint, schema) if schema.get("properties") else dict[str, Any]
        base: Any = {"string": str, "integer": int, "number": float, "boolean": bool}.get(kind)
        if kind == "array":
            base = list[self.annotation(schema.get("items", {}), f"{hint}_item")]  # type: ignore[misc]
        if base is None:
            return Any
        return Annotated[base, Field(**limits)] if limits else base

    def model(self, name: str, schema: dict[str, Any]) -> type[BaseModel]:
        """A pydantic model for an object schema; named after its ``$ref`` (reused) or ``name``."""
        name = _identifier(name)
        if name in self.models:
            return self.models[name]
        required = set(schema.get("required", []))
        fields = _fields({p: (s, p in required, None) for p, s in schema.get("properties", {}).items()}, self, name)
        model = create_model(name, __config__=ConfigDict(populate_by_name=True), __doc__=schema.get("description"),
                             **{f: spec for f, (_, spec) in fields.items()})
        self.models[name] = model
        return model


def _fields(props: dict[str, tuple[dict[str, Any], bool, str | None]], schemas: _Schemas,
            hint: str) -> dict[str, tuple[str, tuple[Any, Any]]]:
    """``{api_name: (schema, required, description)}`` -> ``{field: (api_name, (annotation, FieldInfo))}``.
    An API name that is not a valid Python name (``page-size``) becomes the field's alias:
    the model sees ``page_size`` (LangChain shows field names), the API gets ``page-size``."""
    taken: set[str] = set()
    out: dict[str, tuple[str, tuple[Any, Any]]] = {}
    for api_name, (raw, required, description) in props.items():
        field = _unique(_identifier(api_name), taken)
        target = schemas.resolve(raw)
        annotation = schemas.annotation(raw, f"{hint}_{field}")
        default = ... if required else target.get("default")
        if default is None:  # optional without a default: the model may leave it out
            annotation = annotation | None
        info = Field(default, alias=api_name if field != api_name else None,
                     description=description or target.get("description"))
        out[field] = (api_name, (annotation, info))
    return out


@dataclass(frozen=True)
class Param:
    """One argument of a tool: where it goes in the request and under which API name."""

    field: str  # in the args schema
    name: str  # as the API spells it
    location: Literal["path", "query", "body", "whole_body"]  # body: one property of a flattened JSON body


@dataclass(frozen=True)
class Operation:
    """One OpenAPI operation, ready to become a tool."""

    operation_id: str
    tool_name: str
    method: str
    path: str
    description: str
    params: tuple[Param, ...]
    args_schema: type[BaseModel]
    mutating: bool

    def metadata(self) -> dict[str, Any]:
        return {"operation_id": self.operation_id, "method": self.method, "path": self.path, "mutating": self.mutating}


def operations(spec: dict[str, Any], safe_operations: Sequence[str] = ()) -> list[Operation]:
    """Every operation of ``spec`` with a JSON (or no) request body, in spec order.
    Raises ``ValueError`` for duplicate tool names or a ``safe_operations`` id the spec lacks."""
    schemas = _Schemas(spec)
    ops: list[Operation] = []
    for path, item in spec["paths"].items():
        item = schemas.resolve(item)
        for method in HTTP_METHODS:
            if method in item:
                op = _operation(schemas, path, method, item, safe_operations)
                if op is not None:
                    ops.append(op)
    names = [o.tool_name for o in ops]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise ValueError(f"operations map to the same tool name: {dupes}")
    if unknown := sorted(set(safe_operations) - {o.operation_id for o in ops}):
        raise ValueError(f"safe_operations names operations the spec does not have: {unknown}")
    return ops


def _operation(schemas: _Schemas, path: str, method: str, item: dict[str, Any], safe: Sequence[str]) -> Operation | None:
    op = item[method]
    op_id = str(op.get("operationId") or f"{method}_{path}")
    tool_name = re.sub(r"[^A-Za-z0-9_-]+", "_", op_id).strip("_")[:64] or "operation"
    declared = [schemas.resolve(p) for p in [*item.get("parameters", []), *op.get("parameters", [])]]
    by_key = {(p["in"], p["name"]): p for p in declared}  # an operation's parameter overrides its path item's
    props: dict[str, tuple[dict[str, Any], bool, str | None]] = {}
    locations: dict[str, str] = {}
    for (where, name), p in by_key.items():
        if where not in ("path", "query"):
            log.debug("%s: %s parameter %r is not exposed to the model", op_id, where, name)
            continue
        required = where == "path" or bool(p.get("required"))
        props[name] = (p.get("schema", {}), required, p.get("description"))
        locations[name] = where
    body = schemas.resolve(op["requestBody"]) if "requestBody" in op else None
    if body is not None:
        content = body.get("content", {})
        json_type = next((t for t in content if t == "application/json" or t.endswith("+json")), None)
        if json_type is None:
            log.warning("%s: skipped (request body %s is not JSON)", op_id, sorted(content))
            return None
        _add_body(schemas, content[json_type].get("schema", {}), bool(body.get("required")), props, locations)
    fields = _fields(props, schemas, tool_name)
    params = tuple(Param(f, api, locations[api]) for f, (api, _) in fields.items())  # type: ignore[arg-type]
    args = create_model(f"{tool_name}_args", __config__=ConfigDict(populate_by_name=True, extra="forbid"),
                        **{f: spec for f, (_, spec) in fields.items()})
    text = "\n\n".join(t for t in (op.get("summary"), op.get("description")) if t) or f"{method.upper()} {path}"
    mutating = method.upper() not in READ_ONLY_METHODS and op_id not in safe
    return Operation(op_id, tool_name, method.upper(), path, text[:1024], params, args, mutating)


def _add_body(schemas: _Schemas, raw: dict[str, Any], required: bool, props: dict[str, Any], locations: dict[str, str]) -> None:
    """A JSON object body is flattened into top-level arguments (easier for small models);
    a non-object body, or one whose property names clash with a parameter, is one ``body``."""
    schema = schemas.resolve(raw)
    names = schema.get("properties") or {}
    if schema.get("type", "object") == "object" and names and not set(names) & set(props):
        needed = set(schema.get("required", []))
        for name, prop in names.items():
            props[name] = (prop, required and name in needed, None)
            locations[name] = "body"
        return
    if "body" in props:
        raise ValueError("cannot expose the request body as 'body': a parameter already has that name")
    props["body"] = (raw, required, schema.get("description") or "The JSON request body.")
    locations["body"] = "whole_body"


def _constraints(schema: dict[str, Any]) -> dict[str, Any]:
    names = {"minimum": "ge", "maximum": "le", "minLength": "min_length", "maxLength": "max_length",
             "minItems": "min_length", "maxItems": "max_length", "pattern": "pattern"}
    out = {names[k]: v for k, v in schema.items() if k in names}
    for key, name in (("exclusiveMinimum", "gt"), ("exclusiveMaximum", "lt")):
        if isinstance(schema.get(key), (int, float)) and not isinstance(schema.get(key), bool):  # 3.1 style
            out[name] = schema[key]
    return out


def _nullable(annotation: Any, schema: dict[str, Any]) -> Any:
    return annotation | None if schema.get("nullable") is True else annotation


def _identifier(name: str) -> str:
    """A valid pydantic field / model name for an API name."""
    out = re.sub(r"\W", "_", name).strip("_") or "field"
    if out[0].isdigit():
        out = "f_" + out
    if keyword.iskeyword(out) or out in dir(BaseModel) or out.startswith("model_"):
        out += "_"
    return out


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 2
    while out in taken:
        out, n = f"{name}_{n}", n + 1
    taken.add(out)
    return out
