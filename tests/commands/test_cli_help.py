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


def _help(name: str) -> str:
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001 - argparse's subparsers action
    return " ".join(sub.choices[name].format_help().split())


def test_flags_state_no_bool_default_and_hand_written_defaults_read_default_colon():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")  # noqa: SLF001 - argparse's subparsers action
    for name in sub.choices:
        text = _help(name)
        assert "(default: False)" not in text and "(default: True)" not in text, name
        assert not re.search(r"\(default [^:]", text), f"tessera {name}: {re.search(r'.{40}[(]default [^:].{20}', text)}"
    plan = _help("plan")
    assert "--no-cache do not read or write the plan cache --dump-dir" in plan, plan
    assert "(default: 129, as tessera bench" in plan and "(default: 129.0)" not in plan, plan
    assert re.search(r"--policy \{throughput,latency\} what the plan minimises: .*\(default: throughput\)", plan), plan
    assert "model size (default: full)" in plan, plan
