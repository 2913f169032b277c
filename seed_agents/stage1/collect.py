"""Placeholder: being written (see seed_agents/stage1/__init__.py)."""

from __future__ import annotations

import argparse


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("collect", help="(not yet implemented)")
    p.set_defaults(func=lambda args: 1)
