"""Help in one breath: every config field's description, which ``--help`` prints, is at most two
sentences and 200 characters; the longer why lives in the docs (docs/training.md)."""

import dataclasses
import re
import typing

import pytest
from pydantic import BaseModel

from tests.unit.test_config_cli import _configs

LIMIT = 200
# a sentence ends at . ! or ? before a space; "e.g. " and the like do not end one
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)(?<!\bvs)[.!?]\s")


def sentences(text: str) -> int:
    return len(SENTENCE_END.findall(" ".join(text.split()))) + 1


def test_the_sentence_count():
    assert sentences("One.") == 1
    assert sentences("auto: a, e.g. b; c. false: d.") == 2
    assert sentences("Several rows (etc. and i.e. inside). Two. Three.") == 3
    assert sentences("A 0.5 rate, pkg.module:fn and trainers/head.py") == 1


def _models(annotation: typing.Any) -> typing.Iterator[type[BaseModel]]:
    """The config models ``annotation`` holds: ``X``, ``X | None``, ``list[X]``, ``dict[str, X]``..."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in typing.get_args(annotation):
        yield from _models(arg)


def _descriptions() -> dict[str, str]:
    """``Model.field`` -> description, for every field of every command's config, sections walked."""
    found: dict[str, str] = {}

    def walk(model: type[BaseModel]) -> None:
        for name, field in model.model_fields.items():
            key = f"{model.__module__}.{model.__qualname__}.{name}"
            if key in found:
                continue
            found[key] = field.description or ""
            for inner in _models(field.annotation):
                walk(inner)

    for model in _configs().values():
        walk(model)
    return found


DESCRIPTIONS = _descriptions()


def test_the_walk_reaches_nested_sections():
    assert len(DESCRIPTIONS) > 300
    assert any(key.endswith("BackendConfig.precision") for key in DESCRIPTIONS)  # train's backend section
    assert any(key.endswith("GateConfig.floor") for key in DESCRIPTIONS)  # continual's gate section


@pytest.mark.parametrize("key", sorted(DESCRIPTIONS))
def test_every_config_description_is_one_breath(key):
    text = " ".join(DESCRIPTIONS[key].split())
    assert len(text) <= LIMIT, f"{key}: {len(text)} characters (at most {LIMIT}; the rest belongs in the docs)"
    assert sentences(text) <= 2, f"{key}: {sentences(text)} sentences (at most two): {text}"


def test_every_seed_config_help_is_one_breath():
    """SEEDConfig's own fields (TRL's inherited ones say what TRL says)."""
    from seed_agents.trainers.seed_trainer import SEEDConfig

    own = set(SEEDConfig.__annotations__)
    helps = {f.name: f.metadata.get("help", "") for f in dataclasses.fields(SEEDConfig) if f.name in own}
    assert helps
    for name, text in helps.items():
        text = " ".join(text.split())
        assert text, name
        assert len(text) <= LIMIT and sentences(text) <= 2, (name, len(text), text)


def _parsers():
    """(command, parser) of every command: `eval`, `skills collect`, ..."""
    from tests.unit.test_config_cli import subparser

    return [(command, subparser(command)) for command in _configs()]


def test_every_section_summary_is_one_breath():
    """``--help`` prints a section's docstring above its flags: its first paragraph only
    (``seed_agents.app.flags.section_summary``), the rest being for the code's reader."""
    for command, parser in _parsers():
        for group in parser._action_groups:
            text = " ".join((group.description or "").split())
            assert len(text) <= LIMIT and sentences(text) <= 2, (command, group.title, len(text), text)


def test_every_other_flag_is_one_breath():
    """The flags a command adds beside its config's (``--config``, ``--preset``, ``--resume``...)."""
    import argparse

    for command, parser in _parsers():
        for action in parser._actions:
            text = " ".join((action.help or "").split())
            if action.help == argparse.SUPPRESS or any(s.startswith(("--", "-")) and "." in s for s in action.option_strings):
                continue  # a generated flag: its description is checked above (its default and why follow it)
            text = text.split(" (default: ")[0]
            assert len(text) <= LIMIT and sentences(text) <= 2, (command, action.option_strings, len(text), text)
