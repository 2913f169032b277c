"""From an OpenAPI 3 document to typed operations: what ``seed_agents.tools.openapi`` turns
into LangChain tools.

``load_spec`` reads the document (a dict, a JSON/YAML file, or an http(s) URL on an allowed
host); ``operations`` walks its paths and builds, per operation, a pydantic model of the
arguments (path, query, header and body parameters, ``$ref``s resolved, names made into
identifiers) that the tool's schema and the model's grammar come from. Pure reading of the
spec: nothing here sends a request to the API itself.

A spec is input, and it can be hostile or broken: a field of the wrong type, a ``$ref`` to
nowhere or to itself, a YAML alias bomb, a document of gigabytes, a server that drips it a
byte at a time. Every such spec ends in one ``SpecError`` (a ``UserError``: one line naming
the place in the spec), never another exception and never a hang: the document is bounded
(``MAX_SPEC_BYTES``, ``MAX_SPEC_NODES``: ``openapi_source``; ``MAX_TOOLS``), the fetch has a total deadline,
every node the tools read is checked against the shape they expect (the ``_...Shape``
types) before it is used, a schema used in many places is built once, and the work is
bounded (``MAX_SCHEMA_STEPS``). An operation that is fine but cannot be a tool (a body
that is not JSON, a schema too deep or too big to show a model: ``MAX_SCHEMA_DEPTH``,
``MAX_TOOL_SCHEMA_NODES``) is skipped with a warning. ``tests/unit/test_openapi_hostile_spec.py``
fuzzes this with generated specs.
"""

from __future__ import annotations

import json
import keyword
import logging
import math
import re
import reprlib
from collections import Counter
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal, Required, Union
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, TypeAdapter, ValidationError, create_model
from pydantic_core import SchemaError
from typing_extensions import TypedDict  # pydantic reads typing.TypedDict only on Python 3.12+

from seed_agents.tools.openapi_source import MAX_SPEC_BYTES, SpecError, Transport, read_spec, where_of

log = logging.getLogger("seed_agents.tools.openapi")

READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")

MAX_TOOLS = 512
"""Most operations made into tools without ``allow_operations``: more than any model can
choose among (APIs cap a request's tools lower still), and each costs a pydantic model."""
MAX_SCHEMA_DEPTH = 48
"""Deepest nesting of one tool's schema, ``$ref``s followed (recursion stops at ``dict``);
an operation past it is skipped, with a warning."""
MAX_TOOL_SCHEMA_NODES = 10_000
"""Largest schema of one tool, counted with every ``$ref`` inlined as LangChain binds it
(hundreds of KB of JSON in every prompt); an operation past it is skipped, with a warning.
Refs that reuse each other (A is [B, B], B is [C, C], ...) would otherwise grow a schema
as 2**depth."""
MAX_SCHEMA_STEPS = 200_000
"""Most schema nodes built for one spec's tools (each shared schema built once)."""


class _Unusable(Exception):
    """An operation that cannot be a tool (the message says why): skipped, with a warning."""


def load_spec(source: dict[str, Any] | str | Path, *, allow_hosts: Sequence[str] = (), transport: Transport | None = None,
              timeout_s: float = 10.0, max_bytes: int = MAX_SPEC_BYTES) -> dict[str, Any]:
    """An OpenAPI 3 document from a dict, a file (JSON or YAML) or an http(s) URL whose host
    is in ``allow_hosts``, fetched within ``timeout_s`` in all (redirects are not followed;
    ``openapi_source.read_spec``). Raises ``SpecError`` when it cannot be read or is not an
    OpenAPI 3 document."""
    spec = read_spec(source, allow_hosts=allow_hosts, transport=transport, timeout_s=timeout_s, max_bytes=max_bytes)
    if not isinstance(spec, dict) or not str(spec.get("openapi", "")).startswith("3") or not isinstance(spec.get("paths"), dict):
        raise SpecError(f"{where_of(source)} is not an OpenAPI 3 document")
    _check(_DOCUMENT, spec, "document")
    return spec


