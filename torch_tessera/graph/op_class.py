"""Kernel classes (gemm, attention, norm, reduction, elementwise, other) from a launch's provenance.

Used by the ``af`` baseline (attention on one device, the rest on the other) and to calibrate the cost model per class.
The rules look at the ATen ops fused into the launch (Inductor decomposes ``layer_norm`` into ``var_mean``/``rsqrt``...,
so norms are recognised by that pattern) and at module paths (a softmax inside an attention module is attention).
"""

from __future__ import annotations

from torch_tessera.lowering.program import ExternLaunch, Launch, TritonLaunch

#: ATen op names (without namespace and overload) per class. Convolutions count as gemm: they are tensor-core bound.
GEMM_OPS = frozenset({"mm", "addmm", "bmm", "baddbmm", "linear", "matmul", "_scaled_mm", "addmv", "mv",
                      "convolution", "_convolution", "conv1d", "conv2d", "conv3d", "_int_mm"})
NORM_OPS = frozenset({"layer_norm", "native_layer_norm", "rms_norm", "_fused_rms_norm", "group_norm",
                      "native_group_norm", "batch_norm", "_native_batch_norm_legit_no_training", "instance_norm"})
REDUCTION_OPS = frozenset({"sum", "amax", "amin", "argmax", "argmin", "cumsum", "cumprod", "logcumsumexp", "mean",
                           "max", "min", "prod", "var", "std", "var_mean", "logsumexp", "topk", "sort", "any", "all"})
SOFTMAX_OPS = frozenset({"_softmax", "softmax", "_log_softmax", "log_softmax", "_safe_softmax"})
_ATTENTION_PREFIXES = ("scaled_dot_product", "_scaled_dot_product", "_flash", "_efficient", "_cudnn_attention")
_ATTENTION_MODULE_WORDS = ("attn", "attention")
#: In-place writes of new K/V rows into a KV cache: attention when inside an attention module (the attention side owns
#: the cache in attention/FFN disaggregation).
CACHE_WRITE_OPS = frozenset({"index_copy", "index_copy_", "index_put", "index_put_"})


def _bare(op: str) -> str:
    """``"aten::mm.out"`` / ``"aten.mm.default"`` / ``"aten.mm"`` -> ``"mm"``."""
    op = op.replace("::", ".")
    parts = op.split(".")
    return parts[1] if len(parts) > 1 and parts[0] in ("aten", "prims", "quantized", "torch") else parts[0]


def op_class(launch: Launch) -> str:
    """The class of one launch (one of :data:`torch_tessera.graph.types.OP_CLASSES`)."""
    ops = {_bare(o) for o in launch.provenance.aten_ops}
    if isinstance(launch, ExternLaunch):
        ops.add(_bare(launch.op))
    if ops & GEMM_OPS:
        return "gemm"
    if any(o.startswith(_ATTENTION_PREFIXES) for o in ops):
        return "attention"
    in_attention = any(w in p.lower() for p in launch.provenance.module_paths for w in _ATTENTION_MODULE_WORDS)
    if ops & (SOFTMAX_OPS | CACHE_WRITE_OPS) and in_attention:
        return "attention"
    if ops & NORM_OPS or ("rsqrt" in ops and ops & {"var_mean", "mean", "var", "sum", "pow"}):
        return "norm"
    if ops & REDUCTION_OPS or ops & SOFTMAX_OPS:
        return "reduction"
    if isinstance(launch, TritonLaunch):
        if launch.kernel.startswith(("triton_red_", "triton_per_")):
            return "reduction"
        return "elementwise"
    return "other"
