"""Session 19 (analysis): what dropping export's scalar reads removes per registry model, and the VLM's programs.

    python docs/results/2026-12-03-s19/analysis/lowering_check.py

Lowers every tiny registry model (and the static-cache Llama/MoE) without weights, printing the nodes
`drop_scalar_reads` removed (0: the program is what it was before session 19), then the full-size qwen2-vl's prefill
and decode launch counts as `tessera pairs` plans them (from the lowering cache when warm).
"""
import torch_tessera.lowering.fake as fake
from torch_tessera.backend.workload import _cached_build_fn, model_workload
from torch_tessera.fixed_layout import planning_model
from torch_tessera.target.devices import parse_devices

dropped = []
original = fake.drop_scalar_reads


def counting(gm):
    n = original(gm)
    dropped.append(n)
    return n


fake.drop_scalar_reads = counting
for name in ("mlp", "llama", "moe", "mamba", "dit", "qwen2-vl"):
    fake.lower_without_weights(lambda: planning_model(name, "tiny", 1, None))
    print(f"tiny {name}: {dropped[-1]} nodes dropped")
for name in ("llama", "moe"):
    fake.lower_without_weights(_cached_build_fn(name, "tiny", 2, 1, 20))
    print(f"tiny {name}, static KV cache (decode): {dropped[-1]} nodes dropped")
mw = model_workload("qwen2-vl", parse_devices("sim:a100,sim:l40s"))
print("full qwen2-vl: " + ", ".join(f"{role} {len(p.launches)} launches"
                                    for role, p in zip(("prefill", "decode"), mw.programs)))
