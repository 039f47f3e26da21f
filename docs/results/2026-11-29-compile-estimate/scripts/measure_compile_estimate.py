"""How big each program of ``tessera bench --measure`` is, lowered without weights on this CPU machine, to estimate
its compile time on a GPU from a program whose GPU compile time was measured.

Each program is built on the meta device exactly as the measured bench builds it (``measure.programs``: the same
wrappers, layer cuts and shapes), lowered through Inductor (``lowering.fake.lower_without_weights``: export + Inductor,
Triton kernels generated for CPU tensors, nothing compiled), and reported as: launches, distinct Triton kernels,
extern calls, and lowering wall seconds. The reference is ``llama-fwd``: the 8-layer Llama forward of 64 x 1 tokens
without a KV cache, whose tessera compile took 15.7 s and 23.5 s on the H200 machine (docs/results/
2026-11-29-h200x2-runtime-check*.md). The GPU compile of another program is estimated as that time scaled by the ratio
of lowering seconds (Inductor's share) and of distinct kernels (Triton's and the PTX analysis' share); both are
printed.

Usage: ``PYTHONPATH=. python docs/results/2026-11-29-compile-estimate/scripts/measure_compile_estimate.py
[--layers 8] [--programs llama-fwd,mamba-decode,...] [--mamba-prefill 16,32]``
"""

from __future__ import annotations

import argparse
import time

import torch

from torch_tessera.lowering.fake import lower_without_weights
from torch_tessera.lowering.program import TritonLaunch
from torch_tessera.measure.programs import cut_layers


def _llama_fwd(layers: int):
    from torch_tessera.models import build_module, get_model

    module = build_module("llama", "full", device="meta")
    cut_layers(module.model, "llm", layers)
    return module, get_model("llama").example_inputs("full", 64, 1, device="meta")


def _llama_kv(layers: int, batch: int, tokens: int, context: int):
    from torch_tessera.models import build_module, get_model
    from torch_tessera.static_cache import StaticCacheLM

    lm = build_module("llama", "full", device="meta").model
    cut_layers(lm, "llm", layers)
    (ids,) = get_model("llama").example_inputs("full", batch, tokens, device="meta")
    pos = torch.arange(context - tokens, context, device="meta").expand(batch, tokens).contiguous()
    return StaticCacheLM(lm, batch, context).eval(), (ids, pos)


def _mamba(layers: int, batch: int, tokens: int):
    from torch_tessera.models import build_module, get_model
    from torch_tessera.ssm_state import SSMStateLM

    lm = build_module("mamba", "full", device="meta").model
    cut_layers(lm, "ssm", layers)
    return SSMStateLM(lm, batch).eval(), get_model("mamba").example_inputs("full", batch, tokens, device="meta")


def _dit(layers: int):
    from torch_tessera.models import build_module, get_model

    module = build_module("dit", "full", device="meta")
    cut_layers(module.model, "diffusion", layers)
    return module, get_model("dit").example_inputs("full", 1, device="meta", dtype=torch.bfloat16)


def programs(layers: int, mamba_prefill: list[int]) -> dict:
    out = {"llama-fwd": lambda: _llama_fwd(layers),
           "llama-prefill": lambda: _llama_kv(layers, 1, 1024, 1088),
           "llama-decode": lambda: _llama_kv(layers, 64, 1, 1088)}
    for t in mamba_prefill:
        out[f"mamba-prefill{t}"] = lambda t=t: _mamba(layers, 1, t)
    out["mamba-decode"] = lambda: _mamba(layers, 64, 1)
    out["dit-denoise"] = lambda: _dit(layers)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--programs", default=None, help="comma-separated names (default: all)")
    parser.add_argument("--mamba-prefill", default="16,32", help="prompt tokens of the Mamba prefill programs")
    args = parser.parse_args()
    table = programs(args.layers, [int(t) for t in args.mamba_prefill.split(",")])
    names = args.programs.split(",") if args.programs else list(table)
    print(f"| program ({args.layers} layers) | launches | distinct Triton kernels | extern calls | lowering s |")
    print("| --- | --- | --- | --- | --- |")
    for name in names:
        t0 = time.perf_counter()
        program = lower_without_weights(table[name]).program
        seconds = time.perf_counter() - t0
        triton = [launch for launch in program.launches if isinstance(launch, TritonLaunch)]
        print(f"| {name} | {len(program.launches)} | {len({launch.kernel for launch in triton})} | "
              f"{len(program.launches) - len(triton)} | {seconds:.1f} |", flush=True)


if __name__ == "__main__":
    main()
