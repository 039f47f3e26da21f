"""One Llama-3.1-8B decoder layer as timed ops, the per-class totals of their measured times, the roofline cost model's
error after calibrating it on one device, and the report as Markdown (``bench/gpu_layer_profile.py`` times them on
GPUs; tests run them on CPU).

Shapes: decode, batch 64 against a 1024-token KV cache; prefill, 4 x 1024 tokens; bf16 (2 bytes per element). Each
:class:`Op` counts its FLOPs and bytes for the cost model.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 4096, 32, 8, 128, 14336, 128256
SHAPES = {"decode b64 ctx1024": dict(batch=64, q_len=1, ctx=1024), "prefill 4x1024": dict(batch=4, q_len=1024, ctx=1024)}
CLASSES = ("gemm", "attention", "norm", "elementwise", "reduction")
BF16 = 2


@dataclass
class Op:
    """One timed op: its class, how often it occurs per layer (or step), and its FLOPs and bytes (for the model)."""

    name: str
    kclass: str
    count: int
    flops: float
    nbytes: float
    tensor_core: bool
    fn: Callable[[int], object]


def build_ops(shape: dict, dev: torch.device) -> list[Op]:
    """The ops of one decoder layer (+ the per-step reductions) at ``shape``, with freshly allocated tensors."""
    b, q_len, ctx = shape["batch"], shape["q_len"], shape["ctx"]
    t = b * q_len
    g = torch.Generator(device=dev).manual_seed(0)

    def rnd(*size):
        return (torch.randn(*size, device=dev, dtype=torch.bfloat16, generator=g) * 0.02)

    qkv_out = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    w_qkv, w_o, w_gu, w_down = rnd(qkv_out, HIDDEN), rnd(HIDDEN, HIDDEN), rnd(2 * FFN, HIDDEN), rnd(HIDDEN, FFN)
    norm_w = torch.ones(HIDDEN, device=dev, dtype=torch.bfloat16)
    x = [rnd(t, HIDDEN) for _ in range(3)]
    h = [rnd(t, HIDDEN) for _ in range(3)]
    act = [rnd(t, FFN) for _ in range(3)]
    gu = [rnd(t, 2 * FFN) for _ in range(3)]
    silu_out = [rnd(t, FFN) for _ in range(3)]
    out_h = torch.empty(t, HIDDEN, device=dev, dtype=torch.bfloat16)
    out_f = torch.empty(t, FFN, device=dev, dtype=torch.bfloat16)
    q = [rnd(b, HEADS, q_len, HEAD_DIM) for _ in range(3)]
    kc, vc = rnd(b, KV_HEADS, ctx, HEAD_DIM), rnd(b, KV_HEADS, ctx, HEAD_DIM)
    k_new = [rnd(b, KV_HEADS, q_len, HEAD_DIM) for _ in range(3)]
    rows = b  # logits of one token per sequence (decode: the new one; prefill: the last one)
    logits = [rnd(rows, VOCAB) for _ in range(2)]
    causal = q_len == ctx

    def gemm(name, w, inputs):
        n, k = w.shape
        return Op(name, "gemm", 1, 2.0 * t * n * k, BF16 * (t * k + n * k + t * n), True,
                  lambda i: F.linear(inputs[i % 3], w))

    attn_flops = 2.0 * b * HEADS * q_len * ctx * 2 * HEAD_DIM * (0.5 if causal else 1.0)
    attn_bytes = BF16 * (2 * b * HEADS * q_len * HEAD_DIM + 2 * b * KV_HEADS * ctx * HEAD_DIM)
    kv_pos = slice(ctx - q_len, ctx)
    return [
        gemm("qkv_proj", w_qkv, x),
        gemm("o_proj", w_o, h),
        gemm("gate_up_proj", w_gu, x),
        gemm("down_proj", w_down, act),
        Op("sdpa_gqa", "attention", 1, attn_flops, attn_bytes, True,
           lambda i: F.scaled_dot_product_attention(q[i % 3], kc, vc, is_causal=causal, enable_gqa=True)),
        Op("rms_norm", "norm", 2, 4.0 * t * HIDDEN, BF16 * (2 * t * HIDDEN + HIDDEN), False,
           lambda i: F.rms_norm(x[i % 3], (HIDDEN,), norm_w, 1e-5)),
        Op("residual_add", "elementwise", 2, 1.0 * t * HIDDEN, BF16 * 3 * t * HIDDEN, False,
           lambda i: torch.add(x[i % 3], h[i % 3], out=out_h)),
        Op("silu", "elementwise", 1, 4.0 * t * FFN, BF16 * 2 * t * FFN, False, lambda i: F.silu(gu[i % 3][:, :FFN])),
        Op("mul", "elementwise", 1, 1.0 * t * FFN, BF16 * 3 * t * FFN, False,
           lambda i: torch.mul(silu_out[i % 3], gu[i % 3][:, FFN:], out=out_f)),
        Op("kv_cache_write", "elementwise", 2, 0.0, BF16 * 2 * b * KV_HEADS * q_len * HEAD_DIM, False,
           lambda i: kc[:, :, kv_pos].copy_(k_new[i % 3])),
        Op("logits_argmax (per step)", "reduction", 1, 1.0 * rows * VOCAB, BF16 * rows * VOCAB, False,
           lambda i: logits[i % 2].argmax(-1)),
        Op("logsumexp (per step)", "reduction", 1, 3.0 * rows * VOCAB, BF16 * rows * VOCAB, False,
           lambda i: torch.logsumexp(logits[i % 2], -1)),
    ]


def class_totals(rows: list[dict]) -> dict:
    totals = {c: 0.0 for c in CLASSES}
    for r in rows:
        totals[r["class"]] += r["seconds"] * r["count"]
    return totals


def model_error(results: dict) -> dict:
    """Calibrate the roofline on the whole GPU's ops; predict every other configuration's ops; report the error."""
    from torch_tessera.target.costmodel import KernelClass, LaunchFeatures, calibrate
    from torch_tessera.target.devices import DeviceSpec, DeviceKind

    def spec_of(cfg: dict) -> DeviceSpec:
        s = dict(cfg["spec"])
        s["kind"] = DeviceKind(s["kind"])
        return DeviceSpec(**s)

    def feats(rows):
        return [(LaunchFeatures(i, KernelClass(r["class"]), r["flops"], r["bytes"], r["tensor_core"], r["op"]),
                 r["seconds"]) for i, r in enumerate(rows)]

    whole = results["configs"]["whole"]
    train = [p for rows in whole["shapes"].values() for p in feats(rows)]
    model = calibrate(train, spec_of(whole))
    report = {"model": {"overhead_us": model.overhead_s * 1e6, "source": model.source,
                        "efficiency": {k.value: [v.compute, v.memory] for k, v in model.efficiency.items()}},
              "configs": {}}
    for label, cfg in results["configs"].items():
        if "shapes" not in cfg:
            continue
        spec = spec_of(cfg)
        rows = []
        for shape_name, shape_rows in cfg["shapes"].items():
            for f, measured in feats(shape_rows):
                predicted = model.predict(f, spec)
                rows.append({"shape": shape_name, "op": f.label, "class": f.kernel_class.value, "measured": measured,
                             "predicted": predicted, "ratio": predicted / measured})
        def pct(subset):  # median and max |log(predicted / measured)|, shown as a percentage
            errs = [abs(math.log(r["ratio"])) for r in subset]
            return 100 * (math.exp(statistics.median(errs)) - 1), 100 * (math.exp(max(errs)) - 1)

        med, worst = pct(rows)
        report["configs"][label] = {
            "rows": rows,
            "median_abs_error_pct": med,
            "max_abs_error_pct": worst,
            "by_class_median_pct": {c: pct([r for r in rows if r["class"] == c])[0] for c in CLASSES
                                    if any(r["class"] == c for r in rows)},
            "calibrated_on_it": label == "whole",
        }
    return report


def markdown(results: dict) -> str:
    lines = [f"# Llama-3.1-8B decoder layer per kernel class ({results['meta']['date']})", "",
             f"Machine: {results['meta'].get('gpus')}; torch {results['meta']['torch']}, "
             f"triton {results['meta'].get('triton')}, cuda-python {results['meta'].get('cuda_python')}.", ""]
    cfgs = {k: v for k, v in results.get("configs", {}).items() if "shapes" in v}
    whole = cfgs.get("whole")
    for shape in SHAPES:
        lines += [f"## {shape}: per-class time, us (ratio to the whole GPU)", "",
                  "| config | SMs | " + " | ".join(CLASSES) + " |", "|---|---|" + "---|" * len(CLASSES)]
        base = class_totals(whole["shapes"][shape]) if whole else None
        for label, cfg in cfgs.items():
            tot = class_totals(cfg["shapes"][shape])
            cells = [f"{tot[c] * 1e6:.1f}" + (f" ({tot[c] / base[c]:.2f}x)" if base and base[c] else "")
                     for c in CLASSES]
            sms = f"{cfg['spec']['sm_count']}" + (f"+{cfg['spec']['throttle_sms']}thr" if cfg["spec"]["throttle_sms"]
                                                   else "")
            lines.append(f"| {label} | {sms} | " + " | ".join(cells) + " |")
        lines += ["", "Per op (us, one call):", "", "| op | class | x | " + " | ".join(cfgs) + " |",
                  "|---|---|---|" + "---|" * len(cfgs)]
        for i, r in enumerate(whole["shapes"][shape] if whole else []):
            cells = [f"{cfg['shapes'][shape][i]['seconds'] * 1e6:.1f}" for cfg in cfgs.values()]
            lines.append(f"| {r['op']} | {r['class']} | {r['count']} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ["## Measured peaks", "", "| config | SMs | bf16 GEMM 8192^3 TFLOP/s | copy GB/s | streamer GB/s |",
              "|---|---|---|---|---|"]
    for label, cfg in cfgs.items():
        p = cfg["peaks"]
        lines.append(f"| {label} | {cfg['spec']['sm_count']} | {p['gemm_tflops']:.0f} | {p['copy_gbps']:.0f} | "
                     f"{cfg.get('streamer_gbps', 0):.0f} |")
    if "links" in results:
        lines += ["", "## Links GPU0 <-> GPU1", "", "| src | dst | method | bytes | us per copy | GB/s |",
                  "|---|---|---|---|---|---|"]
        for r in results["links"]:
            lines.append(f"| {r['src']} | {r['dst']} | {r['method']} | {r['bytes']} | {r['seconds'] * 1e6:.1f} | "
                         f"{r['GB/s']:.1f} |")
    if "model" in results:
        m = results["model"]
        lines += ["", "## Cost model: calibrated on the whole GPU, predicting the others", "",
                  f"Overhead {m['model']['overhead_us']:.1f} us; efficiencies (compute, memory): "
                  + ", ".join(f"{k} ({v[0]:.2f}, {v[1]:.2f})" for k, v in m["model"]["efficiency"].items()), "",
                  "| config | median abs error | max abs error | " + " | ".join(CLASSES) + " |",
                  "|---|---|---|" + "---|" * len(CLASSES)]
        for label, c in m["configs"].items():
            tag = " (training set)" if c["calibrated_on_it"] else ""
            per = [f"{c['by_class_median_pct'][k]:.0f}%" if k in c["by_class_median_pct"] else "-" for k in CLASSES]
            lines.append(f"| {label}{tag} | {c['median_abs_error_pct']:.0f}% | {c['max_abs_error_pct']:.0f}% | "
                         + " | ".join(per) + " |")
    if "triton_on_green_context" in results:
        lines += ["", "## Triton kernel on a green-context stream", ""]
        lines += [f"- {k}: {v}" for k, v in results["triton_on_green_context"].items()]
    if results.get("errors"):
        lines += ["", "## Failures", ""] + [f"- {k}: {v.splitlines()[-1]}" for k, v in results["errors"].items()]
    return "\n".join(lines) + "\n"
