"""The ``tessera`` command line: ``tessera <command> [options]``."""

from __future__ import annotations

import argparse
import importlib
import logging
import re
import sys
from typing import NoReturn

from torch_tessera.compat.argparse import DefaultsOnceHelpFormatter
from torch_tessera.errors import GpuNotPresentError, TesseraError

#: Subcommand name -> module under ``torch_tessera.commands``.
COMMANDS = {"bench": "bench", "inspect": "inspect", "devices": "devices", "plan": "plan", "serve-bench": "serve_bench",
            "dist-run": "dist_run", "report": "report", "calibrate": "calibrate", "census": "census",
            "pairs": "pairs", "advise": "advise"}


class OneLineErrorParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors (a missing required option, an unknown one, a bad choice) are one
    line on stderr, ``tessera <command>: error: <what>; see 'tessera <command> --help'``, then exit status 2, instead
    of argparse's usage block. An unknown option's line also names the command's valid options."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        if message.startswith("unrecognized arguments"):
            valid = sorted({s for a in self._actions for s in a.option_strings if s.startswith("--") and s != "--help"})
            message += f" (its options: {', '.join(valid)})"
        self.exit(2, f"{self.prog}: error: {message}; see '{self.prog} --help'\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="tessera", description="Kernel-granularity disaggregation across GPUs.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMANDS.items():
        module = importlib.import_module(f"torch_tessera.commands.{module_name}")
        p = sub.add_parser(name, help=getattr(module, "HELP", None),
                           formatter_class=DefaultsOnceHelpFormatter)
        module.add_arguments(p)
        p.set_defaults(command_module=module, command_parser=p)
    return parser


#: A value that starts with "-" but is numbers (``-1,2``, ``-0.5``): argparse would read it as an option.
_NEGATIVE_VALUES = re.compile(r"^-\.?\d[\d.,eE+-]*$")


def _join_negative_values(argv: list[str]) -> list[str]:
    """``--rates -1,2`` as ``--rates=-1,2``, so that a value starting with a minus sign reaches its option (which
    then says what is wrong with it)."""
    out: list[str] = []
    for token in argv:
        if out and _NEGATIVE_VALUES.match(token) and out[-1].startswith("--") and "=" not in out[-1]:
            out[-1] = f"{out[-1]}={token}"
        else:
            out.append(token)
    return out


def main(argv: list[str] | None = None) -> int:
    """Run one subcommand. Ordinary mistakes (bad option values, unwritable output paths, devices this machine lacks)
    print one line ``tessera <command>: error: ...`` and return 2. A GPU this machine lacks gets the remedy of the
    command's ``missing_gpu_fix(args)`` when its module has one."""
    from torch_tessera.commands.paths import check_output_paths

    parser = build_parser()
    args, unknown = parser.parse_known_args(_join_negative_values(list(sys.argv[1:] if argv is None else argv)))
    if unknown:  # said with the subcommand's valid options, not the top-level ones
        (getattr(args, "command_parser", None) or parser).error(f"unrecognized arguments: {' '.join(unknown)}")
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    if args.command is None:
        parser.print_help()
        return 2
    try:
        check_output_paths(args)
        return int(args.command_module.run(args) or 0)
    except GpuNotPresentError as e:  # the remedy that fits this command, where it has one
        fix = getattr(args.command_module, "missing_gpu_fix", None)
        print(f"tessera {args.command}: error: {e.with_fix(fix(args)) if fix else e}", file=sys.stderr)
        return 2
    except TesseraError as e:
        print(f"tessera {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a file the command reads or writes: say which, without our stack
        print(f"tessera {args.command}: error: {e.strerror or e}: {e.filename or ''}".rstrip(": "), file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
