"""Why a default is what it is: the learning result that chose it, kept next to the field.

A field whose default a learning run decided carries ``json_schema_extra=because(why,
evidence)``: one sentence, and the anchor of the result in docs/results.md. A section whose
command sets its own default for a field of a shared type (``train``'s sampling temperature;
``SamplingParams`` is also the serving type) carries ``json_schema_extra={"defaults": {field:
because(...)}}``. From these, ``reasons`` lists a command's evidence-backed defaults: the
help line of each flag ends with its reason (``seed_agents.app.flags``) and the table in
docs/training.md is generated from them (``scripts/defaults_table.py``), so neither can drift
from the models.
"""

from __future__ import annotations

import typing
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

__all__ = ["Reason", "because", "default_at", "reasons"]


def because(why: str, evidence: str) -> dict[str, str]:
    """``json_schema_extra`` of a default a learning run chose: ``why`` in one sentence, and
    ``evidence``, the result as a link relative to docs/ (``results.md#anchor``)."""
    return {"why": why, "evidence": evidence}


@dataclass(frozen=True)
class Reason:
    """An evidence-backed default of a command: its dotted path, its value, why, the result."""

    path: str
    default: Any
    why: str
    evidence: str


def _section(annotation: Any) -> type[BaseModel] | None:
    """The config model a field's annotation holds (``X`` or ``X | None``), if any."""
    return next((a for a in (annotation, *typing.get_args(annotation))
                 if isinstance(a, type) and issubclass(a, BaseModel)), None)


def default_at(model: type[BaseModel] | None, path: str) -> Any:
    """The command's default of the field at dotted ``path``: the value its section's default
    holds, else the field's own default (factories called); None where there is none."""
    value: Any = None
    for name in path.split("."):
        field = model.model_fields.get(name) if model is not None else None
        if field is None:
            return None
        value = getattr(value, name) if isinstance(value, BaseModel) else field.get_default(call_default_factory=True)
        model = _section(field.annotation)
    return value


def reasons(model: type[BaseModel]) -> list[Reason]:
    """Every evidence-backed default of ``model``'s command, in field order, sections walked
    where the command has a default for them. A field's reason argues for its own default, so
    it is left out where the command sets another value (the continual loop's learning rate)."""
    found: list[Reason] = []

    def walk(section: type[BaseModel], prefix: str) -> None:
        for name, field in section.model_fields.items():
            path = f"{prefix}{name}"
            extra = field.json_schema_extra if isinstance(field.json_schema_extra, dict) else {}
            value = default_at(model, path)
            if "why" in extra and value == field.get_default(call_default_factory=True):
                found.append(Reason(path, value, str(extra["why"]), str(extra["evidence"])))
            for sub, reason in dict(extra.get("defaults") or {}).items():  # type: ignore[arg-type]
                found.append(Reason(f"{path}.{sub}", default_at(model, f"{path}.{sub}"), reason["why"], reason["evidence"]))
            inner = _section(field.annotation)
            if inner is not None and isinstance(value, BaseModel):
                walk(inner, f"{path}.")

    walk(model, "")
    return found
