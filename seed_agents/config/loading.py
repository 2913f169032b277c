"""Loading a config: defaults < preset < YAML file < flags, and one line for whatever is wrong.

Every command's config goes through ``load_config``; a problem becomes one ``ConfigError``
naming the field, the value and the fix (with a "did you mean" for a misspelt key), never
pydantic's multi-line report.
"""

from __future__ import annotations

import copy

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from seed_agents.errors import ConfigError

__all__ = ["RenamedConfigKey", "first_error", "load_config", "validation_message"]


class RenamedConfigKey(FutureWarning):
    """A config key that still loads under its old name; the CLI shows it as one line."""



def validation_message(err: ValidationError, source: str = "config", model: type[BaseModel] | None = None) -> str:
    """Every problem of ``err`` on one line: ``field: message (got value)``, with a
    "did you mean" for a misspelt key when ``model`` says which keys exist."""
    parts = []
    for problem in err.errors():
        loc = tuple(str(x) for x in problem["loc"])
        msg = problem["msg"].removeprefix("Value error, ")
        got = problem.get("input")
        part = f"{'.'.join(loc)}: {msg}" if loc else msg
        if problem["type"] == "extra_forbidden":
            close = _close_keys(model, loc)
            part += f" (did you mean {' or '.join(repr(k) for k in close)}?)" if close else ""
        elif got is not None and not isinstance(got, dict | list):
            part += f" (got {got!r})"
        parts.append(part)
    fix = "fix the flag" if source == "arguments" else "fix the file or the flag that overrides it"
    return f"invalid {source}: " + "; ".join(" ".join(p.split()) for p in parts) + f"; {fix} (see --help)"


def first_error(err: Exception) -> str:
    """A short one-line reason for a record that did not parse (pydantic's own text spans
    several lines and ends with a URL)."""
    if isinstance(err, ValidationError) and err.errors():
        first = err.errors()[0]
        loc = ".".join(str(x) for x in first["loc"])
        more = f" (+{err.error_count() - 1} more)" if err.error_count() > 1 else ""
        return f"{loc + ': ' if loc else ''}{first['msg']}{more}"
    return " ".join(str(err).split())


def _close_keys(model: type[BaseModel] | None, loc: tuple[str, ...]) -> list[str]:
    """Field names of the (nested) model at ``loc[:-1]`` that look like ``loc[-1]``."""
    import difflib
    import typing

    for name in loc[:-1]:
        if model is None:
            return []
        field = model.model_fields.get(name)
        if field is None:
            return []
        candidates = [field.annotation, *typing.get_args(field.annotation)]
        model = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
    if model is None or not loc:
        return []
    return difflib.get_close_matches(loc[-1], list(model.model_fields), n=2, cutoff=0.6)


def load_config(model: type[BaseModel], path: str | Path | None, overrides: dict[str, Any],
                preset: dict[str, Any] | None = None) -> Any:
    """Defaults < ``preset`` < YAML file (optional) < ``overrides`` -> validated config, or one
    ConfigError.

    ``preset``: a mapping of config keys the file is laid over, section by section
    (``seed_agents.config.presets``). ``overrides`` are the command-line flags: dotted keys
    (``{"runner.group_size": 2}``) or nested mappings (``{"runner": {"group_size": 2}}``, what
    the generated CLI gives), merged into the file key by key; None means "not given"."""
    import yaml

    raw: dict[str, Any] = {}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text()) or {}
        except OSError as err:
            raise ConfigError(f"cannot read config {path}: {err.strerror or err}; check the --config path") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"{path} is not valid YAML{where}: {problem}; fix the file") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{path}: expected a mapping of config keys at the top level, got {type(raw).__name__}; "
                              f"write `key: value` lines")
    raw = _laid_over(preset or {}, raw)
    _merge(raw, overrides, path)
    _keep_command_defaults(model, raw)
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(validation_message(err, str(path) if path else "arguments", model)) from None


def named_keys(path: str | Path | None, overrides: dict[str, Any]) -> set[str]:
    """The top-level config keys a YAML file and the flags give a value; a file that cannot be
    read names none here (``load_config`` reports it)."""
    import yaml

    keys = {key.partition(".")[0] for key, value in overrides.items() if value is not None}
    if path:
        try:
            raw = yaml.safe_load(Path(path).read_text())
        except (OSError, yaml.YAMLError):
            raw = None
        if isinstance(raw, dict):
            keys |= {str(key) for key, value in raw.items() if value is not None}
    return keys


def laid_over(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid over ``base``: a section both hold merges key by key, anything else is ``over``'s."""
    return _laid_over(base, over)


def _laid_over(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """``over`` laid over ``base``: a section both hold merges key by key, anything else is ``over``'s.
    A new mapping all the way down: the flags are merged into the result in place, and a
    section shared with a module-level preset would carry one call's flags into the next."""
    merged = copy.deepcopy(base)
    for key, value in over.items():
        below = merged.get(key)
        merged[key] = _laid_over(below, value) if isinstance(below, dict) and isinstance(value, dict) else copy.deepcopy(value)
    return merged


def _merge(into: dict[str, Any], overrides: dict[str, Any], path: str | Path | None) -> None:
    """Set every non-None value of ``overrides`` in ``into`` (in place), one key at a time."""
    for dotted, value in overrides.items():
        value = _given(value)
        if value is None:
            continue
        section = into
        *parents, leaf = dotted.split(".")
        for name in parents:
            child = section.setdefault(name, {})
            if not isinstance(child, dict):  # e.g. `runner: 3` in the YAML, then --group
                raise ConfigError(f"{path}: {name} must be a mapping of its fields, got {child!r}; fix the file")
            section = child
        if isinstance(value, dict) and isinstance(section.get(leaf), dict):
            _merge(section[leaf], value, path)
        elif isinstance(value, dict) and leaf in section and section[leaf] is not None:
            raise ConfigError(f"{path}: {leaf} must be a mapping of its fields, got {section[leaf]!r}; fix the file")
        else:
            section[leaf] = value


def _keep_command_defaults(model: type[BaseModel], raw: dict[str, Any]) -> None:
    """A section given in part keeps the command's own defaults for the rest (in place).

    Commands set some sections' defaults themselves (``EvalConfig.sampling`` is
    ``SamplingParams(max_tokens=24, ...)``, not the class default 64); without this, one
    field given (``--temperature 0.3``) would rebuild the section from its class and
    silently change the others. ``agent`` is left alone: its unset fields take the env
    suite's protocol defaults (``with_suite_defaults``), which need to see what was given."""
    for name, field in model.model_fields.items():
        section = raw.get(name)
        if name == "agent" or not isinstance(section, dict) or not isinstance(field.default, BaseModel):
            continue
        raw[name] = {**field.default.model_dump(exclude_unset=True), **section}


def _given(value: Any) -> Any:
    """``value`` without its None entries and the sections left empty: None (not given) or
    an empty section would replace a default section (``TrainConfig.skills`` is not
    ``SkillConfig()``)."""
    if not isinstance(value, dict):
        return value
    kept = {key: pruned for key, item in value.items() if (pruned := _given(item)) is not None}
    return kept or None
