"""The one kernel classifier: :class:`OpClass` of a launch, from its provenance.

Used by the ``af`` baseline (attention on one device, the rest on the other), by the cost model (which rate bounds
a launch: tensor cores, CUDA cores, DRAM) and by reports (census tables). It lives beside
:mod:`torch_tessera.lowering.program` because it reads nothing but a launch: every stage above (``graph``,
``scheduler``, ``target``'s cost model) imports it from here, so a launch has one class everywhere.

Rules, in order (the first that matches wins):

1. ``gemm``: a GEMM or convolution ATen op (:data:`GEMM_OPS`) called (extern) or generated as a Triton template,
   except a batched product (``bmm``/``baddbmm``) inside an attention module, which is the ``Q K^T`` or ``P V`` of a
   decomposed attention. A GEMM op that Inductor turned into a pointwise or reduction kernel (the rotary
   embedding's ``inv_freq @ positions``) does not run on tensor cores and is classified by the rules below;
2. ``attention``: a fused attention op (``scaled_dot_product_*``, ``_flash_*``...), the batched products of rule 1,
   or a softmax / KV-cache write (``index_copy``, ``index_put``) inside an attention module (the attention side owns
   the cache in attention/FFN disaggregation);
3. ``norm``: a norm op, or Inductor's decomposition of one (``rsqrt`` with ``mean``/``var``/``var_mean``/``sum``/
   ``pow``);
4. ``reduction``: a reduction or softmax op, or a Triton reduction kernel (``triton_red_``/``triton_per_`` or a
   reduction-numel parameter);
5. ``elementwise``: any other Triton kernel; ``other``: any other extern call.
"""

from __future__ import annotations

import enum

from torch_tessera.lowering.program import ExternLaunch, Launch, TritonLaunch


class OpClass(str, enum.Enum):
    """What a launch computes, coarsely; a ``str`` so that DAG attributes and JSON carry its value."""

    GEMM = "gemm"
    ATTENTION = "attention"
    NORM = "norm"
    ELEMENTWISE = "elementwise"
    REDUCTION = "reduction"
    OTHER = "other"


#: Every class value, in display order.
OP_CLASSES = tuple(c.value for c in OpClass)

#: ATen op names (without namespace and overload) per class. Convolutions count as gemm: they are tensor-core bound.
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_scaled_mm", "addmv", "mv",
                      "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "_int_mm", "_grouped_mm"})
BATCHED_GEMM_OPS = frozenset({"bmm", "baddbmm"})
NORM_OPS = frozenset({"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm",
                      "native_group_norm", "batch_norm", "native_batch_norm", "_native_batch_norm_legit",
                      "_native_batch_norm_legit_no_training", "instance_norm"})
NORM_DECOMPOSED = frozenset({"var_mean", "mean", "var", "sum", "pow"})
REDUCTION_OPS = frozenset({"sum", "amax", "amin", "argmax", "argmin", "cumsum", "cumprod", "logcumsumexp", "mean",
                           "max", "min", "prod", "var", "std", "var_mean", "logsumexp", "topk", "sort", "any", "all"})
SOFTMAX_OPS = frozenset({"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"})
#: In-place writes of new K/V rows into a KV cache.
CACHE_WRITE_OPS = frozenset({"index_copy", "index_copy_", "index_put", "index_put_"})
#: Numel parameters of Inductor's reduction kernels.
REDUCTION_PARAMS = frozenset({"rnumel", "r0_numel", "r1_numel"})
_ATTENTION_PREFIXES = ("scaled_dot_product", "_scaled_dot_product", "_flash", "_efficient", "_cudnn_attention")
_ATTENTION_MODULE_WORDS = ("attn", "attention")
_REDUCTION_KERNEL_PREFIXES = ("triton_red_", "triton_per_")
#: Inductor's pointwise and reduction kernels: a GEMM op fused into one of them was decomposed into FMAs.
_DECOMPOSING_KERNEL_PREFIXES = ("triton_poi_", *_REDUCTION_KERNEL_PREFIXES)


def op_name(qualified: str) -> str:
    """``"aten::mm.out"`` / ``"aten.mm.default"`` / ``"mm"`` -> ``"mm"``."""
    parts = qualified.replace("::", ".").split(".")
    return parts[1] if len(parts) > 1 and parts[0] in ("aten", "prims", "quantized", "torch") else parts[0]


def launch_ops(launch: Launch) -> frozenset[str]:
    """Bare names of the ATen ops fused into ``launch`` (plus the called op of an extern launch)."""
    ops = {op_name(o) for o in launch.provenance.aten_ops}
    if isinstance(launch, ExternLaunch):
        ops.add(op_name(launch.op))
    return frozenset(ops)


def in_attention_module(launch: Launch) -> bool:
    """Whether any module path of the launch's provenance names an attention module (``self_attn``, ``attn1``...)."""
    return any(w in p.lower() for p in launch.provenance.module_paths for w in _ATTENTION_MODULE_WORDS)


def classify(launch: Launch) -> OpClass:
    """The class of one launch (rules in the module docstring)."""
    ops = launch_ops(launch)
    in_attention = in_attention_module(launch)
    decomposed = isinstance(launch, TritonLaunch) and launch.kernel.startswith(_DECOMPOSING_KERNEL_PREFIXES)
    gemms = frozenset() if decomposed else ops & GEMM_OPS
    if gemms and not (in_attention and gemms <= BATCHED_GEMM_OPS):
        return OpClass.GEMM
    if gemms or any(o.startswith(_ATTENTION_PREFIXES) for o in ops):
        return OpClass.ATTENTION
    if in_attention and ops & (SOFTMAX_OPS | CACHE_WRITE_OPS):
        return OpClass.ATTENTION
    if ops & NORM_OPS or ("rsqrt" in ops and ops & NORM_DECOMPOSED):
        return OpClass.NORM
    if ops & (REDUCTION_OPS | SOFTMAX_OPS):
        return OpClass.REDUCTION
    if isinstance(launch, TritonLaunch):
        if launch.kernel.startswith(_REDUCTION_KERNEL_PREFIXES) or set(launch.param_names) & REDUCTION_PARAMS:
            return OpClass.REDUCTION
        return OpClass.ELEMENTWISE
    return OpClass.OTHER
