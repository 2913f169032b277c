"""Each command's flags, generated from its pydantic config.

A flag table beside a config model drifts from it; here every field of the command's
config is a flag (nested fields dotted: ``--runner.group-size``) whose help is the field's
description and the command's own default, and values stay strings until the config
validates them, so a bad value is the config's one-line error naming the field. The short
flags users already type (``--group``, ``--model``) are kept as aliases.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
import typing
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

from seed_agents.config.core import LOCAL_ENGINE_KEYS, BackendConfig, retired_engine_keys
from seed_agents.config.evidence import default_at, reasons
from seed_agents.errors import ConfigError
from seed_agents.redact import redact


def error_line(err: BaseException) -> str:
    """The message of ``err`` as one line, with anything shaped like a credential masked."""
    return redact(" ".join(str(err).split()) or type(err).__name__)


# The short flags users already type (README, scripts), beside the generated dotted ones
# (`--group` is `--runner.group-size`). Keys are the generated names; a key that a command's
# config lacks is skipped. `--backend` is `--backend.kind` (added in `add_config_flags`: the
# generator gives that name to a JSON flag for the whole `backend` section).
SHORT_FLAGS = {
    "runner.group-size": "group", "runner.concurrency": "concurrency", "runner.episode-timeout-s": "episode-timeout",
    "backend.model": "model", "backend.tokenizer": "tokenizer", "backend.base-url": "base-url",
    "sampling.temperature": "temperature", "sampling.max-tokens": "max-tokens",
    "agent.max-turns": "max-turns", "agent.history": "history", "agent.history-window": "history-window",
    "store.url": "from-store",
}


# A short flag that stands for one field of a section, where the generator names the whole
# section's JSON flag (`--backend` is `--backend.kind`). Per command, more come as `switches`.
SECTION_SWITCHES = {"backend": "backend.kind"}

PRECEDENCE = "Every field of the config is a flag; flags override the --config YAML, which overrides the defaults."


def section_summary(doc: str) -> str:
    """The first paragraph of a config section's docstring, filled to the help's width: what
    ``--help`` prints above the section's flags."""
    return textwrap.fill(" ".join(inspect.cleandoc(doc).split("\n\n")[0].split()), 76)


def add_config_flags(parser: argparse.ArgumentParser, model: type[BaseModel], *,
                     shortcuts: dict[str, str | list[str]] | None = None,
                     switches: dict[str, str] | None = None) -> Callable[[argparse.Namespace], dict[str, Any]]:
    """Add a flag for every field of ``model`` (nested fields dotted: ``--runner.group-size``) to
    ``parser`` (made with ``conflict_handler="resolve"``, for the section switches),
    with the field's description and default as its help (and, for a default a learning run chose,
    why and the result: ``seed_agents.config.evidence``), and return the function that reads
    the given flags back from the parsed namespace as a nested dict (flags not given are absent).

    ``shortcuts`` adds a command's own short flags (generated name -> alias, beside
    ``SHORT_FLAGS``); ``switches`` maps a short flag to the one field of a section it sets
    (``{"analyzer": "analyzer.kind"}``; beside ``SECTION_SWITCHES``). A list field takes
    several values after one flag (``--examples a.jsonl b.jsonl``), repeated flags, or JSON.

    pydantic-settings' ``CliSettingsSource`` generates the flags on our own argparse parser, so
    each command keeps its argparse subparser. Values stay strings until the config
    validates them, so a bad value is the config's one-line error (exit 2) that names the field.
    """
    from pydantic_settings import CliSettingsSource, SettingsError

    fields = {name.replace("_", "-") for name in model.model_fields}
    shortcuts = {**{path: flag for path, flag in SHORT_FLAGS.items() if path.split(".")[0] in fields}, **(shortcuts or {})}
    source = CliSettingsSource(model, root_parser=parser, cli_kebab_case=True,
                               cli_hide_none_type=True, cli_implicit_flags=True, cli_use_class_docs_for_groups=True,
                               cli_shortcuts=shortcuts)
    why = {reason.path: reason for reason in reasons(model)}
    for group in parser._action_groups:  # a section's help is its docstring's summary; the rest is the code reader's
        if group.description:
            group.description = section_summary(group.description)
    for action in list(parser._actions):
        if action.help and "(default factory:" in action.help:  # the generator names the factory, not its value
            action.help = action.help[: action.help.index("(default factory:")] + \
                f"(default: {_shown(default_at(model, action.dest))})".replace("%", "%%")
        if action.help and action.dest in why:
            reason = why[action.dest]
            action.help += f" Why this default: {reason.why} (docs/{reason.evidence})".replace("%", "%%")
        if action.help and "(ifdef: required)" in action.help:  # a field of an optional section
            action.help = action.help.replace("(ifdef: required)", f"(required when {action.dest.rpartition('.')[0]} is set)")
        if isinstance(action, argparse._AppendAction):  # a list: several values after one flag, as users type them
            parser.add_argument(*action.option_strings, dest=action.dest, action="extend", nargs="+",
                                default=argparse.SUPPRESS, help=action.help,
                                metavar=action.metavar[5:-1] if str(action.metavar).startswith("list[") else action.metavar)
    for flag, path in {**SECTION_SWITCHES, **(switches or {})}.items():
        field = _field(model, path)
        if field is None:
            continue
        kind = {"choices": typing.get_args(field.annotation)} if typing.get_origin(field.annotation) is typing.Literal \
            else {"action": "store_const", "const": True} if field.annotation is bool else {}
        parser.add_argument(f"--{flag}", dest=path, default=argparse.SUPPRESS,
                            help=f"Same as --{path.replace('_', '-')}. {field.description or ''}".strip(), **kind)

    for name, field in model.model_fields.items():
        if BackendConfig in (field.annotation, *typing.get_args(field.annotation)):
            _add_retired_engine_flags(parser, name)

    def given(args: argparse.Namespace) -> dict[str, Any]:
        try:
            return source(parsed_args=args)()
        except SettingsError as err:  # e.g. --env-options that is neither JSON nor key=value
            raise ConfigError(f"invalid arguments: {error_line(err)}; fix the flag (see --help)") from None

    return given


