"""Every subcommand's help states each default once."""

from __future__ import annotations

import re

from torch_tessera.cli import build_parser


def test_each_default_is_stated_once():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001 - argparse's subparsers action
    for name, p in sub.choices.items():
        text = " ".join(p.format_help().split())
        for line in re.split(r" (?=--?\w)", text):
            assert len(re.findall(r"\(default", line)) <= 1, f"tessera {name}: {line}"
        assert "(default: None)" not in text, name