def _places(spec: Any) -> Counter[str | int]:
    """How many places name each ``$ref``, and hold each object (by ``id``: YAML aliases
    put one object in many places). A shared object's insides count once: it is built once."""
    places: Counter[str | int] = Counter()
    stack = [spec]
    while stack:
        node = stack.pop()
        if not isinstance(node, dict | list):
            continue
        places[id(node)] += 1
        if places[id(node)] > 1:
            continue
        if isinstance(node, dict) and isinstance(ref := node.get("$ref"), str):
            places[ref] += 1
        stack.extend(node.values() if isinstance(node, dict) else node)
    return places


# ------------------------------------------------------------------------- shapes

# What the tools read of each kind of node, and of what type. A node is checked (strictly:
# no coercion) before it is used, so a wrong type is a SpecError naming its place, not a
# TypeError three calls later. Keys the tools do not read are not checked.
_Number = Annotated[float, Field(allow_inf_nan=False)]
_Scalar = str | bool | int | _Number | None  # what a Literal (enum, const) can hold
_Obj = dict[str, Any]
_SchemaShape = TypedDict("_SchemaShape", {
    "$ref": str, "type": str | list[str], "properties": dict[str, _Obj], "required": list[str], "items": _Obj,
    "enum": Annotated[list[_Scalar], Field(min_length=1)], "const": _Scalar,
    "anyOf": list[_Obj], "oneOf": list[_Obj], "allOf": list[_Obj], "nullable": bool, "description": str,
    "minimum": _Number, "maximum": _Number, "exclusiveMinimum": bool | _Number, "exclusiveMaximum": bool | _Number,
    "minLength": Annotated[int, Field(ge=0)], "maxLength": Annotated[int, Field(ge=0)],
    "minItems": Annotated[int, Field(ge=0)], "maxItems": Annotated[int, Field(ge=0)], "pattern": str,
}, total=False)
_ParameterShape = TypedDict("_ParameterShape", {
    "name": Required[str], "in": Required[str], "required": bool, "description": str, "schema": _Obj,
}, total=False)


class _MediaTypeShape(TypedDict, total=False):
    schema: _Obj


class _RequestBodyShape(TypedDict, total=False):
    content: dict[str, _MediaTypeShape]
    required: bool
    description: str


class _OperationShape(TypedDict, total=False):
    operationId: str
    summary: str
    description: str
    parameters: list[_Obj]
    requestBody: _Obj


class _PathItemShape(TypedDict, total=False):
    parameters: list[_Obj]
    get: _Obj
    put: _Obj
    post: _Obj
    delete: _Obj
    patch: _Obj
    head: _Obj
    options: _Obj


class _DocumentShape(TypedDict):
    paths: dict[Annotated[str, Field(pattern=r"^(/|x-)")], _Obj]  # a path, or an extension (x-...)


_SCHEMA, _PARAMETER, _REQUEST_BODY, _OPERATION, _PATH_ITEM, _DOCUMENT = (
    TypeAdapter(t) for t in (_SchemaShape, _ParameterShape, _RequestBodyShape, _OperationShape, _PathItemShape, _DocumentShape))


def _check(shape: TypeAdapter[Any], node: Any, where: str) -> dict[str, Any]:
    """``node`` as it is, once it has ``shape``; else a SpecError naming the first wrong field."""
    try:
        shape.validate_python(node, strict=True)
    except ValidationError as e:
        first = e.errors(include_url=False)[0]
        place = ".".join([where, *(str(x) for x in first["loc"])])
        more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise SpecError(f"the spec's {place} is invalid: {first['msg']}{more}") from None
    return node


# ------------------------------------------------------------------------ schemas


