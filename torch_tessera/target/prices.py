"""One dated price table for throughput per dollar.

Prices are *relative* GPU-hour prices with the L40S at 1.0, the unit the Tessera paper uses (its artifact's
``configs/gpu_prices.yaml``: A100 1.5, L40S 1.0, H100 2.9, RTX Pro 6000 1.2, B200 5.0; the paper does not say where the
absolute prices came from). The other GPUs are our assumptions, marked as such: they are placed relative to the paper's
figures by their rough market position, and no benchmark conclusion should hang on them.

A restricted-SM partition of a GPU is charged its share of SMs of the whole GPU's price (stated as such in its
:class:`Price`); a CPU virtual device costs nothing.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

UNIT = "relative $/GPU-hour (L40S = 1.0)"
TABLE_DATE = "2026-11-29"
PAPER = "Tessera paper (arXiv 2604.10180), artifact configs/gpu_prices.yaml, relative units"


@dataclass(frozen=True)
class Price:
    """A price per hour of one device.

    Attributes:
        per_hour: price in :data:`UNIT`.
        source: where it comes from, or the reasoning when ``assumption`` is set.
        date: ISO date the figure was recorded in this table.
        assumption: True when the figure is ours rather than a published one.
    """

    per_hour: float
    source: str
    date: str = TABLE_DATE
    assumption: bool = False


PRICES: Mapping[str, Price] = {
    "a100": Price(1.5, PAPER),
    "a100-pcie": Price(1.5, PAPER + " (the paper's A100 is the 80GB PCIe board)"),
    "l40s": Price(1.0, PAPER),
    "h100": Price(2.9, PAPER),
    "rtxpro6000": Price(1.2, PAPER),
    "b200": Price(5.0, PAPER),
    "h200": Price(3.4, "assumption: H100 price x ~1.17, the premium H200 rentals commonly carry over H100", assumption=True),
    "h20": Price(1.6, "assumption: Hopper with ~15% of H100 compute, priced near the A100", assumption=True),
    "l4": Price(0.45, "assumption: a 72 W inference card, under half an L40S", assumption=True),
    "a10g": Price(0.55, "assumption: AWS G5-class card, about half an L40S", assumption=True),
}


def price_of(catalog_key: str) -> Price:
    """The price of a catalog GPU; an unknown key gets a 1.0 assumption (logged by the caller's spec)."""
    return PRICES.get(catalog_key, Price(1.0, f"assumption: no price recorded for {catalog_key!r}", assumption=True))


def partition_price(whole: Price, sms: int, total_sms: int) -> Price:
    """The price of a partition of ``sms`` of ``total_sms`` SMs: its SM share of the whole GPU's price."""
    share = min(1.0, sms / total_sms)
    return Price(
        whole.per_hour * share,
        f"SM share {sms}/{total_sms} of the whole GPU's price ({whole.per_hour:g}: {whole.source})",
        whole.date,
        assumption=True,
    )


CPU_PRICE = Price(0.0, "CPU virtual device: a test fixture, not billed")
