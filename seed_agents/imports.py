"""Resolve ``"package.module:attribute"`` strings from configs, with one clear error."""

from __future__ import annotations

import importlib
from typing import Any


def load_object(spec: str) -> Any:
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"{spec!r} is not an import path of the form 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"cannot import {module_name!r} (from {spec!r}): {e}") from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ValueError(f"{module_name!r} has no attribute {attr!r} (from {spec!r})") from None
    return obj
