"""A roofline cost model: predicted seconds of every kernel launch on devices we cannot run on (or have not profiled).

Per launch we count FLOPs and bytes moved (:func:`launch_features`):

* Triton launches: bytes = the sum over distinct tensor arguments of the bytes each view can address (a broadcast view
  counts its storage span, not its element count), for Inductor's pointwise and reduction kernels (``triton_poi_``,
  ``triton_per_``, ``triton_red_``) capped per tensor at the iteration space's elements times the item size (a
  scatter of one token into a KV cache moves one token, not the cache); FLOPs = elements processed
  (``xnumel * ynumel * r0_numel`` from the numel arguments, else the largest view) times the number of ATen ops fused
  in (at least 1).
* Extern launches: GEMMs ``2*M*N*K`` (``+ M*N`` for the bias of addmm/baddbmm, batched for bmm, the groups' rows
  stacked in M for a grouped GEMM), attention
  ``2*B*H*L*S*(E + Ev)`` over ``B*H*L*S`` softmax scores (halved when causal with L == S), convolution ``2 * out elements * C_in/groups * kernel``;
  anything else moves bytes only. Bytes = every distinct tensor view among arguments and outputs.

Time on a device is ``overhead + max(flops / (peak * e_compute), bytes / (bandwidth * e_memory))`` with efficiencies
per kernel class (:class:`KernelClass`), fitted by :func:`calibrate` to measured launches. ``peak`` is the dense
bf16/fp16 tensor-core peak for GEMM and attention on 16-bit inputs, the fp32 peak otherwise.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import torch

from torch_tessera.errors import DeviceUnavailableError
from torch_tessera.lowering.op_class import GEMM_OPS, OpClass, op_name
from torch_tessera.lowering.op_class import classify as classify_launch
from torch_tessera.lowering.program import BufferKind, ExternLaunch, KernelProgram, Launch, TensorArg, TritonLaunch
from torch_tessera.target.costs import CostTable
from torch_tessera.target.devices import DeviceSpec, parse_device
from torch_tessera.target.catalog import CATALOG
from torch_tessera.target.kernelmodel import CALIBRATED, EXTERN_THREADS, TILE, KernelModel
from torch_tessera.target.reuse import reuse_distances
from torch_tessera.target.triton_work import issued_elements, kernel_body, loaded_params, ops_per_element

log = logging.getLogger(__name__)


#: The cost model's kernel classes are the one classifier's (:mod:`torch_tessera.lowering.op_class`).
KernelClass = OpClass
REDUCTION_PARAMS = {"rnumel", "r0_numel", "r1_numel"}
NUMEL_PARAMS = {"xnumel", "ynumel", "znumel"} | REDUCTION_PARAMS
#: Inductor's pointwise / persistent-reduction / looped-reduction kernels: each index of their iteration space
#: (the product of the numel parameters) loads or stores at most about one element of each tensor argument.
ITERATION_BOUND_PREFIXES = ("triton_poi_", "triton_per_", "triton_red_")


def classify(launch: Launch) -> KernelClass:
    """The kernel class of a launch: :func:`torch_tessera.lowering.op_class.classify`."""
    return classify_launch(launch)


@dataclass(frozen=True)
class LaunchFeatures:
    """What the roofline needs to know about one launch.

    Attributes:
        index: launch index in program order.
        kernel_class: see :class:`KernelClass`.
        flops: floating-point operations (a multiply-add counts 2).
        nbytes: bytes read plus bytes written.
        tensor_core: whether the FLOPs run on tensor cores (16-bit GEMM/attention inputs).
        label: kernel name or op, for tables.
        param_bytes: the part of ``nbytes`` in parameter and state buffers (weights, KV caches: resident across calls
            and, all layers together, larger than any L2, so read from DRAM every step).
        blocks: CTAs of the grid (Triton: the launch grid; extern GEMM/attention: 128 x 128 output tiles); 0: unknown.
        threads_per_block: threads of one CTA (Triton: ``num_warps x 32``); 0: unknown.
        dtype: compute dtype, ``"bf16"``, ``"fp16"``, ``"fp32"`` or ``"fp8"``.
        scores: attention score elements (``B*H*L*S``, halved when causal) of a fused attention launch, each an
            exponential and a row max / sum in its softmax; 0 for other launches.
        reuse: per tensor the launch reads, ``(bytes of traffic since its buffer was last touched, bytes)`` in
            program order (:func:`torch_tessera.target.reuse.reuse_distances`); ``None``: the launch alone is known.
        depth: reduction length of an extern GEMM (``K``; a convolution's ``C_in / groups x kernel``), which bounds
            how far a library can split it (split-K); 0: unknown or not a GEMM.
        rows: output rows ``M`` of one product of an extern GEMM (per batch or group), for the library's CTA tile
            (:mod:`torch_tessera.target.library_grid`); 0: unknown (a convolution) or not a GEMM.
        cols: output columns ``N`` of one product of an extern GEMM; 0: unknown or not a GEMM.
        masked: a fused attention that reads an explicit mask (``attn_bias`` / ``attn_mask``: each score loads and
            adds it, and the library runs another kernel: :class:`~torch_tessera.target.kernelmodel.KernelModel`'s
            ``mask_ops``); False for other launches.
        ragged: a fused attention whose query or key length is not a multiple of the 128-row tile, so the library
            runs its bounds-checked kernel (:class:`~torch_tessera.target.kernelmodel.KernelModel`'s ``ragged_ops``);
            False for other launches.
        load_chain: a library kernel whose threads each wait on a chain of loads (PyTorch's depthwise convolution:
            one output per thread, its taps loaded in turn), so each wave of its CTAs lasts a fixed latency
            (:class:`~torch_tessera.target.kernelmodel.KernelModel`'s ``wave_cycles``) whatever its bytes.
        passes: bytes each further streaming kernel of the launch moves (a library call that runs several: cuDNN's
            layout copies around a convolution's GEMM, a separate bias add); each costs a launch of its own.
    """

    index: int
    kernel_class: KernelClass
    flops: float
    nbytes: float
    tensor_core: bool
    label: str
    param_bytes: float = 0.0
    blocks: int = 0
    threads_per_block: int = 0
    dtype: str = "fp32"
    scores: float = 0.0
    reuse: tuple[tuple[float, float], ...] | None = None
    depth: int = 0
    rows: int = 0
    cols: int = 0
    masked: bool = False
    ragged: bool = False
    passes: tuple[float, ...] = ()
    load_chain: bool = False

    @property
    def intensity(self) -> float:
        """Arithmetic intensity, FLOP per byte."""
        return self.flops / self.nbytes if self.nbytes else math.inf


def distinct(tensors: Iterable[TensorArg]) -> list[TensorArg]:
    """The views, each distinct view once (an ``out=`` argument also listed as an output, q = k = v...)."""
    return list(dict.fromkeys(tensors))


def view_bytes(arg: TensorArg) -> int:
    """Bytes a view can address: ``min(numel * itemsize, storage span)`` (broadcast views count their span)."""
    start, end = arg.byte_span
    return min(arg.numel * arg.itemsize, end - start)


def _tensors(obj: Any) -> Iterable[TensorArg]:
    if isinstance(obj, TensorArg):
        yield obj
    elif isinstance(obj, (tuple, list)):
        for o in obj:
            yield from _tensors(o)
    elif isinstance(obj, Mapping):
        for o in obj.values():
            yield from _tensors(o)


def _triton_features(launch: TritonLaunch, kclass: KernelClass, buffers: Mapping[str, Any],
                     kernels: Mapping[str, Any]) -> LaunchFeatures:
    tensors = distinct(launch.tensor_args.values())
    numels = [a.value for n, a in zip(launch.param_names, launch.args)
              if n in NUMEL_PARAMS and isinstance(getattr(a, "value", None), int)]
    elements = math.prod(numels) if numels else max((t.numel for t in tensors), default=0)
    if numels and launch.kernel.startswith(ITERATION_BOUND_PREFIXES):
        # One element per index of the iteration space and tensor: a scatter into a large buffer (the new token's
        # K/V into a static KV cache) moves the scattered elements, not the whole buffer its pointer spans.
        sizes = {t: min(view_bytes(t), elements * t.itemsize) for t in tensors}
    else:
        sizes = {t: view_bytes(t) for t in tensors}
    nbytes = sum(sizes.values())
    dtypes = {t.dtype for t in tensors}
    templated = not launch.kernel.startswith(ITERATION_BOUND_PREFIXES)  # a Triton GEMM/attention template
    tensor_core = templated and kclass in (KernelClass.GEMM, KernelClass.ATTENTION) and bool(
        dtypes & {torch.bfloat16, torch.float16})
    blocks = math.prod(launch.grid) if launch.grid else 0
    config = launch.config or {}
    warps = config.get("num_warps", 4)
    source = kernels.get(launch.kernel)
    body = kernel_body(source.source, launch.kernel) if source is not None else None
    if body is None:  # no source: one operation per fused ATen op and element
        flops = float(elements * max(1, len(launch.provenance.aten_ops)))
    else:
        args = launch.tensor_args
        reduction = math.prod(a.value for n, a in zip(launch.param_names, launch.args)
                              if n in REDUCTION_PARAMS and isinstance(getattr(a, "value", None), int))
        flops = float(issued_elements(blocks, config, reduction, elements) * ops_per_element(body))
        # an in-place argument the kernel loads is read and written
        nbytes += sum(sizes[args[p]] for p in loaded_params(body, tuple(launch.mutated)) if p in args)
    return LaunchFeatures(launch.index, kclass, flops, float(nbytes), tensor_core, launch.kernel,
                          _param_bytes(tensors, buffers, nbytes), int(blocks), int(warps) * 32, _dtype(dtypes))


def _arg(launch: ExternLaunch, name: str, default: Any = None) -> Any:
    """Argument ``name`` of an extern launch, positional or keyword (positions from the op's schema)."""
    if name in launch.kwargs:
        return launch.kwargs[name]
    try:
        names = [a.name for a in launch.overload._schema.arguments]
    except (AttributeError, RuntimeError):
        return default
    if name in names and names.index(name) < len(launch.args):
        return launch.args[names.index(name)]
    return default


def _gemm_flops(name: str, launch: ExternLaunch) -> tuple[float, int, int, int]:
    """``(FLOPs, reduction length K, rows M, columns N)`` of a GEMM-like extern launch (M and N of one product, per
    batch or group; 0 when unknown, as for a convolution); ``(0.0, 0, 0, 0)`` when its shapes are unknown."""
    a = launch.args
    if name in ("mm", "_int_mm", "_scaled_mm") and len(a) >= 2:
        (m, k), (_, n) = a[0].size, a[1].size
        return 2.0 * m * n * k, k, m, n
    if name == "addmm" and len(a) >= 3:
        (m, k), (_, n) = a[1].size, a[2].size
        return 2.0 * m * n * k + m * n, k, m, n
    if name == "_grouped_mm" and len(a) >= 2 and len(a[0].size) == 2 and len(a[1].size) == 3:
        (m, k), (g, _, n) = a[0].size, a[1].size  # rows of every group stacked, one (K, N) weight per group
        return 2.0 * m * n * k, k, math.ceil(m / g) if g else 0, n
    if name == "bmm" and len(a) >= 2:
        (b, m, k), (_, _, n) = a[0].size, a[1].size
        return 2.0 * b * m * n * k, k, m, n
    if name == "baddbmm" and len(a) >= 3:
        (b, m, k), (_, _, n) = a[1].size, a[2].size
        return 2.0 * b * m * n * k + b * m * n, k, m, n
    if name in ("convolution", "_convolution") and launch.outputs and len(a) >= 2:
        per_out = math.prod(a[1].size[1:])  # the weight is (C_out, C_in / groups, *kernel)
        return 2.0 * launch.outputs[0].numel * per_out, per_out, 0, 0
    return 0.0, 0, 0, 0


def _attention_flops(name: str, launch: ExternLaunch) -> tuple[float, float]:
    """``(FLOPs, score elements)`` of a fused attention launch (module docstring); zeros when shapes are unknown."""
    q, k, v = (launch.args + (None, None, None))[:3]
    if not all(isinstance(t, TensorArg) for t in (q, k, v)) or len(q.size) != 4:
        return 0.0, 0.0
    if name in ("_flash_attention_forward", "_efficient_attention_forward"):  # (B, L, H, E) layout
        (b, length, h, e), s, ev = q.size, k.size[1], v.size[3]
    else:  # (B, H, L, E) layout of the scaled_dot_product_* ops
        (b, h, length, e), s, ev = q.size, k.size[2], v.size[3]
    scores = float(b * h * length * s)
    causal = _arg(launch, "is_causal", False)
    if getattr(causal, "value", causal) is True and length == s:
        scores *= 0.5
    return 2.0 * scores * (e + ev), scores


def _attention_ragged(name: str, launch: ExternLaunch) -> bool:
    """Whether a fused attention's query or key length is not a multiple of :data:`TILE` (its last tile of rows or
    keys is partial, and the library runs a kernel that checks bounds on every tile)."""
    q, k = (launch.args + (None, None))[:2]
    if not all(isinstance(t, TensorArg) and len(t.size) == 4 for t in (q, k)):
        return False
    axis = 1 if name in ("_flash_attention_forward", "_efficient_attention_forward") else 2
    return q.size[axis] % TILE != 0 or k.size[axis] % TILE != 0


#: Fused attention ops whose fourth positional argument is the mask (``attn_bias``), for launches whose op schema is
#: not at hand.
MASK_AT_FOUR = ("_scaled_dot_product_cudnn_attention", "_scaled_dot_product_efficient_attention")


def _attention_mask(name: str, launch: ExternLaunch) -> TensorArg | None:
    """The mask tensor (additive or boolean: ``attn_bias`` / ``attn_mask``) a fused attention launch reads; ``None``
    when it has none (a causal flag is not a mask)."""
    for key in ("attn_bias", "attn_mask"):
        m = _arg(launch, key)
        if isinstance(m, TensorArg):
            return m
    a = launch.args
    return a[3] if name in MASK_AT_FOUR and len(a) > 3 and isinstance(a[3], TensorArg) else None


def _extern_features(launch: ExternLaunch, kclass: KernelClass, buffers: Mapping[str, Any]) -> LaunchFeatures:
    name = op_name(launch.op)
    tensors = distinct([*_tensors(launch.args), *_tensors(launch.kwargs), *launch.outputs])
    nbytes = sum(view_bytes(t) for t in tensors)
    scores, depth, rows, cols, masked, ragged = 0.0, 0, 0, 0, False, False
    if name in ("convolution", "_convolution") and len(launch.args) >= 2 and launch.outputs:
        return _convolution_features(launch, kclass, buffers, tensors, nbytes)
    if name in GEMM_OPS:  # a GEMM, or the batched product of a decomposed attention (class attention)
        flops, depth, rows, cols = _gemm_flops(name, launch)
    elif kclass is KernelClass.ATTENTION:
        flops, scores = _attention_flops(name, launch)
        masked = _attention_mask(name, launch) is not None
        ragged = _attention_ragged(name, launch)
    else:
        flops = 0.0
    inputs = [t for t in _tensors(launch.args) if isinstance(t, TensorArg) and t.dtype.is_floating_point]
    tensor_core = flops > 0 and kclass in (KernelClass.GEMM, KernelClass.ATTENTION) and bool(
        inputs and inputs[-1].dtype in (torch.bfloat16, torch.float16))
    out = launch.outputs[0] if launch.outputs else (inputs[-1] if inputs else None)
    blocks = _extern_blocks(name, out, inputs) if flops > 0 else 0
    return LaunchFeatures(launch.index, kclass, flops, float(nbytes), tensor_core, launch.op,
                          _param_bytes(tensors, buffers, nbytes), blocks, EXTERN_THREADS if flops > 0 else 0,
                          _dtype({t.dtype for t in inputs}), scores, depth=int(depth) if flops > 0 else 0,
                          rows=int(rows) if flops > 0 else 0, cols=int(cols) if flops > 0 else 0, masked=masked,
                          ragged=ragged)


#: Threads of a CTA of PyTorch's depthwise convolution kernel, one output element per thread (its grid on the
#: H200's profile: docs/BENCHMARKS.md, kernel cost model).
DEPTHWISE_THREADS = 1024


def _convolution_features(launch: ExternLaunch, kclass: KernelClass, buffers: Mapping[str, Any],
                          tensors: Sequence[TensorArg], nbytes: float) -> LaunchFeatures:
    """Features of an ``aten::convolution`` launch, by the kernels it runs on a GPU (docs/BENCHMARKS.md, kernel cost
    model, convolutions):

    * depthwise (one input channel per group): PyTorch's own kernel, one CUDA-core thread per output element in CTAs
      of :data:`DEPTHWISE_THREADS`, a multiply-add per tap, the bias fused, each thread waiting on its taps' loads
      (``load_chain``);
    * otherwise cuDNN's implicit GEMM, ``M`` = batch x output positions, ``N`` = output channels, ``K`` = input
      channels per group x kernel taps, on tensor cores for 16-bit tensors; when the input is channels-first it first
      copies the input and the weight to channels-last and the output back (a streaming kernel each: ``passes``),
      and PyTorch adds the bias in one more.
    """
    x, w, out = launch.args[0], launch.args[1], launch.outputs[0]
    bias = launch.args[2] if len(launch.args) > 2 and isinstance(launch.args[2], TensorArg) else None
    groups = _arg(launch, "groups", launch.args[8] if len(launch.args) > 8 else 1)
    groups = int(getattr(groups, "value", groups) or 1)
    c_out, per_group = w.size[0], w.size[1] if len(w.size) > 1 else 1
    taps = math.prod(w.size[2:])
    flops = 2.0 * out.numel * per_group * taps
    params = _param_bytes(tensors, buffers, nbytes)
    dtype = _dtype({t.dtype for t in (x, w) if t.dtype.is_floating_point})
    if per_group == 1 and groups > 1:  # depthwise
        return LaunchFeatures(launch.index, kclass, flops, float(nbytes), False, launch.op, params,
                              math.ceil(out.numel / DEPTHWISE_THREADS), DEPTHWISE_THREADS, dtype, load_chain=True)
    rows = out.numel // max(1, c_out)  # batch x output positions
    cols = c_out // groups
    channels_first = len(x.size) > 2 and x.stride[1] != 1
    passes = ()
    if channels_first:
        passes = (2.0 * view_bytes(x), 2.0 * view_bytes(w), 2.0 * view_bytes(out))
    if bias is not None:
        passes += (2.0 * view_bytes(out) + view_bytes(bias),)
    tensor_core = x.dtype in (torch.bfloat16, torch.float16)
    blocks = groups * math.ceil(rows / TILE) * math.ceil(cols / TILE)
    return LaunchFeatures(launch.index, kclass, flops, float(nbytes), tensor_core, launch.op, params, blocks,
                          EXTERN_THREADS, dtype, depth=per_group * taps, rows=rows, cols=cols, passes=passes)


def _extern_blocks(name: str, out: TensorArg | None, inputs: Sequence[TensorArg]) -> int:
    """CTAs of a cuBLAS/FlashAttention launch: 128 x 128 tiles of the output (per batch / head), for waves."""
    if out is None or not out.size:
        return 0
    rows = out.size[-2] if len(out.size) >= 2 else 1
    cols = out.size[-1]
    if name.startswith(("_scaled_dot_product", "scaled_dot_product", "_flash", "_efficient")) and inputs:
        q = inputs[0]  # (B, H, L, E): one CTA per 128 query rows per head
        return int(math.prod(q.size[:-2]) * math.ceil(q.size[-2] / TILE)) if len(q.size) >= 3 else 0
    if name == "_grouped_mm" and len(inputs) >= 2 and len(inputs[1].size) == 3:
        groups = inputs[1].size[0]  # the rows split evenly over the groups (the split is data, unknown here)
        return int(groups * math.ceil(rows / groups / TILE) * math.ceil(cols / TILE))
    batch = math.prod(out.size[:-2]) if len(out.size) > 2 else 1
    return int(batch * math.ceil(rows / TILE) * math.ceil(cols / TILE))


def _dtype(dtypes: Iterable[torch.dtype]) -> str:
    """The compute dtype of a launch from its tensors' dtypes (the narrowest floating one)."""
    ds = set(dtypes)
    if ds & {torch.float8_e4m3fn, torch.float8_e5m2}:
        return "fp8"
    if torch.bfloat16 in ds:
        return "bf16"
    if torch.float16 in ds:
        return "fp16"
    return "fp32"


def _param_bytes(tensors: Sequence[TensorArg], buffers: Mapping[str, Any], nbytes: float) -> float:
    """Bytes of ``tensors`` that live in parameter or state buffers (capped at ``nbytes``)."""
    if not buffers:
        return 0.0
    total = sum(view_bytes(t) for t in tensors
                if getattr(buffers.get(t.buffer), "kind", None) in (BufferKind.PARAMETER, BufferKind.STATE))
    return float(min(total, nbytes))


def program_features(program: KernelProgram) -> tuple[LaunchFeatures, ...]:
    """:func:`launch_features` of every launch in program order, with their L2 reuse
    (:func:`torch_tessera.target.reuse.reuse_distances`)."""
    feats = [launch_features(l, program.buffers, program.kernels) for l in program.launches]
    dist = reuse_distances(program, [f.nbytes for f in feats], view_bytes)
    return tuple(replace(f, reuse=r) for f, r in zip(feats, dist))


def launch_features(launch: Launch, buffers: Mapping[str, Any] | None = None,
                    kernels: Mapping[str, Any] | None = None) -> LaunchFeatures:
    """FLOPs, bytes, class, grid and dtype of one launch (see the module docstring for the formulas).

    Args:
        launch: the launch.
        buffers: the program's buffers by name (:attr:`KernelProgram.buffers`), to tell parameter bytes apart;
            ``None``: no byte counts as a parameter's.
        kernels: the program's Triton sources by name (:attr:`KernelProgram.kernels`), for a Triton launch's work per
            element (:mod:`torch_tessera.target.triton_work`); ``None``: one operation per fused ATen op.
    """
    kclass = classify(launch)
    if isinstance(launch, TritonLaunch):
        return _triton_features(launch, kclass, buffers or {}, kernels or {})
    return _extern_features(launch, kclass, buffers or {})


# ------------------------------------------------------------------------------------------------------- the roofline

@dataclass(frozen=True)
class Efficiency:
    """Fractions of a device's peaks a kernel class reaches: ``compute`` of FLOP/s, ``memory`` of bytes/s."""

    compute: float
    memory: float


DEFAULT_EFFICIENCY = {
    KernelClass.GEMM: Efficiency(0.70, 0.75),
    KernelClass.ATTENTION: Efficiency(0.45, 0.70),
    KernelClass.NORM: Efficiency(0.30, 0.60),
    KernelClass.ELEMENTWISE: Efficiency(0.30, 0.70),
    KernelClass.REDUCTION: Efficiency(0.30, 0.60),
    KernelClass.OTHER: Efficiency(0.20, 0.50),
}


@dataclass(frozen=True)
class RooflineModel:
    """Roofline with per-class efficiencies and a per-launch overhead.

    Attributes:
        efficiency: per kernel class.
        overhead_s: fixed seconds per launch (launch latency, tail effects).
        source: where the efficiencies come from (priors, or "calibrated on <device>, N launches").
    """

    efficiency: Mapping[KernelClass, Efficiency] = field(default_factory=lambda: dict(DEFAULT_EFFICIENCY))
    overhead_s: float = 4e-6
    source: str = "prior efficiencies (not calibrated)"

    def predict(self, f: LaunchFeatures, device: DeviceSpec) -> float:
        """Seconds of one launch on ``device``.

        Raises:
            DeviceUnavailableError: the device has no datasheet figures (an unknown GPU model).
        """
        peak = device.peak_bf16_flops if f.tensor_core else device.peak_fp32_flops
        if not (peak > 0 and device.mem_bandwidth > 0):
            raise DeviceUnavailableError(f"{device.name} ({device.model}) has no datasheet peaks: profile it instead "
                                         "of modelling it, or add it to target/catalog.py")
        e = self.efficiency[f.kernel_class]
        return self.overhead_s + max(f.flops / (peak * e.compute), f.nbytes / (device.mem_bandwidth * e.memory))


def _as_spec(d: DeviceSpec | str) -> DeviceSpec:
    return parse_device(d) if isinstance(d, str) else d


def calibrate(measured: Sequence[tuple[LaunchFeatures, float]], device: DeviceSpec | str,
              prior: RooflineModel | None = None, overheads_s: Sequence[float] = (0, 1e-6, 2e-6, 3e-6, 4e-6, 6e-6,
                                                                                      8e-6, 12e-6, 16e-6)) -> RooflineModel:
    """Fit per-class efficiencies and the launch overhead to measured times on one device.

    Minimises the squared log error of predicted vs measured seconds by grid search (efficiencies 0.001..1 on a log
    grid, the overhead from ``overheads_s``). Classes without measurements keep the prior's efficiencies; a tiny pull
    towards the prior breaks ties (e.g. the compute efficiency of a purely memory-bound class).

    Args:
        measured: (features, seconds) pairs measured on ``device``.
        device: where they were measured.
        prior: starting model (default priors when ``None``).
        overheads_s: candidate per-launch overheads, seconds.
    """
    prior = prior or RooflineModel()
    device = _as_spec(device)
    grid = np.logspace(-3, 0, 121)
    by_class: dict[KernelClass, list[tuple[LaunchFeatures, float]]] = {}
    for f, t in measured:
        if t > 0:
            by_class.setdefault(f.kernel_class, []).append((f, t))
    if not by_class:
        return prior
    best: tuple[float, float, dict] | None = None
    for oh in overheads_s:
        total, fitted = 0.0, {}
        for kc, rows in by_class.items():
            peaks = np.array([device.peak_bf16_flops if f.tensor_core else device.peak_fp32_flops for f, _ in rows])
            fl = np.array([f.flops for f, _ in rows]) / peaks
            by = np.array([f.nbytes for f, _ in rows]) / device.mem_bandwidth
            t = np.log(np.array([s for _, s in rows]))
            pred = oh + np.maximum(fl[None, None, :] / grid[:, None, None], by[None, None, :] / grid[None, :, None])
            loss = ((np.log(pred) - t) ** 2).sum(-1)
            p = prior.efficiency[kc]
            loss = loss + 1e-3 * ((np.log(grid) - math.log(p.compute))[:, None] ** 2
                                  + (np.log(grid) - math.log(p.memory))[None, :] ** 2)
            i, j = np.unravel_index(np.argmin(loss), loss.shape)
            total += float(loss[i, j])
            fitted[kc] = Efficiency(float(grid[i]), float(grid[j]))
        if best is None or total < best[0]:
            best = (total, oh, fitted)
    _, oh, fitted = best
    eff = dict(prior.efficiency)
    eff.update(fitted)
    n = sum(len(r) for r in by_class.values())
    log.info("calibrated roofline on %s: %d launches, overhead %.1f us, %s", device.name, n, oh * 1e6,
             {k.value: (round(v.compute, 3), round(v.memory, 3)) for k, v in fitted.items()})
    return replace(prior, efficiency=eff, overhead_s=oh, source=f"calibrated on {device.name} ({device.model}), {n} launches")


def estimate_costs(program: KernelProgram, devices: Sequence[DeviceSpec | str], kernels: Sequence[int] | None = None,
                   model: RooflineModel | KernelModel | None = None) -> CostTable:
    """Predicted seconds of every launch (or of ``kernels``, launch indices) on every device.

    Args:
        program: the kernel program.
        devices: specs or device strings (``"sim:a100"``, ``"cuda:1@24sm"``...).
        kernels: launch indices to cost; all launches when ``None``.
        model: :class:`~torch_tessera.target.kernelmodel.KernelModel` (default: :data:`DEFAULT_MODEL`, the constants
            ``tessera calibrate`` fitted) or a :class:`RooflineModel`.

    Raises:
        DeviceUnavailableError: a device has no datasheet figures.
    """
    specs = [_as_spec(d) for d in devices]
    models = [model or default_model(d) for d in specs]
    by_index = dict(zip((l.index for l in program.launches), program_features(program)))
    wanted = list(by_index) if kernels is None else list(kernels)
    seconds = np.empty((len(wanted), len(specs)))
    for r, k in enumerate(wanted):
        f = by_index[k]
        for c, d in enumerate(specs):
            seconds[r, c] = models[c].predict(f, d)
    names = sorted({f"{MODEL_LABELS.get(type(m).__name__, type(m).__name__)}: {m.source}" for m in models})
    return CostTable(tuple(d.name for d in specs), tuple(wanted), seconds, source="; ".join(names))


#: How a cost table's ``source`` names the model that made it (read by people: plan summaries, ``explain``).
MODEL_LABELS = {"RooflineModel": "roofline model", "KernelModel": "kernel model"}


def default_model(device: DeviceSpec) -> RooflineModel | KernelModel:
    """:data:`~torch_tessera.target.kernelmodel.CALIBRATED` for a GPU with kernel figures in the catalog, else the
    prior :class:`RooflineModel` (CPU virtual devices, GPUs outside the catalog)."""
    e = CATALOG.get(device.catalog_key or "")
    return CALIBRATED if e is not None and e.kernel is not None else RooflineModel()
