"""``tessera devices``: detected GPUs, requested devices (partitions, profiles), the simulated catalog, measured links.

Examples::

    tessera devices
    tessera devices --devices cuda:0,cuda:1@72sm+throttle36,mem=40GB --measure-links
    tessera devices --devices cuda:1@24sm --assume-gpu h200        # on a machine without that GPU
    tessera devices --sources                                      # every catalog figure with its source
"""

from __future__ import annotations

import argparse
import contextlib
import math
import sys
from typing import Sequence

from torch_tessera.errors import DeviceUnavailableError, GpuNotPresentError
from torch_tessera.target import catalog, prices
from torch_tessera.target.devices import EMULATION_PROFILES, DeviceSpec, detect_gpus, open_device, parse_device, \
    parse_devices, parse_size

HELP = "list detected GPUs, requested partitions and profiles, the simulated catalog, measured links"

SPEC_HEADERS = ("device", "model", "arch", "SMs", "bf16 TFLOP/s", "fp32 TFLOP/s", "DRAM GB/s", "memory GB",
                "price/h")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``tessera devices``."""
    parser.add_argument("--devices", default=None,
                        help="devices to describe, comma-separated (e.g. cuda:0,cuda:1@72sm+throttle36,mem=40GB)")
    parser.add_argument("--assume-gpu", default=None, metavar="KEY",
                        help="catalog GPU to assume for cuda:N strings on a machine without that GPU (e.g. h200)")
    parser.add_argument("--measure-links", action="store_true",
                        help="open the devices (detected GPUs and --devices) and measure every ordered pair")
    parser.add_argument("--link-sizes", default="4KiB,64KiB,1MiB,16MiB,256MiB,1GiB",
                        help="message sizes for --measure-links, comma-separated")
    parser.add_argument("--sources", action="store_true", help="list every catalog figure with its source")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with left-aligned columns."""
    cells = [[str(h) for h in headers]] + [[_cell(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        if math.isnan(value):
            return "?"
        return f"{value:.3g}" if abs(value) < 100 else f"{value:.0f}"
    return str(value)


def spec_row(d: DeviceSpec) -> list[object]:
    """One table row of a device, in the units of :data:`SPEC_HEADERS`."""
    sms = f"{d.sm_count}/{d.total_sms}" if d.sm_count != d.total_sms else str(d.sm_count)
    if d.throttle_sms:
        sms += f" (+{d.throttle_sms} streaming)"
    return [d.name, d.model, d.arch, sms, d.peak_bf16_flops / 1e12, d.peak_fp32_flops / 1e12, d.mem_bandwidth / 1e9,
            d.memory_bytes / 1e9, d.price_per_hour]


def _catalog_table() -> str:
    rows = [spec_row(parse_device(f"sim:{key}")) for key in catalog.CATALOG]
    return format_table(SPEC_HEADERS, rows)


def _sources_table() -> str:
    rows = []
    for e in catalog.CATALOG.values():
        for name, f in e.figures.items():
            s = catalog.SOURCES[f.source]
            rows.append([e.key, name, f"{f.value:.4g}", s.title[:60], s.read, f.note[:50]])
    return format_table(("gpu", "figure", "value (SI)", "source", "read", "note"), rows)


def _hop_table() -> str:
    from torch_tessera.target.links import HOP_FIGURES

    rows = [[kind, f.overhead_s * 1e6, f.exposure, f.source] for kind, f in HOP_FIGURES.items()]
    return format_table(("pair kind", "us per cut edge per run", "share of copy time", "source"), rows)


def _profiles_table() -> str:
    rows = [[name, p.sms or "all", p.throttle_sms, p.memory_budget / 1e9, p.mimics]
            for name, p in EMULATION_PROFILES.items()]
    return format_table(("profile", "SMs", "streamer SMs", "memory GB", "mimics"), rows)


def _links(specs: list[DeviceSpec], sizes: list[int]) -> str:
    from torch_tessera.target.links import link_table_rows, measure_links

    with contextlib.ExitStack() as stack:
        devices = [stack.enter_context(open_device(s)) for s in specs]
        measured = measure_links(devices, sizes=sizes, repeats=5)
    rows = [[r["src"], r["dst"], r["method"], r["bytes"], r["seconds"] * 1e6, r["GB/s"]] for r in link_table_rows(measured)]
    return format_table(("src", "dst", "method", "bytes", "us per copy", "GB/s"), rows)


def missing_gpu_fix(args: argparse.Namespace) -> str:
    """The remedy when --devices names a GPU this machine lacks: describe it as a catalog GPU."""
    return ("To describe it as a catalog GPU on this machine, add --assume-gpu h200 (or another key of the simulated "
            "catalog: `tessera devices` lists them), or name it sim:h200.")


def run(args: argparse.Namespace) -> int:
    """Print the tables; returns 0, or 2 when a device string is bad or a device is unavailable."""
    try:
        requested = parse_devices(args.devices, assume_gpu=args.assume_gpu) if args.devices else []
        sizes = [parse_size(s) for s in args.link_sizes.split(",") if s.strip()]
    except GpuNotPresentError as exc:
        print(f"tessera devices: error: {exc.with_fix(missing_gpu_fix(args))}", file=sys.stderr)
        return 2
    except (DeviceUnavailableError, ValueError) as exc:
        print(f"tessera devices: error: {exc}", file=sys.stderr)
        return 2
    gpus = detect_gpus()
    print("Detected GPUs")
    print(format_table(SPEC_HEADERS, [spec_row(d) for d in gpus]) if gpus else "  none (no CUDA GPU visible)")
    if requested:
        print("\nRequested devices (partition figures are model estimates until measured)")
        print(format_table(SPEC_HEADERS, [spec_row(d) for d in requested]))
        from torch_tessera.target.links import memory_pools

        for pool in memory_pools(requested):
            print(f"shared memory of GPU {pool.name}: {pool.source}; plans keep them within "
                  f"{pool.capacity / 1e9:.2f} GB together")
    print("\nEmulation profiles (cuda:N@PROFILE)")
    print(_profiles_table())
    print(f"\nSimulated catalog (sim:KEY; dense peaks; price in {prices.UNIT}, {prices.TABLE_DATE})")
    print(_catalog_table())
    if args.sources:
        print("\nCatalog figures and their sources")
        print(_sources_table())
        print("\nPer-hop charge of a cut edge on the two devices it joins, by pair kind (target.links.HOP_FIGURES)")
        print(_hop_table())
    if args.measure_links:
        names = {d.name for d in requested}
        specs = [d for d in gpus if d.name not in names] + [d for d in requested if d.kind.value != "sim"]
        print("\nMeasured links")
        if len(specs) < 2:
            print("  need at least two real or CPU virtual devices (use --devices cpu:0,cpu:1 without a GPU)")
        else:
            try:
                print(_links(specs, sizes))
            except DeviceUnavailableError as exc:
                print(f"error: {exc}")
                return 2
    return 0
