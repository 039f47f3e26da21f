"""Warm first compile on CPU: tessera against plain Inductor, each in fresh processes (issue 24).

HF ``LlamaForCausalLM`` (registry config ``tiny``, ``--layers`` layers, SDPA, seed 0), ``model.forward`` compiled with
``dynamic=False``; the first call on a (1, 16) prompt under ``torch.no_grad()`` is timed. Per backend: one cold
process (empty caches of its own), then ``--warm`` processes on the caches it filled. ``--profile`` adds a cProfile of
the last warm tessera process (the top rows by cumulative time, torch_tessera's and the main torch stages).
``compile_s`` (wall) and ``compile_cpu_s`` (this process's CPU time, steadier on a shared machine) are the first call less the median of 3 later calls (on CPU tessera's kernels run in Triton's
interpreter and Inductor's as C++, so the first call alone would compare kernel speeds, not compiles).

    PYTHONPATH=. python docs/results/2026-12-02-aotcache/warm_compile.py --root /tmp/wc --warm 3 --profile
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

STAGES = ("compile_fx_inner", "aot_module_simplified", "try_load", "aot_stage1_graph_capture", "load_with_key",
          "_compile_fx_inner", "fx_codegen_and_compile", "compile_graph", "capture_program", "_compile",
          "_placed_runner", "analyze", "place", "__init__")


def child(backend: str, layers: int, profile: str | None, options: dict) -> None:
    import cProfile
    import pstats

    import torch
    from transformers import LlamaForCausalLM

    import torch_tessera
    from torch_tessera.models import llama_config

    cfg = llama_config("tiny")
    cfg.num_hidden_layers = layers
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (1, 16))
    kw = {"backend": "tessera", "options": options} if backend == "tessera" else {}
    f = torch.compile(m.forward, dynamic=False, **kw)
    # torch.compile() with Inductor imports torch._inductor.compile_fx (about 1 s here) before the timer; with a
    # registered backend that import falls in the first call. Imported for both, so that the first call compares
    # compiles (in bench/gpu_backend_default.py's processes Inductor's case runs first and imports it).
    import torch._inductor.compile_fx  # noqa: F401
    pr = cProfile.Profile() if profile else None
    with torch.no_grad():
        t0, c0 = time.perf_counter(), time.process_time()
        if pr:
            pr.enable()
        out = f(ids).logits
        if pr:
            pr.disable()
        first, first_cpu = time.perf_counter() - t0, time.process_time() - c0
        later, later_cpu = [], []
        for _ in range(3):
            t0, c0 = time.perf_counter(), time.process_time()
            f(ids)
            later.append(time.perf_counter() - t0)
            later_cpu.append(time.process_time() - c0)
        ref = m(ids).logits
    torch.testing.assert_close(out, ref)
    from torch._dynamo.utils import counters

    steady = sorted(later)[1]
    row = {"backend": backend, "first_call_s": first, "steady_call_s": steady, "compile_s": first - steady,
           "compile_cpu_s": first_cpu - sorted(later_cpu)[1],
           "aot": dict(counters["aot_autograd"]),
           "explain": str(torch_tessera.explain(f)) if backend == "tessera" else None}
    if pr:
        pr.dump_stats(profile)
        st = pstats.Stats(pr).stats
        rows = sorted(((v[3], k) for k, v in st.items()
                       if "torch_tessera" in k[0] or k[2] in STAGES and "torch" in k[0]), reverse=True)
        row["profile"] = [f"{ct:7.3f} {k[0].split('/')[-2]}/{k[0].split('/')[-1]}:{k[1]} {k[2]}" for ct, k in rows[:40]]
    print("RESULT " + json.dumps(row), flush=True)


def run(backend: str, root: str, layers: int, profile: str | None = None, options: str = "{}") -> dict:
    env = dict(os.environ, TESSERA_CACHE_DIR=f"{root}/{backend}/tc", TORCHINDUCTOR_CACHE_DIR=f"{root}/{backend}/ic")
    cmd = [sys.executable, __file__, "--child", backend, "--layers", str(layers), "--options", options] + (
        ["--profile", profile] if profile else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1200)
    line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not line:
        raise SystemExit(f"{backend} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(line[-1][len("RESULT "):])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", default="/tmp/wc")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--warm", type=int, default=3)
    ap.add_argument("--profile", nargs="?", const="1", default=None)
    ap.add_argument("--child")
    ap.add_argument("--backends", default="inductor,tessera")
    ap.add_argument("--options", default="{}", help="tessera's options, as JSON (e.g. '{\"devices\": \"cpu:0\"}')")
    args, _ = ap.parse_known_args()
    if args.child:
        return child(args.child, args.layers, args.profile, json.loads(args.options))
    shutil.rmtree(args.root, ignore_errors=True)
    out = {}
    for backend in args.backends.split(","):
        cold = run(backend, args.root, args.layers, options=args.options)
        warm = [run(backend, args.root, args.layers, options=args.options) for _ in range(args.warm)]
        out[backend] = {"cold_s": cold["compile_s"], "warm_s": [w["compile_s"] for w in warm],
                        "warm_cpu_s": [w["compile_cpu_s"] for w in warm],
                        "warm_first_call_s": [w["first_call_s"] for w in warm],
                        "warm_aot": warm[-1]["aot"], "explain": warm[-1]["explain"]}
        print(backend, json.dumps(out[backend]), flush=True)
    if "inductor" in out and "tessera" in out:
        best = {b: min(out[b]["warm_s"]) for b in out}
        med = {b: sorted(out[b]["warm_s"])[len(out[b]["warm_s"]) // 2] for b in out}
        cpu = {b: sorted(out[b]["warm_cpu_s"])[len(out[b]["warm_cpu_s"]) // 2] for b in out}
        print(f"warm compile, process CPU time, median: tessera {cpu['tessera']:.2f} s, inductor "
              f"{cpu['inductor']:.2f} s, ratio {cpu['tessera'] / cpu['inductor']:.2f}")
        print(f"warm compile (first call - steady call), median: tessera {med['tessera']:.2f} s, inductor {med['inductor']:.2f} s, "
              f"ratio {med['tessera'] / med['inductor']:.2f}; best: ratio {best['tessera'] / best['inductor']:.2f}")
    for backend in (args.backends.split(",") if args.profile else ()):
        prof = run(backend, args.root, args.layers, profile=f"{args.root}/prof_{backend}", options=args.options)
        print(f"{backend} warm, profiled: first call {prof['first_call_s']:.2f} s, compile {prof['compile_s']:.2f} s")
        print("\n".join(prof["profile"]))


if __name__ == "__main__":
    main()
