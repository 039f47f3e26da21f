"""``tessera census``: which kernels of a workload run faster on which of two devices (the paper's Fig. 2 / Fig. 3).

For every program of the model's workload (an LLM's prefill and decode, a denoiser's step) and for the whole
workload (programs weighted by their runs per step), it prints the share of launches faster on each device and their
share of the first device's kernel time, per op class too, and draws the histogram of the duration ratio (second
device's time / first device's time) as a PNG. Where the paper (docs/reference: the A100 vs L40S census, §2.2) has a
figure for the model, it stands beside ours.

Predicted (the kernel cost model on catalog figures: SIMULATED) by default; ``--measure`` times every launch on real
devices instead (the measured bench's programs and profiler).
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from torch_tessera import jsonout
from torch_tessera.outpaths import DEFAULT_OUT_DIR

HELP = "per-kernel census of a workload on two devices: share of kernels faster on each, their share of time"

#: The paper's A100 vs L40S census (reference/tessera_paper.md §2.2): per registry model, (share of kernels faster on
#: the L40S, share of the A100's kernel time they make up), percent; None where the paper gives no figure. The
#: registry's stand-ins: llama = Llama-3.1-8B, moe = GPT-oss-20B (the paper's MoE), mamba = Mamba-Codestral-7B,
#: qwen2-vl = Qwen2.5-VL-7B, dit = SD3.5.
PAPER_PAIR = ("a100", "l40s")
PAPER_MEAN = (67.0, 36.0)
PAPER = {
    "llama": {"all": (None, 26.3)},
    "moe": {"all": (None, 38.07), "prefill": (45.0, None), "decode": (57.0, None)},
    "mamba": {"all": (None, 28.8)},
    "qwen2-vl": {"all": (None, 34.3)},
    "dit": {"all": (None, 53.2)},
}


@dataclass(frozen=True)
class CensusRow:
    """Census of one program (or ``"all"``: the workload, programs weighted by runs per step) or one op class.

    Attributes:
        program: program name, or ``"all"``.
        op_class: an op class value, or ``"all"``.
        launches: launches counted (each program's launches times its runs per step, for ``"all"``).
        faster_on_second: share of those launches faster on the second device, percent.
        time_share: share of the first device's kernel time those launches take, percent.
        paper_faster / paper_time: the paper's figures, percent (``None``: none).
    """

    program: str
    op_class: str
    launches: float
    faster_on_second: float
    time_share: float
    paper_faster: float | None = None
    paper_time: float | None = None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="llama", help="registry model")
    parser.add_argument("--devices", default="sim:a100,sim:l40s", help="two devices (first: the reference)")
    parser.add_argument("--size", default="full", choices=["full", "tiny"], help="model size")
    parser.add_argument("--measure", action="store_true",
                        help="time every launch on the (real) --devices instead of predicting (models: llama, moe, "
                             "mamba, dit; --layers as in tessera bench --measure)")
    parser.add_argument("--layers", type=int, default=None, help="--measure: repeated blocks kept (default: 8 full)")
    parser.add_argument("--prefill-tokens", type=int, default=1024,
                        help="prompt tokens of an LLM/SSM's prefill program (predicted census)")
    parser.add_argument("--out", default=DEFAULT_OUT_DIR,
                        help="directory for census_<model>.json and census_<model>.png (census_<model>_tiny.* with --size tiny)")


def census_rows(tables: Sequence[tuple[str, float, np.ndarray, Sequence[str]]],
                paper: dict | None = None) -> list[CensusRow]:
    """Rows for each program, each (program, op class) and the whole workload.

    Args:
        tables: ``(program, runs per step, seconds [launches, 2], op class of each launch)`` per program.
        paper: ``{"all" | program: (faster %, time %)}``.
    """
    paper = paper or {}
    rows = []
    every = [(name, freq, sec, cls) for name, freq, sec, cls in tables]
    scopes = [(name, [(freq, sec, cls)]) for name, freq, sec, cls in every]
    if len(every) > 1:
        scopes.append(("all", [(freq, sec, cls) for _, freq, sec, cls in every]))
    for scope, parts in scopes:
        w = np.concatenate([np.full(len(sec), freq) for freq, sec, _ in parts])
        sec = np.concatenate([sec for _, sec, _ in parts])
        cls = np.concatenate([np.asarray(c, dtype=object) for _, _, c in parts])
        for c in ["all", *sorted(set(cls))]:
            m = np.ones(len(sec), bool) if c == "all" else cls == c
            faster = sec[m, 1] < sec[m, 0]
            a_time = (w[m] * sec[m, 0]).sum()
            pf, pt = paper.get(scope, (None, None)) if c == "all" else (None, None)
            rows.append(CensusRow(scope, c, float(w[m].sum()), 100 * float(w[m][faster].sum() / w[m].sum()),
                                  100 * float((w[m] * sec[m, 0])[faster].sum() / a_time) if a_time else math.nan,
                                  pf, pt))
    if len(every) == 1:  # one program: it is the whole workload
        rows = [r if r.op_class != "all" else CensusRow(r.program, "all", r.launches, r.faster_on_second, r.time_share,
                                                        *paper.get("all", (None, None))) for r in rows]
    return rows


def predicted_tables(model: str, specs, size: str, prefill_tokens: int = 1024):
    """``(program, runs per step, seconds [n, 2], op classes)`` per program, from the kernel cost model."""
    from torch_tessera.backend.workload import model_workload
    from torch_tessera.lowering.op_class import classify

    mw = model_workload(model, specs, size=size, prefill_tokens=prefill_tokens)
    out = []
    for wp, prog in zip(mw.workload.programs, mw.programs):
        out.append((wp.name, wp.frequency, np.asarray(wp.costs.seconds), [classify(l).value for l in prog.launches]))
    return out


def measured_tables(model: str, devices: str, size: str, layers: int | None):
    """As :func:`predicted_tables`, every launch timed on the real devices (the measured bench's programs)."""
    from torch_tessera.lowering.op_class import classify
    from torch_tessera.measure.profile import profile_on_device
    from torch_tessera.measure.programs import build_programs, compile_program
    from torch_tessera.measure.settings import MeasureSettings
    from torch_tessera.target.devices import parse_devices

    s = MeasureSettings(model=model, devices=devices, size=size, layers=layers)
    specs = parse_devices(devices)
    home = "cuda:0" if specs[0].is_gpu else "cpu"
    freqs = s.composition.frequencies
    out = []
    for prog in build_programs(s, home):
        compile_program(prog, devices, cuda_graphs=bool(specs[0].is_gpu))
        cols = [profile_on_device(prog, g, s).seconds for g in range(2)]
        launches = prog.runner.program.launches
        out.append((prog.name, float(freqs.get(prog.name, 1.0)), np.stack(cols, 1),
                    [classify(l).value for l in launches]))
    return out


def histogram_panels(tables) -> list[tuple[str, np.ndarray, np.ndarray]]:
    """The PNG's panels, ``(name, weight per launch, seconds [n, 2])``: one per program and, with several programs,
    ``"all"``, every launch weighted by its program's runs per workload step, as :func:`census_rows` counts them (so
    a panel's share of launches faster on the second device is the table's)."""
    panels = [(name, np.full(len(sec), float(freq)), sec) for name, freq, sec, _ in tables]
    if len(tables) > 1:
        panels.append(("all", np.concatenate([w for _, w, _ in panels]), np.concatenate([s for _, _, s in panels])))
    return panels


def panel_share(weights: np.ndarray, sec: np.ndarray) -> float:
    """Share of the launches (weighted) faster on the second device, percent."""
    return 100 * float(weights[sec[:, 1] < sec[:, 0]].sum() / weights.sum())


def histogram(tables, devices: Sequence[str], model: str, path: Path, measured: bool,
              rows: Sequence[CensusRow] = ()) -> None:
    """The duration-ratio histogram (second / first device), one panel per program and one for the whole workload,
    like the paper's Fig. 2; launches are counted per workload step (each program's launches times its runs per
    step: :func:`histogram_panels`), as the text table counts them. Each panel says our shares and the paper's
    where it has them (``rows``: :func:`census_rows`)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator

    panels = histogram_panels(tables)
    fig, axes = plt.subplots(1, len(panels), figsize=(max(8.0, 5.2 * len(panels)), 4.2), squeeze=False)
    what = "MEASURED" if measured else "SIMULATED (kernel cost model)"
    for ax, (name, weights, sec) in zip(axes[0], panels):
        ratio = sec[:, 1] / sec[:, 0]
        bins = np.logspace(math.log10(max(ratio.min(), 1e-2)) - 0.05, math.log10(min(ratio.max(), 1e2)) + 0.05, 40)
        counts, _, _ = ax.hist(np.clip(ratio, bins[0], bins[-1]), bins=bins, weights=weights, color="#4c72b0",
                               edgecolor="white")
        ax.set_ylim(0, 1.35 * max(float(np.max(counts)), 1.0))  # headroom: the shares box sits above the bars
        ax.axvline(1.0, color="black", lw=1, ls="--")
        ax.set_xscale("log")
        ticks = [t for t in (0.1, 0.25, 0.5, 1, 2, 4, 10) if bins[0] <= t <= bins[-1]]
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.set_xticklabels([f"{t:g}" for t in ticks])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_title(f"{name}: {panel_share(weights, sec):.0f} % of {weights.sum():.0f} launches per step faster on "
                     f"{devices[1]}", fontsize=9)
        mine = next((r for r in rows if r.program == name and r.op_class == "all"), None)
        if mine is not None:
            text = f"ours: {mine.faster_on_second:.0f} % of launches, {mine.time_share:.0f} % of time"
            if mine.paper_faster is not None or mine.paper_time is not None:
                text += f"\npaper: {_pct(mine.paper_faster)} of kernels, {_pct(mine.paper_time)} of time"
            ax.text(0.02, 0.97, text, transform=ax.transAxes, fontsize=7.5, va="top",
                    bbox={"facecolor": "white", "alpha": 0.8, "edgecolor": "#bbb"})
        ax.set_xlabel(f"duration ratio {devices[1]} time / {devices[0]} time (log scale; < 1: faster on "
                      f"{devices[1]})", fontsize=8)
        ax.set_ylabel("launches per workload step (count)")
    fig.suptitle(f"Kernel census of {model} on {devices[0]} vs {devices[1]}: {what}\nlaunches counted per workload "
                 "step (runs per step x launches), as in the text table", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def _pct(x: float | None) -> str:
    return "-" if x is None or x != x else f"{x:.1f} %"


def format_rows(rows: Sequence[CensusRow], devices: Sequence[str], measured: bool) -> str:
    head = "MEASURED" if measured else "SIMULATED"
    lines = [f"{head}: launches faster on {devices[1]} than on {devices[0]}, and their share of {devices[0]}'s "
             "kernel time",
             f"{'program':9} {'class':12} {'launches':>9} {'faster on 2nd':>14} {'paper':>8} "
             f"{'time share':>11} {'paper':>8}"]
    for r in rows:
        lines.append(f"{r.program:9} {r.op_class:12} {r.launches:9.0f} {_pct(r.faster_on_second):>14} "
                     f"{_pct(r.paper_faster):>8} {_pct(r.time_share):>11} {_pct(r.paper_time):>8}")
    return "\n".join(lines)


def paper_figures(model: str, specs) -> dict:
    """The paper's figures for ``model`` on the A100 + L40S pair (the mean where it has none); ``{}`` elsewhere."""
    keys = tuple(s.catalog_key for s in specs)
    if keys != PAPER_PAIR:
        return {}
    fig = dict(PAPER.get(model, {}))
    f, t = fig.get("all", (None, None))
    fig["all"] = (f if f is not None else PAPER_MEAN[0], t if t is not None else PAPER_MEAN[1])
    return fig


def scan_unroll_notice(family: str, size: str, prefill_tokens: int) -> str | None:
    """A notice for a predicted census whose lowering is long with empty caches, or ``None``.

    The registry's SSM runs Hugging Face's torch scan path, a Python loop over the prompt's tokens, so the full-size
    prefill program unrolls ``prefill_tokens`` scan steps per layer in the lowering: 32 tokens took about 9 minutes
    cold on a 2-core CPU (docs/BENCHMARKS.md, issue 21's census), and the time grows with the tokens.
    """
    if family != "ssm" or size != "full" or prefill_tokens <= 32:
        return None
    return (f"note: the full-size SSM's prefill unrolls its scan over {prefill_tokens} tokens in every layer; with "
            "empty lowering caches this takes far longer than the 9 minutes that --prefill-tokens 32 takes on a "
            "2-core CPU (later runs reuse the cache). For a quick census pass --prefill-tokens 32.")


def missing_gpu_fix(args: argparse.Namespace) -> str:
    """The remedy when --devices names a GPU this machine lacks."""
    predict = ("name the GPUs from the catalog as sim:NAME (e.g. --devices sim:h200,sim:l40s; `tessera devices` "
               "lists the catalog)")
    if args.measure:
        return (f"--measure times every launch on the devices it names: run it on a machine with them, or leave out "
                f"--measure to predict the census and {predict}.")
    return f"Without --measure the census is predicted: {predict}."


def run(args: argparse.Namespace) -> int:
    from torch_tessera.errors import ConfigError
    from torch_tessera.models import get_model
    from torch_tessera.target.devices import parse_devices

    get_model(args.model)
    specs = parse_devices(args.devices)
    if len(specs) != 2:
        raise ConfigError(f"--devices needs exactly two devices, got {len(specs)}: {args.devices!r}")
    if args.prefill_tokens < 1:
        raise ConfigError(f"--prefill-tokens must be at least 1 (got {args.prefill_tokens})")
    if args.measure:
        tables = measured_tables(args.model, args.devices, args.size, args.layers)
    else:
        notice = scan_unroll_notice(get_model(args.model).family, args.size, args.prefill_tokens)
        if notice:
            print(notice, file=sys.stderr, flush=True)
        tables = predicted_tables(args.model, specs, args.size, args.prefill_tokens)
    names = [s.name for s in specs]
    rows = census_rows(tables, paper_figures(args.model, specs))
    tiny = args.size == "tiny"
    print(f"tessera census --model {args.model} --devices {args.devices}" + (" --measure" if args.measure else "")
          + (" --size tiny (the tiny model: not comparable with the paper's figures)" if tiny else "")
          + (f" --prefill-tokens {args.prefill_tokens}" if args.prefill_tokens != 1024 else ""))
    print(format_rows(rows, names, args.measure))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"census_{args.model}" + ("_tiny" if tiny else "")
    png = out / f"{stem}.png"
    histogram(tables, names, args.model + (" (tiny)" if tiny else ""), png, args.measure, rows)
    (out / f"{stem}.json").write_text(jsonout.dumps(
        {"model": args.model, "size": args.size, "devices": names, "measured": args.measure,
         "label": "MEASURED" if args.measure else "SIMULATED", "rows": [asdict(r) for r in rows]}, indent=1))
    print(f"wrote {png} and {out / f'{stem}.json'}")
    return 0
