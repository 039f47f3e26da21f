"""The grid a library (cuBLAS) GEMM launches: its CTA tile, split-K and CTA count, as cuBLAS chose them on the H200.

cuBLAS sizes a GEMM's grid to the SM count the device reports, which inside a green-context partition is still the
whole GPU's (the library cannot see the partition). For a GEMM of at most as many 128 x 128 output tiles as SMs it
does not run one CTA per 128 x 128 tile: it picks a smaller CTA tile (64 x 8 for a GEMV, 64 x 32 for 64 rows...) so
that the grid nearly fills the SMs, and when the reduction is long for the output's size it also splits K. On a
partition of ``S`` SMs that grid runs in ``ceil(CTAs / S)`` waves, each lasting about one CTA's time: a fixed part
and the CTA's operand loads (:class:`~torch_tessera.target.kernelmodel.KernelModel`'s ``wave_cycles`` and
``operand_bytes_per_clock_per_sm``).

The rule, read off two H200 sweeps (bf16 ``torch.mm``, cuBLAS of CUDA 13: docs/results/2026-12-02-s15/call3/
cublas_grids.json, 110 shapes; docs/results/2026-12-03-s16/cublas_partitions.txt, 14 shapes on 132/72/24/16 SMs;
docs/BENCHMARKS.md, cost model and census):

* unsplit: among :data:`LIBRARY_TILES` the tile whose grid is the largest not above the SMs (ties: the smaller tile);
* split-K, when :func:`splits_k` says so: the tile whose grid is the largest not above half the SMs (K below
  :data:`SPLIT_K_DEEP`) or a quarter of them (deeper), then ``min(SMs // pieces, K // SPLIT_K_DEPTH)`` parts;
* a GEMM of more 128 x 128 tiles than SMs, or of a shape outside the sweeps' (:data:`MEASURED_ROWS`...): no rule
  (``None``); the cost model runs it one CTA per 128 x 128 tile over its whole K;
* on a GPU of :data:`MEASURED_SMS` SMs, a shape of :data:`MEASURED_TN_GRIDS` (the models' transposed weight, measured)
  takes that grid instead of the rule.

The rule was read off a row-major B; with the weight transposed (``nn.Linear``) cuBLAS picks other grids, so the
shapes that run measured take :data:`MEASURED_TN_GRIDS`. How well each matches cuBLAS: docs/BENCHMARKS.md, cost
model and census (sessions 16-17).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

#: CTA tiles of the cuBLAS (nvjet) kernels the H200 sweeps launched, ``(columns N, rows M)`` of the output per CTA.
LIBRARY_TILES = ((64, 8), (64, 16), (64, 32), (128, 8), (64, 64), (64, 96), (96, 64), (128, 64), (128, 80), (96, 128),
                 (192, 48), (128, 128), (192, 96), (128, 160), (192, 128), (192, 192))
#: ``(K at least, share of the SMs)``: with K at least a band's figure (the largest such band applies), a GEMM splits
#: K when its 128 x 128 output tiles are at most that share of the SMs; below the first band it never splits. Each
#: share lies inside the bound the sweep measured (K = 4,096: 16-20 of 132 tiles; 6,144: 20-24; 14,336: 72-96).
SPLIT_K_BANDS = ((4096, 1 / 8), (6144, 1 / 6), (14336, 2 / 3))
#: A GEMV (at most this many rows or columns) splits from the first band up to a quarter of the SMs' worth of tiles.
SKINNY = 8
SKINNY_SPLIT_SHARE = 1 / 4
#: Shortest reduction slice of a split-K CTA (four 128-deep pipeline stages).
SPLIT_K_DEPTH = 512
#: A split GEMM of K below this picks its tile for a grid of half the SMs before splitting, a deeper one for a quarter.
SPLIT_K_DEEP = 8192
TILE = 128
#: The shapes the sweeps measured: M = 1 or at least 64 rows, at least 768 columns, K at least 256. Outside them
#: (a GEMM of a few columns, a K of 16...) the rule is not known and the model runs one CTA per 128 x 128 tile.
MEASURED_ROWS, MEASURED_COLS, MEASURED_DEPTH = 64, 768, 256
#: SM count of the GPU the layouts run measured (the H200); :data:`MEASURED_TN_GRIDS` applies to such a GPU only.
MEASURED_SMS = 132
#: ``(M, K, N): (CTAs, tile_n, tile_m, splits)`` of cuBLAS's main kernel for ``addmm(b, x, w.t())`` / ``mm(x, w.t())``
#: (the weight transposed, as ``nn.Linear`` calls it), bf16 on the H200, cuBLAS of CUDA 13
#: (docs/results/2026-12-03-s16/call4/layouts/cublas_layouts.json; printed by
#: docs/results/2026-12-03-s16-partfit5/tn_table.py). For these shapes it replaces the row-major rule above.
MEASURED_TN_GRIDS = {
    (1, 256, 1536): (96, 16, 64, 1),
    (1, 1536, 1536): (96, 16, 64, 1),
    (1, 1536, 3072): (48, 64, 8, 1),
    (1, 1536, 9216): (72, 128, 8, 1),
    (1, 1536, 13824): (120, 64, 8, 1),
    (1, 2048, 1536): (96, 16, 64, 1),
    (32, 5120, 192): (24, 32, 64, 4),
    (64, 160, 5120): (92, 56, 64, 1),
    (64, 2560, 10240): (120, 88, 64, 1),
    (64, 4096, 8): (3, 8, 64, 3),
    (64, 4096, 1024): (96, 64, 32, 3),
    (64, 4096, 4096): (128, 64, 32, 1),
    (64, 4096, 14336): (100, 144, 64, 1),
    (64, 5120, 192): (24, 64, 32, 4),
    (64, 5120, 2560): (96, 80, 64, 3),
    (64, 14336, 4096): (132, 96, 64, 3),
    (333, 1536, 1536): (132, 72, 64, 1),
    (333, 4096, 1536): (132, 72, 64, 1),
    (333, 6144, 1536): (132, 72, 64, 1),
    (384, 4096, 1536): (132, 72, 64, 1),
    (1024, 4096, 8): (48, 8, 64, 3),
    (1024, 4096, 1024): (128, 128, 64, 1),
    (4096, 1536, 64): (88, 64, 48, 1),
}


@dataclass(frozen=True)
class LibraryGrid:
    """A library GEMM's grid.

    Attributes:
        ctas: CTAs of its main kernel (``pieces x splits``).
        tile_n: output columns per CTA.
        tile_m: output rows per CTA.
        splits: parts its reduction is split into (1: unsplit).
        operand_elements: elements of A and B one CTA loads (``(min(tile_n, N) + min(tile_m, M)) x K / splits``).
    """

    ctas: int
    tile_n: int
    tile_m: int
    splits: int
    operand_elements: float


def splits_k(rows: int, cols: int, depth: int, total_sms: int) -> bool:
    """Whether cuBLAS splits the reduction of a ``rows x depth x cols`` GEMM on a GPU of ``total_sms`` SMs
    (:data:`SPLIT_K_BANDS`; a GEMV by :data:`SKINNY_SPLIT_SHARE`)."""
    bands = [share for k, share in SPLIT_K_BANDS if depth >= k]
    if not bands:
        return False
    tiles = math.ceil(rows / TILE) * math.ceil(cols / TILE)
    share = SKINNY_SPLIT_SHARE if min(rows, cols) <= SKINNY else bands[-1]
    return tiles <= share * total_sms


def _pick(rows: int, cols: int, batch: int, limit: int) -> tuple[int, int, int] | None:
    """``(pieces, tile_n, tile_m)``: the tile of :data:`LIBRARY_TILES` whose grid is the largest not above
    ``limit`` (ties: the smaller tile); ``None`` when none fits."""
    best = None
    for tn, tm in LIBRARY_TILES:
        pieces = batch * math.ceil(cols / tn) * math.ceil(rows / tm)
        if pieces <= limit and (best is None or (pieces, -tn * tm) > (best[0], -best[1] * best[2])):
            best = (pieces, tn, tm)
    return best


def library_grid(f, total_sms: int) -> LibraryGrid | None:
    """The grid cuBLAS launches for the GEMM ``f`` (:class:`~torch_tessera.target.costmodel.LaunchFeatures`) on a
    GPU of ``total_sms`` SMs (module docstring); ``None`` when ``f`` is not a tensor-core library GEMM of known
    ``rows``, ``cols`` and ``depth`` or has more 128 x 128 output tiles than ``total_sms`` (one CTA per tile)."""
    rows, cols, depth = getattr(f, "rows", 0), getattr(f, "cols", 0), f.depth
    if not (f.tensor_core and f.blocks and rows > 0 and cols > 0 and depth > 0) or f.blocks > total_sms:
        return None
    measured = MEASURED_TN_GRIDS.get((rows, depth, cols)) if total_sms == MEASURED_SMS else None
    if measured is not None and f.blocks == math.ceil(rows / TILE) * math.ceil(cols / TILE):
        ctas, tn, tm, splits = measured
        return LibraryGrid(ctas, tn, tm, splits, (min(tn, cols) + min(tm, rows)) * math.ceil(depth / splits))
    if not (rows == 1 or rows >= MEASURED_ROWS) or cols < MEASURED_COLS or depth < MEASURED_DEPTH:
        return None
    batch = max(1, f.blocks // (math.ceil(rows / TILE) * math.ceil(cols / TILE)))
    if splits_k(rows, cols, depth, total_sms):
        limit = total_sms // (2 if depth < SPLIT_K_DEEP else 4)
        picked = _pick(rows, cols, batch, limit) or (
            batch * math.ceil(cols / 192) * math.ceil(rows / 192), 192, 192)
        splits = max(1, min(total_sms // picked[0], depth // SPLIT_K_DEPTH))
    else:
        picked, splits = _pick(rows, cols, batch, total_sms), 1
        if picked is None:  # no tile fits the SMs (cannot happen for <= total_sms tiles of 128 x 128; kept safe)
            return None
    pieces, tn, tm = picked
    return LibraryGrid(pieces * splits, tn, tm, splits, (min(tn, cols) + min(tm, rows)) * math.ceil(depth / splits))