class _RetiredEngineFlag(argparse.Action):
    """A local-engine switch that left the user config (``LOCAL_ENGINE_KEYS``): at the value
    the engine runs, one warning line and nothing set; at another, the usage error's one line."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        key = self.dest.rpartition(".")[2]
        error, notice = retired_engine_keys({key: self.const if self.nargs == 0 else values})
        if error is not None:
            parser.error(f"{option_string}: {error}; remove the flag")
        print(f"{parser.prog}: warning: {notice}", file=sys.stderr)


def _add_retired_engine_flags(parser: argparse.ArgumentParser, section: str) -> None:
    """Hidden flags for ``LOCAL_ENGINE_KEYS`` (``--backend.kv-cache``, ``--no-backend.reuse-kv``), so a
    command line from before they left the config gets one line naming the key, not argparse's
    "unrecognized arguments"."""
    for key, value in LOCAL_ENGINE_KEYS.items():
        flag, dest = f"{section}.{key}".replace("_", "-"), f"_retired.{section}.{key}"
        if isinstance(value, bool):
            for option, const in ((f"--{flag}", True), (f"--no-{flag}", False)):
                parser.add_argument(option, dest=dest, action=_RetiredEngineFlag, nargs=0, const=const,
                                    default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        else:
            parser.add_argument(f"--{flag}", dest=dest, action=_RetiredEngineFlag, default=argparse.SUPPRESS,
                                help=argparse.SUPPRESS)


def config_command(sub: argparse._SubParsersAction, name: str, model: type[BaseModel], func: Callable[..., int], *,
                   help: str, description: str | None = None, yaml: bool = True, **flags: Any) -> argparse.ArgumentParser:
    """A subcommand whose flags are ``model``'s fields (``add_config_flags``), with a ``--config``
    YAML when ``yaml``; ``args.config_flags(args)`` reads the given flags back."""
    text = description or model.__doc__ or ""
    p = sub.add_parser(name, help=help, description=f"{text}\n\n{PRECEDENCE}" if yaml else text,
                       conflict_handler="resolve", formatter_class=argparse.RawDescriptionHelpFormatter)
    if yaml:
        p.add_argument("--config", metavar="YAML", help=f"YAML file with {model.__name__} fields; flags override it.")
    p.set_defaults(func=func, config_flags=add_config_flags(p, model, **flags))
    return p


def _field(model: type[BaseModel], path: str) -> Any:
    """The FieldInfo at dotted ``path`` in ``model`` (sections may be Optional), or None."""
    *parents, leaf = path.split(".")
    for name in parents:
        field = model.model_fields.get(name)
        sections = [a for a in (field.annotation, *typing.get_args(field.annotation))
                    if isinstance(a, type) and issubclass(a, BaseModel)] if field is not None else []
        if not sections:
            return None
        model = sections[0]
    return model.model_fields.get(leaf)


def _shown(value: Any) -> str:
    """A default as the user would type it (a list or mapping as JSON)."""
    import json

    try:
        return json.dumps(value) if isinstance(value, list | dict) else str(value)
    except TypeError:
        return str(value)