class _Schemas:
    """OpenAPI schemas -> Python annotations for pydantic, with local ``$ref``s resolved.

    A schema that refers to itself stops at ``dict`` one level down (no infinite models).
    A schema used in several places (named by a ``$ref``, or one object shared through YAML
    aliases) is built once. Where a tool is bound, though, LangChain inlines every ``$ref``
    of its schema, so schemas that reuse each other (A is [B, B], B is [C, C], ...) would
    be 2**depth nodes long: ``expanded`` counts a tool's schema as it will be shown, and an
    operation past ``MAX_TOOL_SCHEMA_NODES`` (or ``MAX_SCHEMA_DEPTH``) is skipped. ``where``
    names the node for error messages (an operation and its fields, or a ``$ref``)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self._places = _places(spec)
        self._built: dict[str | int, Any] = {}  # by $ref, or by id() of a shared schema object
        self._size: dict[str | int, int] = {}  # each one's nodes, inlined
        self._building: set[str | int] = set()
        self._depth = 0
        self._steps = 0
        self.expanded = 0  # nodes of the current operation's schema, every $ref inlined

    def resolve(self, node: dict[str, Any], where: str, shape: TypeAdapter[Any] = _SCHEMA) -> dict[str, Any]:
        """``node`` with its ``$ref`` chain followed, checked against ``shape``."""
        for _ in range(32):
            ref = node.get("$ref")
            if not isinstance(ref, str):
                return _check(shape, node, where)
            node, where = self._target(ref, where), ref
        raise SpecError(f"the spec's {where}: a $ref chain longer than 32 hops (or a loop)")

    def _target(self, ref: str, where: str) -> dict[str, Any]:
        if not ref.startswith("#/"):
            raise SpecError(f"the spec's {where}: only local $refs (#/...) are supported, got {ref!r}")
        target: Any = self.spec
        for part in ref[2:].split("/"):
            key = unquote(part).replace("~1", "/").replace("~0", "~")  # a URI fragment holding a JSON pointer
            if not isinstance(target, dict) or key not in target:
                raise SpecError(f"the spec's {where}: unresolvable $ref {ref!r}")
            target = target[key]
        if not isinstance(target, dict):
            raise SpecError(f"the spec's {where}: $ref {ref!r} points at a {type(target).__name__}, not an object")
        return target

    def annotation(self, schema: dict[str, Any], hint: str, where: str) -> Any:
        if self._depth >= MAX_SCHEMA_DEPTH:
            raise _Unusable(f"its schema nests deeper than {MAX_SCHEMA_DEPTH} levels, at {where}")
        self._steps += 1
        if self._steps > MAX_SCHEMA_STEPS:
            raise SpecError(f"the spec's schemas hold more than {MAX_SCHEMA_STEPS} nodes to build (at {where}); "
                            "list the operations to use in allow_operations")
        self._depth += 1
        self._grow(1)
        try:
            return self._annotation(schema, hint, where)
        finally:
            self._depth -= 1

    def _annotation(self, schema: dict[str, Any], hint: str, where: str) -> Any:
        ref = schema.get("$ref")
        key = ref if isinstance(ref, str) else id(schema) if self._places[id(schema)] > 1 else None
        if key is None:
            return self._build(schema, hint, where)
        if key in self._built:
            self._grow(self._size[key])
            return self._built[key]
        if key in self._building:
            return dict[str, Any]
        self._building.add(key)
        before = self.expanded
        try:
            if isinstance(ref, str):
                built = self.annotation(self.resolve(schema, where), _identifier(ref.rsplit("/", 1)[-1]), ref)
            else:
                built = self._build(schema, hint, where)
        finally:
            self._building.discard(key)
        self._built[key], self._size[key] = built, self.expanded - before
        return built

    def _grow(self, nodes: int) -> None:
        self.expanded += nodes
        if self.expanded > MAX_TOOL_SCHEMA_NODES:
            raise _Unusable(f"its schema is over {MAX_TOOL_SCHEMA_NODES} nodes with every $ref inlined (as LangChain binds it)")

    def _build(self, schema: dict[str, Any], hint: str, where: str) -> Any:
        schema = _check(_SCHEMA, schema, where)
        if "enum" in schema:
            return _nullable(Literal[tuple(schema["enum"])], schema)
        if "const" in schema:
            return Literal[schema["const"]]
        for combo in ("anyOf", "oneOf"):
            if combo in schema:
                subs = [(s, f"{where}.{combo}.{i}") for i, s in enumerate(schema[combo])]
                options = [(s, at) for s, at in subs if self.resolve(s, at).get("type") != "null"]
                kinds = [self.annotation(s, hint, at) for s, at in options] or [Any]
                inner = kinds[0] if len(kinds) == 1 else Union[tuple(kinds)]  # noqa: UP007 (built from a list)
                return inner | None if len(options) < len(subs) else inner
        if "allOf" in schema:
            parts = [self.resolve(s, f"{where}.allOf.{i}") for i, s in enumerate(schema["allOf"])]
            if len(parts) == 1:
                return self.annotation(schema["allOf"][0], hint, f"{where}.allOf.0")
            merged = {"type": "object", "properties": {k: v for p in parts for k, v in p.get("properties", {}).items()},
                      "required": [r for p in parts for r in p.get("required", [])]}
            return self.annotation(merged, hint, where)
        kind = schema.get("type")
        if isinstance(kind, list):  # OpenAPI 3.1: ["string", "null"]
            rest = [k for k in kind if k != "null"]
            one = {k: v for k, v in schema.items() if k != "type"} | ({"type": rest[0]} if len(rest) == 1 else {})
            inner = self.annotation(one, hint, where)
            return inner | None if "null" in kind else inner
        return _nullable(self._typed(kind, schema, hint, where), schema)

    def _typed(self, kind: str | None, schema: dict[str, Any], hint: str, where: str) -> Any:
        if kind == "object" or (kind is None and "properties" in schema):
            return self.model(hint, schema, where) if schema.get("properties") else dict[str, Any]
        base: Any = {"string": str, "integer": int, "number": float, "boolean": bool}.get(kind or "")
        if kind == "array":
            base = list[self.annotation(schema.get("items", {}), f"{hint}_item", f"{where}.items")]  # type: ignore[misc]
        if base is None:
            return Any
        limits = _constraints(kind or "", schema, where)
        return Annotated[base, Field(**limits)] if limits else base

    def model(self, name: str, schema: dict[str, Any], where: str) -> type[BaseModel]:
        """A pydantic model for an object schema, named after its ``$ref`` or ``name``."""
        required = set(schema.get("required", []))
        fields = _fields({p: (s, p in required, None) for p, s in schema.get("properties", {}).items()}, self, name, where)
        return create_model(_identifier(name), __config__=ConfigDict(populate_by_name=True), __doc__=schema.get("description"),
                            **{f: spec for f, (_, spec) in fields.items()})


def _fields(props: dict[str, tuple[dict[str, Any], bool, str | None]], schemas: _Schemas,
            hint: str, where: str) -> dict[str, tuple[str, tuple[Any, Any]]]:
    """``{api_name: (schema, required, description)}`` -> ``{field: (api_name, (annotation, FieldInfo))}``.
    An API name that is not a valid Python name (``page-size``) becomes the field's alias:
    the model sees ``page_size`` (LangChain shows field names), the API gets ``page-size``."""
    taken: set[str] = set()
    out: dict[str, tuple[str, tuple[Any, Any]]] = {}
    for api_name, (raw, required, description) in props.items():
        if api_name == "$ref":  # a property of that name reads as a reference to JSON Schema tools (LangChain's too)
            raise _Unusable(f"it has an argument named '$ref', at {where}")
        field = _unique(_identifier(api_name), taken)
        at = f"{where}.{api_name}"
        target = schemas.resolve(raw, at)
        annotation = schemas.annotation(raw, f"{hint}_{field}", at)
        default = ... if required else _default(target.get("default"), annotation, at)
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


def operations(spec: dict[str, Any], safe_operations: Sequence[str] = (), only: Collection[str] | None = None) -> list[Operation]:
    """Every operation of ``spec`` (a ``load_spec`` document) that can be a tool, in spec
    order; with ``only``, just those operationIds (the others are not built: a big spec costs
    what its allowed tools cost). An operation whose request body is not JSON, or whose
    schema is too big to show a model, is skipped with a warning. Raises ``SpecError`` for a
    malformed operation, duplicate tool names, or a ``safe_operations`` or ``only`` id the
    spec lacks (or skipped)."""
    _check(_DOCUMENT, spec, "document")
    schemas = _Schemas(spec)
    ops: list[Operation] = []
    ids: list[str] = []
    skipped: dict[str, str] = {}
    for path, raw_item in spec["paths"].items():
        if not path.startswith("/"):
            continue
        item = schemas.resolve(raw_item, f"paths.{path}", _PATH_ITEM)
        for method in HTTP_METHODS:
            if method in item:
                op_id = _check(_OPERATION, item[method], f"{method.upper()} {path}").get("operationId") or f"{method}_{path}"
                ids.append(op_id)
                if only is None and len(ids) > MAX_TOOLS:
                    raise SpecError(f"the spec has more than {MAX_TOOLS} operations, more tools than a model can choose "
                                    "among; list the ones to use in allow_operations")
                if only is None or op_id in only:
                    try:
                        ops.append(_operation(schemas, path, method, item, op_id, safe_operations))
                    except _Unusable as why:
                        log.warning("%s: skipped (%s)", op_id, why)
                        skipped[op_id] = str(why)
    names = [o.tool_name for o in ops]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise SpecError(f"operations map to the same tool name: {dupes}")
    if unknown := sorted(set(safe_operations) - set(ids)):
        raise SpecError(f"safe_operations names operations the spec does not have: {unknown}")
    if only is not None and (missing := sorted(set(only) - {o.operation_id for o in ops})):
        if absent := [m for m in missing if m not in ids]:
            raise SpecError(f"allow_operations names operations the spec does not have: {absent}; it has {ids}")
        raise SpecError(f"allow_operations names operations that cannot be tools: "
                        f"{'; '.join(f'{m}: {skipped[m]}' for m in missing)}")
    return ops


def _operation(schemas: _Schemas, path: str, method: str, item: dict[str, Any], op_id: str, safe: Sequence[str]) -> Operation:
    """One operation as a tool; raises ``_Unusable`` for one that cannot be."""
    where = f"{method.upper()} {path}"
    schemas.expanded = 0
    op = item[method]
    tool_name = re.sub(r"[^A-Za-z0-9_-]+", "_", op_id).strip("_")[:64] or "operation"
    listed = [*item.get("parameters", []), *op.get("parameters", [])]
    declared = [schemas.resolve(p, f"{where}.parameters.{i}", _PARAMETER) for i, p in enumerate(listed)]
    by_key = {(p["in"], p["name"]): p for p in declared}  # an operation's parameter overrides its path item's
    props: dict[str, tuple[dict[str, Any], bool, str | None]] = {}
    locations: dict[str, str] = {}
    for (location, name), p in by_key.items():
        if location not in ("path", "query"):
            log.debug("%s: %s parameter %r is not exposed to the model", op_id, location, name)
            continue
        required = location == "path" or bool(p.get("required"))
        props[name] = (p.get("schema", {}), required, p.get("description"))
        locations[name] = location
    body = schemas.resolve(op["requestBody"], f"{where}.requestBody", _REQUEST_BODY) if "requestBody" in op else None
    if body is not None:
        content = body.get("content", {})
        json_type = next((t for t in content if _is_json(t)), None)
        if json_type is None:
            raise _Unusable(f"request body {sorted(content)} is not JSON")
        _add_body(schemas, content[json_type].get("schema", {}), bool(body.get("required")), props, locations,
                  f"{where}.requestBody")
    fields = _fields(props, schemas, tool_name, where)
    params = tuple(Param(f, api, locations[api]) for f, (api, _) in fields.items())  # type: ignore[arg-type]
    try:  # the schema the model is shown: a spec it cannot express fails here, not in the middle of an episode
        args = create_model(f"{tool_name}_args", __config__=ConfigDict(populate_by_name=True, extra="forbid"),
                            **{f: spec for f, (_, spec) in fields.items()})
        args.model_json_schema()
    except (PydanticUserError, SchemaError) as e:
        raise SpecError(f"the spec's {where}: its arguments make no valid schema: {e}") from None
    text = "\n\n".join(t for t in (op.get("summary"), op.get("description")) if t) or f"{method.upper()} {path}"
    mutating = method.upper() not in READ_ONLY_METHODS and op_id not in safe
    return Operation(op_id, tool_name, method.upper(), path, text[:1024], params, args, mutating)


def _is_json(media_type: str) -> bool:
    kind = media_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or kind.endswith("+json")


def _add_body(schemas: _Schemas, raw: dict[str, Any], required: bool, props: dict[str, Any], locations: dict[str, str],
              where: str) -> None:
    """A JSON object body is flattened into top-level arguments (easier for small models);
    a non-object body, or one whose property names clash with a parameter, is one ``body``."""
    schema = schemas.resolve(raw, where)
    names = schema.get("properties") or {}
    if schema.get("type", "object") == "object" and names and not set(names) & set(props):
        needed = set(schema.get("required", []))
        for name, prop in names.items():
            props[name] = (prop, required and name in needed, None)
            locations[name] = "body"
        return
    if "body" in props:
        raise SpecError(f"the spec's {where}: cannot expose the request body as 'body': a parameter already has that name")
    props["body"] = (raw, required, schema.get("description") or "The JSON request body.")
    locations["body"] = "whole_body"


def _constraints(kind: str, schema: dict[str, Any], where: str) -> dict[str, Any]:
    """pydantic ``Field`` limits from the JSON Schema keywords that fit ``kind``."""
    out: dict[str, Any] = {}
    if kind in ("integer", "number"):
        out |= {name: schema[key] for key, name in (("minimum", "ge"), ("maximum", "le")) if key in schema}
        for key, inclusive, name in (("exclusiveMinimum", "ge", "gt"), ("exclusiveMaximum", "le", "lt")):
            value = schema.get(key)
            if value is True and inclusive in out:  # OpenAPI 3.0: a flag on minimum / maximum
                out[name] = out.pop(inclusive)
            elif value is not None and not isinstance(value, bool):  # 3.1: the bound itself
                out[name] = value
        if kind == "integer":  # pydantic takes whole bounds only: the same limits on whole numbers
            out = {k: (math.ceil(v) if k in ("ge", "lt") else math.floor(v)) if isinstance(v, float) else v for k, v in out.items()}
    elif kind in ("string", "array"):
        low, high = ("minLength", "maxLength") if kind == "string" else ("minItems", "maxItems")
        out |= {name: schema[key] for key, name in ((low, "min_length"), (high, "max_length")) if key in schema}
        if kind == "string" and "pattern" in schema:
            if _compiles(schema["pattern"]):
                out["pattern"] = schema["pattern"]
            else:  # e.g. a lookahead: pydantic's regex engine is linear-time (no ReDoS from a hostile spec)
                log.warning("the spec's %s: pattern %r is not supported; arguments are not checked against it", where,
                            schema["pattern"])
    return out


@lru_cache(maxsize=1024)
def _compiles(pattern: str) -> bool:
    try:
        TypeAdapter(Annotated[str, Field(pattern=pattern)])
    except SchemaError:
        return False
    return True


def _default(value: Any, annotation: Any, where: str) -> Any:
    """The spec's default as plain JSON of the field's type (what the model is shown and the
    API is sent), or None. Not one that holds a ``$ref`` key (pydantic would read it as a
    reference of its own, and fail), nests over 32 deep (its schema writer recurses), is no
    JSON (NaN) or does not validate, strictly, as the field (``8.0`` for an integer)."""
    if value is None:
        return None
    stack = [(value, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > 32 or (isinstance(node, dict) and "$ref" in node):
            break
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children)
    else:
        try:
            text = json.dumps(value, default=str, allow_nan=False)  # a YAML date becomes its text
            TypeAdapter(annotation).validate_json(text, strict=True)
            return json.loads(text)
        except (ValueError, TypeError, SchemaError):  # ValidationError is a ValueError
            pass
    log.warning("the spec's %s: its default %s is ignored (not plain JSON of the field's type)", where, reprlib.repr(value))
    return None


def _nullable(annotation: Any, schema: dict[str, Any]) -> Any:
    return annotation | None if schema.get("nullable") is True else annotation


_TAKEN = frozenset({"self", "config", "run_manager"})
"""Argument names LangChain's ``StructuredTool._run(self, *args, config, run_manager, **kwargs)``
takes for itself: an API argument of that name would crash the call ("self") or be dropped
(the others). tests/unit/test_openapi_hostile.py checks this against LangChain's signature."""


def _identifier(name: str) -> str:
    """A valid pydantic field / model name for an API name (its alias keeps the API's spelling)."""
    out = re.sub(r"\W", "_", name).strip("_") or "field"
    if out[0].isdigit():
        out = "f_" + out
    if keyword.iskeyword(out) or out in dir(BaseModel) or out.startswith("model_") or out in _TAKEN:
        out += "_"
    return out


def _unique(name: str, taken: set[str]) -> str:
    out, n = name, 2
    while out in taken:
        out, n = f"{name}_{n}", n + 1
    taken.add(out)
    return out
