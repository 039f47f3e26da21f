"""``tessera report``: Markdown reports over saved ``tessera bench --measure`` runs (their ``bench.json``).

Examples::

    tessera report table OUT_DIR [OUT_DIR ...] [--single]     # each OUT_DIR: a `tessera bench --measure --out`
    tessera report streams OUT_DIR [OUT_DIR ...]
    tessera report gaps OUT_DIR/bench.json tessera-single layer
    tessera report step-model docs/results                    # every run below, grouped by dated directory

Each RUN is a ``--out`` directory of the measured bench or its ``bench.json``; ``step-model`` also takes directories
holding many runs. Only JSON is read: no device is opened.
"""

from __future__ import annotations

import argparse
import sys

from torch_tessera.errors import ConfigError

HELP = "Markdown reports over saved `tessera bench --measure` runs: table, streams, gaps, step-model"

REPORTS = {
    "table": "one row per run: every plan's throughput, the bound, tessera's ratios and the targets checked",
    "streams": "how the request-stream plans executed: each stream's thread against its calls timed alone",
    "gaps": "where one run's measured step goes against its model, per device and per program",
    "step-model": "the step model (cycle, fill/drain) against the measured steps; concurrent call counts",
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tessera report``."""
    parser.add_argument("report", choices=list(REPORTS), help="; ".join(f"{k}: {v}" for k, v in REPORTS.items()))
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="bench.json files or --out directories (gaps: ONE run, then the plans to break down)")
    parser.add_argument("--single", action="store_true",
                        help="table: report each run's single placement (tessera-single) as tessera")


def _table(args: argparse.Namespace) -> int:
    from torch_tessera.measure.report import load_run
    from torch_tessera.measure.report.table import single_placement, table

    runs = [load_run(p) for p in args.runs]
    if args.single:
        runs = [single_placement(r) for r in runs]
    print(table(runs))
    return 0


def _streams(args: argparse.Namespace) -> int:
    from torch_tessera.measure.report.streams import report

    rc = 0
    for path in args.runs:  # one unreadable run does not hide the others
        try:
            print("\n".join(report(path)))
        except (ConfigError, KeyError) as e:
            why = e if isinstance(e, ConfigError) else f"the run records no {e} (a run older than the request streams)"
            print(f"tessera report streams: error: {path}: {why}", file=sys.stderr)
            rc = 2
    return rc


def _gaps(args: argparse.Namespace) -> int:
    from torch_tessera.measure.report.gaps import DEFAULT_PLANS, report

    path, plans = args.runs[0], tuple(args.runs[1:]) or DEFAULT_PLANS
    print("\n".join(report(path, plans)))
    return 0


def _step_model(args: argparse.Namespace) -> int:
    from torch_tessera.measure.report.step_model import report

    print("\n".join(report(args.runs)))
    return 0


def run(args: argparse.Namespace) -> int:
    if args.single and args.report != "table":
        raise ConfigError(f"--single applies to `tessera report table` only, not to {args.report!r}")
    return {"table": _table, "streams": _streams, "gaps": _gaps, "step-model": _step_model}[args.report](args)
