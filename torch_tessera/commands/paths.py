"""The one check of every subcommand's output paths, run by the CLI before the subcommand does any work."""

from __future__ import annotations

import argparse

from torch_tessera.outpaths import check_output_dir, check_output_file

#: Argument destinations that name a directory the subcommand writes into.
OUTPUT_DIRS = ("out", "dump_dir")
#: Argument destinations that name a file the subcommand writes.
OUTPUT_FILES = ("gantt", "json", "json_path")


def check_output_paths(args: argparse.Namespace) -> None:
    """Check (and create the directories of) every output path in ``args``; empty or absent ones are skipped.

    Raises:
        ConfigError: a path that cannot be written, naming the option (``--out``, ``--gantt``...).
    """
    for dest in OUTPUT_DIRS + OUTPUT_FILES:
        value = getattr(args, dest, None)
        if not value or not isinstance(value, str):
            continue
        option = "--" + ("json" if dest == "json_path" else dest.replace("_", "-"))
        if dest in OUTPUT_DIRS:
            check_output_dir(value, option)
        else:
            check_output_file(value, option)
