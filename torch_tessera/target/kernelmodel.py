"""The kernel cost model: what a roofline over peak FLOP/s and DRAM bandwidth drops, from datasheet figures.

For one launch (:class:`~torch_tessera.target.costmodel.LaunchFeatures`) on one device, seconds are::

    t = floor + max(latency_cycles / clock, t_tensor, t_cuda, t_memory, t_waves) + sum of t_pass over its passes

    t_tensor = tensor-core FLOPs x power / (tensor peak of the dtype x SM share x eta_tensor x wave efficiency)
               + waves x tile_cycles / clock
               + attention scores x (softmax_ops + mask_ops if masked + ragged_ops if ragged) x power
                 / (special-function rate x SMs x clock x wave efficiency)
    t_cuda   = CUDA-core work     / (fp32 peak x SM share x eta_cuda x wave efficiency)
    t_memory = DRAM bytes / DRAM rate of the occupied SMs + L2 bytes / (l2_bytes_per_clock_per_sm x occupied x clock)

    t_waves  = waves of a library GEMM's grid on the SMs it has
               x (wave_cycles + a CTA's operand bytes / operand_bytes_per_clock_per_sm) / clock
               (a library kernel whose threads wait on a chain of loads: waves of its grid x wave_cycles / clock)
    t_pass   = floor + max(latency_cycles / clock, pass bytes / DRAM rate of all the device's SMs)

    DRAM rate = smooth min(dram_bytes_per_clock_per_sm x occupied SMs x clock, eta_memory x datasheet bandwidth)
    power     = max(1, tensor_power x occupied SMs / all SMs)

where, from the catalog (:class:`~torch_tessera.target.catalog.KernelFigures`, each figure with its source):

* ``clock``: the boost clock, so latency-bound and small kernels run faster on a higher-clocked GPU;
* the kernel's dependent latency (ramp-up, DRAM round trips, tail) overlaps its work: a launch lasts at least that
  latency, and a launch whose work takes longer is bound by the work alone (a small launch costs about the same on a
  partition as on the whole GPU: docs/BENCHMARKS.md, issue 21);
* the tensor-core peak per dtype and generation (bf16/fp16, fp8); CUDA-core work at the fp32 peak (Inductor's
  Triton kernels compute in fp32; fp32 GEMMs run on CUDA cores); the special-function rate per SM
  (:data:`~torch_tessera.target.catalog.SFU_PER_CLOCK_PER_SM`) for a fused attention's softmax, and more per score
  when the attention reads an explicit mask (cuDNN's attention with an additive mask, as the LLMs' static KV caches
  need, ran 1.6-2.0x its time without one on the H200) or a query or key length is not a multiple of the 128-row
  tile (1.1-1.2x: the library's bounds-checked kernel; docs/BENCHMARKS.md, kernel cost model);
* wave quantization: a grid of ``blocks`` CTAs runs in ``ceil(blocks / slots)`` waves over ``slots = SMs x
  resident CTAs per SM`` (resident threads per SM / threads per CTA; one tensor-core tile CTA per SM); a grid smaller
  than ``slots`` spreads over ``min(SMs, blocks)`` SMs, which run at their full rate; a Triton tensor-core GEMM of
  fewer tiles than SMs splits its reduction over the idle ones (split-K);
* DRAM: a few SMs cannot draw the GPU's bandwidth (each keeps a bounded number of loads in flight), so a partition or
  a small grid streams at its SMs' draw, a large one at the DRAM's;
* L2 capacity: reads of buffers touched recently in program order come from L2
  (:mod:`torch_tessera.target.reuse`: the traffic since the buffer was last touched against half the L2); a launch
  known alone takes its activation bytes from L2 when they fit in half of it;
* CUDA-core work: the statements of the Triton kernel's source per element of its padded iteration space
  (:mod:`torch_tessera.target.triton_work`);
* the board power: tensor cores on most of a GPU's SMs draw more than it, and the clock drops (a partition keeps it);
* a library (cuBLAS) GEMM of at most as many 128 x 128 output tiles as the GPU's SMs launches the grid cuBLAS picks
  for the SM count the device reports, which is all of the GPU's also inside a green-context partition
  (:func:`~torch_tessera.target.library_grid.library_grid`: a smaller CTA tile and split-K, about as many CTAs as
  the GPU's SMs); on the partition's SMs that grid runs in ``ceil(CTAs / SMs)`` waves, each lasting one CTA's time:
  ``wave_cycles`` and its operand loads at ``operand_bytes_per_clock_per_sm``, overlapped with the launch's
  streaming (``t_waves`` inside the max); a larger library GEMM runs one CTA per 128 x 128 tile over its whole K;
* a library call that runs several kernels: cuDNN's convolution of a channels-first tensor copies its input and
  weight to channels-last before its implicit GEMM and the output back after it, and PyTorch adds the bias in one more
  kernel (``passes``, each a streaming launch of its own); PyTorch's depthwise convolution keeps one output per thread,
  each waiting on its taps' loads (``load_chain``: a wave of its CTAs lasts ``wave_cycles``; the H200's profile:
  docs/BENCHMARKS.md, kernel cost model);
* the launch floor.

The free constants (:class:`KernelModel` fields) are the ones no datasheet prints: the fractions of the tensor,
CUDA-core and DRAM peaks that real kernels reach, the DRAM and L2 bytes per clock per SM, the latency cycles of a
kernel, of a wave of GEMM tiles and of a wave of a library GEMM's CTAs, the operand bytes per clock such a CTA
loads, the tensor-core power relative to the board's, the softmax's operations per score, what a mask and a ragged
length add to them and the launch floor.
They are fitted once on one GPU and its partitions (``tessera calibrate``) and shared by every GPU: no factor is
fitted per GPU, pair or model. Their values and the fit are in docs/BENCHMARKS.md, kernel cost model.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.lowering.op_class import OpClass
from torch_tessera.target import catalog
from torch_tessera.target.devices import DeviceSpec
from torch_tessera.target.library_grid import library_grid
from torch_tessera.target.reuse import l2_bytes_read

#: Threads of a cuBLAS/FlashAttention CTA (8 warps) and its output tile edge, for grids of extern launches.
EXTERN_THREADS = 256
TILE = 128
#: Share of the L2 that keeps recently touched data for the next launches (the rest holds what is in flight).
L2_REUSE = 0.5
#: Shortest reduction slice of a split-K GEMM CTA (four 128-deep pipeline stages).
SPLIT_K_DEPTH = 512
#: Bytes per element of a GEMM's operands by compute dtype.
ITEMSIZE = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}
#: Exponent of the smooth minimum between the SMs' DRAM draw and the GPU's bandwidth (a shape, not fitted).
KNEE = 4.0


@dataclass(frozen=True)
class KernelModel:
    """The free constants of the kernel cost model (module docstring).

    Attributes:
        eta_tensor: fraction of the tensor-core peak a GEMM/attention reaches.
        eta_cuda: fraction of the CUDA-core peak elementwise/norm/reduction arithmetic reaches.
        eta_memory: fraction of the DRAM bandwidth a streaming kernel reaches.
        dram_bytes_per_clock_per_sm: DRAM bytes per clock one SM can keep moving (its loads in flight over the DRAM
            latency, Little's law): a grid on few SMs cannot draw the GPU's bandwidth.
        l2_bytes_per_clock_per_sm: L2 bytes served per clock per occupied SM.
        latency_cycles: cycles of a kernel's dependent latency (ramp-up, DRAM round trips, tail), at the boost clock:
            the least a launch takes after its floor; its work overlaps it.
        tile_cycles: cycles a wave of tensor-core tiles spends outside its main loop (pipeline fill, epilogue).
        tensor_power: the power tensor cores on every SM draw at the boost clock, as a multiple of the board power (the
            same for every GPU); above 1, a grid on a share ``s`` of the SMs runs at ``1 / (tensor_power x s)`` of the
            boost clock when that is below 1 (a whole GPU slows down under dense GEMMs, a partition does not).
        softmax_ops: special-function-unit operations per attention score (its exponential, and the row max, sum and
            rescale on the same issue slots), not overlapped with the two tensor-core products.
        mask_ops: the same operations a score costs more when the attention reads an explicit mask
            (``LaunchFeatures.masked``: the mask's load and add, and the library's masked kernel).
        ragged_ops: the same operations a score costs more when the attention's query or key length is not a
            multiple of the 128-row tile (``LaunchFeatures.ragged``: the library's bounds-checked kernel).
        wave_cycles: cycles each wave of a library GEMM's grid takes besides its CTAs' operand loads (pipeline fill,
            epilogue, a split's partial sums; :func:`library_waves`); also a wave of a library kernel whose threads
            wait on a chain of loads (``LaunchFeatures.load_chain``).
        operand_bytes_per_clock_per_sm: bytes of A and B per clock one CTA of a library GEMM loads (from L2 and
            DRAM): a wave of its grid lasts ``wave_cycles`` plus its CTA's operand bytes over this.
        floor_s: launch floor, seconds (the same on every GPU: it is the front end's, not the SMs').
        source: where the constants come from.
    """

    eta_tensor: float = 0.7
    eta_cuda: float = 0.3
    eta_memory: float = 0.8
    dram_bytes_per_clock_per_sm: float = 32.0
    l2_bytes_per_clock_per_sm: float = 64.0
    latency_cycles: float = 4000.0
    tile_cycles: float = 1000.0
    tensor_power: float = 1.25
    softmax_ops: float = 2.0
    floor_s: float = 2e-6
    wave_cycles: float = 4000.0
    operand_bytes_per_clock_per_sm: float = 92.0
    mask_ops: float = 2.0
    ragged_ops: float = 1.0
    source: str = "prior constants (not calibrated)"

    def predict(self, f, device: DeviceSpec) -> float:
        """Seconds of one launch ``f`` (:class:`~torch_tessera.target.costmodel.LaunchFeatures`) on ``device``.

        Raises:
            DeviceUnavailableError: the device's GPU has no kernel figures in the catalog.
        """
        e = catalog.CATALOG.get(device.catalog_key or "")
        known = device.peak_bf16_flops > 0 and device.mem_bandwidth > 0  # NaN compares False
        if e is None or e.kernel is None or not device.total_sms or not known:
            raise DeviceUnavailableError(f"{device.name} ({device.model}) has no kernel figures in target/catalog.py: "
                                         "profile it instead of modelling it, or add its figures")
        clock = e.kernel.boost_clock_hz.value
        library = _gemm_library_grid(f, device.total_sms)  # once: the grid's CTAs and its waves both need it
        blocks, slots, occupied, wave_eff = _grid(f, device.sm_count, int(e.kernel.max_threads_per_sm.value),
                                                  library)
        t_tensor = self._tensor_seconds(f, e, device, clock, math.ceil(blocks / slots), occupied, wave_eff)
        t_cuda = f.flops / (e.peak_fp32_flops.value * device.sm_count / device.total_sms * self.eta_cuda * wave_eff) \
            if f.flops and not f.tensor_core else 0.0
        t_memory = self._memory_seconds(f, e, device, clock, occupied)
        t_waves = self._library_wave_seconds(f, library, device, clock)
        if f.load_chain:  # each wave of CTAs waits on its threads' chains of loads
            t_waves = max(t_waves, math.ceil(blocks / slots) * self.wave_cycles / clock)
        t = self.floor_s + max(self.latency_cycles / clock, t_tensor, t_cuda, t_memory, t_waves)
        return t + sum(self._pass_seconds(b, e, device, clock) for b in f.passes)

    def _pass_seconds(self, nbytes: float, e: catalog.CatalogEntry, device: DeviceSpec, clock: float) -> float:
        """Seconds of one streaming kernel of ``nbytes`` on all of ``device``'s SMs (a pass of a library call that
        runs several kernels): its launch floor, then the larger of the kernel latency and its DRAM time."""
        return self.floor_s + max(self.latency_cycles / clock, nbytes / self._dram_rate(e, device, device.sm_count,
                                                                                         clock))

    def _tensor_seconds(self, f, e: catalog.CatalogEntry, device: DeviceSpec, clock: float, waves: int, occupied: int,
                        wave_eff: float) -> float:
        """Tensor-core products, the softmax between them and each wave's tile overhead, at the power-limited clock."""
        if not (f.flops and f.tensor_core):
            return 0.0
        # tensor cores on a large share of the SMs draw more than the board power at the boost clock: the clock drops
        power = max(1.0, self.tensor_power * occupied / device.total_sms)
        share = device.sm_count / device.total_sms
        t = f.flops * power / (_tensor_peak(e, f.dtype) * share * self.eta_tensor * wave_eff)
        if f.scores:  # a fused attention's softmax runs between its two products, on the special-function units
            sfu = catalog.SFU_PER_CLOCK_PER_SM.value * device.sm_count * clock * wave_eff / power
            extra = (self.mask_ops if f.masked else 0.0) + (self.ragged_ops if f.ragged else 0.0)
            t += f.scores * (self.softmax_ops + extra) / sfu
        return t + waves * self.tile_cycles / clock  # each wave of tiles fills its pipeline, writes its tiles once

    def _library_wave_seconds(self, f, grid, device: DeviceSpec, clock: float) -> float:
        """Seconds of a library GEMM's ``grid`` in waves on ``device``'s SMs (:func:`library_waves`); 0 without one."""
        if grid is None:
            return 0.0
        loads = grid.operand_elements * ITEMSIZE.get(f.dtype, 2) / self.operand_bytes_per_clock_per_sm
        return math.ceil(grid.ctas / device.sm_count) * (self.wave_cycles + loads) / clock

    def _memory_seconds(self, f, e: catalog.CatalogEntry, device: DeviceSpec, clock: float, occupied: int) -> float:
        """DRAM bytes at the occupied SMs' draw, plus the bytes L2 serves."""
        l2 = e.kernel.l2_bytes.value * L2_REUSE
        if f.reuse is None:  # the launch alone: its activations come from L2 when they fit in half of it
            activations = max(0.0, f.nbytes - f.param_bytes)
            in_l2 = activations if activations <= l2 else 0.0
        else:  # program order: reads of buffers touched recently enough (torch_tessera.target.reuse)
            in_l2 = min(f.nbytes, l2_bytes_read(f.reuse, l2))
        t = (f.nbytes - in_l2) / self._dram_rate(e, device, occupied, clock)
        return t + (in_l2 / (self.l2_bytes_per_clock_per_sm * occupied * clock) if in_l2 else 0.0)

    def _dram_rate(self, e: catalog.CatalogEntry, device: DeviceSpec, occupied: int, clock: float) -> float:
        """Bytes/s of DRAM ``occupied`` SMs of ``device`` draw (:meth:`dram_bandwidth`, at most the device's)."""
        return min(self.dram_bandwidth(e.mem_bandwidth.value, occupied, clock), device.mem_bandwidth)

    def dram_bandwidth(self, datasheet: float, occupied: int, clock: float) -> float:
        """Bytes/s of DRAM that ``occupied`` SMs at ``clock`` Hz draw from a GPU of ``datasheet`` bytes/s: the smaller
        of what their loads in flight sustain (``dram_bytes_per_clock_per_sm x occupied x clock``) and
        ``eta_memory x datasheet``, joined smoothly (a p-norm with p = :data:`KNEE`: near the knee both limit)."""
        cap = self.eta_memory * datasheet
        draw = self.dram_bytes_per_clock_per_sm * occupied * clock
        if not math.isfinite(draw):
            return cap
        return (draw ** -KNEE + cap ** -KNEE) ** (-1 / KNEE)


def _split_k(f, sms: int, library) -> int:
    """CTAs of a GEMM grid: a library GEMM's as cuBLAS launches it (``library``, its :func:`library_grid`; one CTA per
    128 x 128 tile when that is ``None``: more tiles than the GPU's SMs or unknown rows); a Triton tensor-core GEMM of fewer output tiles than
    SMs splits its reduction (split-K) into up to ``sms // tiles`` parts of at least :data:`SPLIT_K_DEPTH` each;
    other grids as they are."""
    if f.kernel_class != OpClass.GEMM or not f.tensor_core:
        return f.blocks
    if f.depth > 0:
        return library.ctas if library is not None else f.blocks
    if f.blocks >= sms:
        return f.blocks
    depth = f.flops / (2 * f.blocks * TILE * TILE)  # reduction length per output tile
    return f.blocks * max(1, min(sms // f.blocks, int(depth // SPLIT_K_DEPTH)))


def library_waves(f, device: DeviceSpec) -> int:
    """Waves of a library GEMM's grid (:func:`~torch_tessera.target.library_grid.library_grid`, sized for all of the
    GPU's SMs, which is what the device reports also inside a green-context partition) on ``device``'s
    ``sm_count`` SMs, one CTA per SM: ``ceil(CTAs / sm_count)``; 0 for any other launch (a Triton GEMM, a GEMM of
    unknown rows, or of more 128 x 128 tiles than the GPU's SMs)."""
    grid = _gemm_library_grid(f, device.total_sms)
    return math.ceil(grid.ctas / device.sm_count) if grid is not None else 0


def _gemm_library_grid(f, total_sms: int):
    """:func:`~torch_tessera.target.library_grid.library_grid` of a GEMM-class launch; ``None`` for other classes."""
    return library_grid(f, total_sms) if f.kernel_class == OpClass.GEMM else None


def _grid(f, sms: int, threads_per_sm: int, library) -> tuple[int, int, int, float]:
    """``(CTAs, resident CTA slots, occupied SMs, wave efficiency)`` of a launch's grid on ``sms`` SMs (``library``:
    a library GEMM's grid, :func:`_gemm_library_grid`, or ``None``).

    A grid of ``blocks`` CTAs runs in ``ceil(blocks / slots)`` waves over ``slots = SMs x resident CTAs per SM``
    (resident threads per SM / threads per CTA; a tensor-core tile CTA fills an SM's shared memory: one per SM); a grid
    smaller than ``slots`` spreads over ``min(SMs, blocks)`` SMs, each at its full rate. Unknown grids fill one wave.
    """
    threads = f.threads_per_block or (EXTERN_THREADS if f.tensor_core else 128)
    per_sm = 1 if f.tensor_core else max(1, threads_per_sm // threads)
    blocks = _split_k(f, sms, library) if f.blocks else sms * per_sm
    slots = sms * per_sm
    if blocks >= slots:  # full waves and a partial last one
        return blocks, slots, sms, blocks / (math.ceil(blocks / slots) * slots)
    occupied = min(sms, blocks)
    return blocks, slots, occupied, occupied / sms


def _tensor_peak(e: catalog.CatalogEntry, dtype: str) -> float:
    """Tensor-core FLOP/s of the whole GPU for a compute dtype (bf16/fp16, fp8; fp32 GEMMs run on CUDA cores: PyTorch
    leaves TF32 off for matmul). CUDA-core work runs at the fp32 peak for every dtype: Inductor's Triton kernels load
    16-bit tensors and compute in fp32."""
    if dtype in ("bf16", "fp16"):
        return e.peak_bf16_flops.value
    if dtype == "fp8":
        return e.kernel.peak_fp8_flops.value or e.peak_bf16_flops.value
    return e.peak_fp32_flops.value


#: The constants ``tessera calibrate`` fitted on the H200 and its partitions (docs/BENCHMARKS.md, kernel cost model).
CALIBRATED = KernelModel(eta_tensor=1.0, eta_cuda=0.3541, eta_memory=0.7864, dram_bytes_per_clock_per_sm=32.63,
                         l2_bytes_per_clock_per_sm=96.33, latency_cycles=2080.0, tile_cycles=4645.0, tensor_power=1.086,
                         softmax_ops=0.8972, floor_s=4.931e-06, wave_cycles=7209.0, operand_bytes_per_clock_per_sm=108.1,
                         mask_ops=2.071, ragged_ops=0.3687,
                         source="tessera calibrate: H200 whole GPU and 16/24/72-SM partitions, 685 launches of llama, "
                                "dit, mamba and moe timed back to back, and 64 of cuDNN's attention with and without "
                                "a mask")
