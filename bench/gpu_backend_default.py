"""The user's first hour on one GPU (issue 24): HF generate with Llama-3.1-8B's shape, tessera's default against
Inductor's, and the first compile with warm caches.

Per layer count, ONE process (a child of this script) builds ``LlamaForCausalLM`` from the registry's full Llama
config (hidden 4096, 32 heads, 8 KV heads, intermediate 14336, vocab 128256) with ``--layers`` decoder layers and
random bf16 weights (no download), and runs greedy ``generate`` (batch ``--batch``, prompt ``--prompt``, ``--new``
new tokens, static cache, ``model.forward`` compiled with ``dynamic=False``) under three backends, in this order:

* ``inductor``: ``torch.compile`` with Inductor's default;
* ``tessera``: ``backend="tessera"``, no options (the default: CUDA graphs on for GPU devices);
* ``tessera+graphs``: ``options={"cuda_graphs": True}``.

Each case: the first ``generate`` (compile included) is timed, then one warm-up ``generate``; after all cases are
compiled, ``--repeats`` round-robin rounds time one ``generate`` per case each; ``ms_per_token`` is the median
``generate`` wall time over ``--new`` tokens, and ``compile_s`` = first generate - warm-up generate. Tokens are
compared with Inductor's. Then, for the layer counts in ``--warm-layers``, a SECOND fresh process (no in-memory
caches; the disk caches the first one filled are warm) times the first ``generate`` of ``inductor`` and ``tessera``
again. Each case also records the AOTAutograd cache's hits, misses and bypasses, and each tessera case ``explain``
(``"(1 from the compile cache, not traced)"``: the warm path ran, no tracing, no Inductor compile).

Writes ``backend_default.json`` under ``--out`` (and one ``layers_<n>[_warm].json`` per child) and prints a table with
the ratios ``tessera / inductor`` and ``tessera / tessera+graphs`` of ms per token (Must-show: <= 1.0 and within 3 %),
and ``tessera / inductor`` of the warm first compile (Must-show: <= 1.5).

    python bench/gpu_backend_default.py --out $OUT/backend_default --layers 8,32

CPU smoke run of the logic (tiny model, the Triton interpreter; numbers meaningless)::

    python bench/gpu_backend_default.py --out /tmp/bd --layers 1 --device cpu --size tiny --batch 1 --prompt 8 \\
        --new 4 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

CASES = {"inductor": None, "tessera": {}, "tessera+graphs": {"cuda_graphs": True}}


def build_llama(size: str, layers: int, batch: int, prompt: int, device: str):
    """Llama-3.1-8B-shaped ``LlamaForCausalLM`` (registry config ``size``, ``layers`` decoder layers, SDPA, random
    bf16 weights on CUDA / fp32 on CPU, seed 0, eval mode) on ``device``, and ``batch`` random prompts."""
    import torch
    from transformers import LlamaForCausalLM

    from torch_tessera.models import llama_config

    cfg = llama_config(size)
    cfg.num_hidden_layers = layers
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return model, torch.randint(0, cfg.vocab_size, (batch, prompt), device=device)


def timed_generates(model, ids, kw: dict, repeats: int, sync) -> tuple:
    """``model.generate(ids, **kw)`` once (compile included), then ``repeats`` more, under ``torch.no_grad()``,
    recording every warning. Returns ``(last tokens, first generate s, [repeat s], caught warnings)``."""
    import torch

    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sync()
        t0 = time.perf_counter()
        seq = model.generate(ids, **kw)
        sync()
        first = time.perf_counter() - t0
        walls = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            seq = model.generate(ids, **kw)
            sync()
            walls.append(time.perf_counter() - t0)
    return seq, first, walls, caught


def run_cases(args: argparse.Namespace, cases: list[str]) -> dict:
    """One process: build the model once; compile each case in ``cases`` in turn (first generate, compile included,
    then one warm-up generate); then time ``--repeats`` rounds, each round one ``generate`` per case in the same
    order, so clocks, allocator state and background load reach every case alike. The compiled functions live side
    by side (Dynamo keeps one cache entry per backend on the same code), so no case is recompiled in the rounds."""
    import torch
    from torch._dynamo.utils import counters

    import torch_tessera

    model, ids = build_llama(args.size, args.one_layers, args.batch, args.prompt, args.device)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    kw = dict(max_new_tokens=args.new, min_new_tokens=args.new, do_sample=False, cache_implementation="static",
              disable_compile=True)
    orig = model.forward
    out: dict = {"layers": args.one_layers, "torch": torch.__version__, "cases": {},
                 "timing": f"{args.repeats} round-robin rounds over the compiled cases, one generate each"}
    ref = None
    compiled: dict = {}
    torch._dynamo.reset()
    for name in cases:
        opts = CASES[name]
        if opts is None:
            fwd = torch.compile(orig, dynamic=False)
        else:
            fwd = torch.compile(orig, backend="tessera", options=dict(opts), dynamic=False)
        model.forward = fwd
        row: dict = {}
        before = dict(counters["aot_autograd"])
        try:
            seq, first, walls, caught = timed_generates(model, ids, kw, 1, sync)
            row.update(first_generate_s=first, compile_s=first - walls[0],
                       warnings=sorted({f"{w.category.__name__}: {str(w.message)[:300]}" for w in caught
                                        if "tessera" in w.category.__name__.lower()}))
            if ref is None and name == "inductor":
                ref = seq
            row["tokens_equal_inductor"] = None if ref is None else bool(torch.equal(seq, ref))
            if opts is not None:  # "(N from the compile cache, not traced)": the warm path ran
                row["explain"] = str(torch_tessera.explain(fwd))
            # AOTAutograd cache hits / misses / bypasses of this case (a warm tessera compile: hits, no bypass)
            row["aot_autograd_cache"] = {k: v - before.get(k, 0) for k, v in counters["aot_autograd"].items()
                                         if k.startswith("autograd_cache") and v != before.get(k, 0)}
            compiled[name] = fwd
        except Exception as e:  # noqa: BLE001 - a failed case is a result; the others still run
            row["error"] = f"{type(e).__name__}: {str(e)[:2000]}"
        model.forward = orig
        out["cases"][name] = row
        print(f"[layers {args.one_layers}] {name}: " + (row.get("error") or
              f"first generate {row['first_generate_s']:.1f} s, tokens equal {row['tokens_equal_inductor']}"),
              flush=True)
    walls: dict = {name: [] for name in compiled}
    firsts: dict = {name: [] for name in compiled}  # --split: generate stopped after its first token (prefill)
    stop_first = _stop_after_first(ids.shape[1]) if args.split else None
    with torch.no_grad():
        for _ in range(args.repeats):
            for name, fwd in compiled.items():
                model.forward = fwd
                sync()
                t0 = time.perf_counter()
                model.generate(ids, **kw)
                sync()
                walls[name].append(time.perf_counter() - t0)
                if stop_first is not None:
                    t0 = time.perf_counter()
                    model.generate(ids, **kw, stopping_criteria=stop_first)
                    sync()
                    firsts[name].append(time.perf_counter() - t0)
    for name, w in walls.items():
        row = out["cases"][name]
        row.update(generate_s=w, ms_per_token=1e3 * statistics.median(w) / args.new)
        msg = f"[layers {args.one_layers}] {name}: {row['ms_per_token']:.2f} ms/token (median of {len(w)})"
        if firsts[name]:  # decode alone: (whole generate - generate stopped after the prefill's token) / decode steps
            row.update(first_token_generate_s=firsts[name], prefill_ms=1e3 * statistics.median(firsts[name]),
                       decode_ms_per_token=1e3 * (statistics.median(w) - statistics.median(firsts[name]))
                       / (args.new - 1))
            msg += f"; prefill {row['prefill_ms']:.2f} ms, decode {row['decode_ms_per_token']:.3f} ms/token"
        print(msg, flush=True)
    if args.profile:
        with torch.no_grad():
            for name, fwd in compiled.items():
                model.forward = fwd
                try:
                    p = out["cases"][name]["profile"] = _profile_generate(model, ids, kw, sync)
                except Exception as e:  # noqa: BLE001 - a failed profile is a result; timing above stands
                    out["cases"][name]["profile_error"] = f"{type(e).__name__}: {str(e)[:500]}"
                    print(f"[layers {args.one_layers}] {name}: profile failed: {type(e).__name__}: {e}", flush=True)
                    continue
                print(f"[layers {args.one_layers}] {name}: GPU kernels {p['kernel_ms']:.2f} ms over "
                      f"{p['kernels']} launches, memcpy/memset {p['memcpy_ms']:.3f} ms over {p['memcpys']}, "
                      f"wall {p['wall_ms']:.2f} ms", flush=True)
    if args.cprofile_generate:
        with torch.no_grad():
            for name, fwd in compiled.items():
                model.forward = fwd
                out["cases"][name]["cprofile_generate"] = _cprofile_generate(model, ids, kw, sync)
                print(f"[layers {args.one_layers}] {name}: cProfile of one generate saved", flush=True)
    if args.step_loop:
        with torch.no_grad():
            step = _record_decode_step(model, ids, kw, orig)
            for name, fwd in compiled.items():
                model.forward = fwd
                r = out["cases"][name]["step_loop"] = _time_step_loop(fwd, step, args.step_loop, sync, args.new - 2)
                print(f"[layers {args.one_layers}] {name}: decode step alone {r['wall_ms']:.3f} ms with a sync, "
                      f"host {r['host_ms']:.3f} ms per call (no sync), back to back {r['pipelined_ms']:.3f} ms",
                      flush=True)
    model.forward = orig
    return out


def _record_decode_step(model, ids, kw: dict, orig) -> tuple:
    """The arguments of one decode-step ``forward`` call (the second call of a ``generate``) and the static cache's
    write positions at that call: ``(args, kwargs, [(StaticLayer.cumulative_length tensor, its value then)])``."""
    calls: list = []

    def recorder(*a, **k):
        if len(calls) == 1:  # the first decode step: remember where it writes (each call advances it)
            lengths = [layer.cumulative_length for v in k.values() for layer in getattr(v, "layers", ())
                       if hasattr(getattr(layer, "cumulative_length", None), "clone")]
            calls.append((a, dict(k), [(t, t.clone()) for t in lengths]))
        else:
            calls.append(None)
        return orig(*a, **k)

    model.forward = recorder
    try:
        model.generate(ids, **kw)
    finally:
        model.forward = orig
    return calls[1]


def _time_step_loop(fwd, step: tuple, n: int, sync, room: int) -> dict:
    """``fwd(*args, **kwargs)`` of one recorded decode step, ``n`` times each way: with a host sync after every call
    (``wall_ms``: the step as ``generate`` sees it), the host time of the call alone (``host_ms``), and up to
    ``room`` calls (the cache's free slots after the recorded step) back to back with one sync (``pipelined_ms`` per
    call); plus the 22 functions of largest cumulative time and the 14 of largest own time in a ``cProfile`` of 20
    synced calls. Before each timed call (outside the timing) the static cache's write position
    (``StaticLayer.cumulative_length``, advanced by every call) is put back, so every call writes the same slot."""
    import cProfile
    import io
    import pstats

    a, k, lengths = step

    def rewind() -> None:
        for t, v in lengths:
            t.copy_(v)
        sync()

    walls, hosts = [], []
    for i in range(n + 3):
        rewind()
        t0 = time.perf_counter()
        fwd(*a, **k)
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        if i >= 3:
            hosts.append(t1 - t0)
            walls.append(t2 - t0)
    back = max(1, min(n, room))  # the cache has room for the generate's remaining tokens only
    rewind()
    t0 = time.perf_counter()
    for _ in range(back):
        fwd(*a, **k)
    sync()
    pipelined = (time.perf_counter() - t0) / back
    prof = cProfile.Profile()
    for _ in range(20):
        rewind()
        prof.enable()
        fwd(*a, **k)
        sync()
        prof.disable()
    rewind()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(22)
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(14)
    return {"wall_ms": 1e3 * statistics.median(walls), "host_ms": 1e3 * statistics.median(hosts),
            "pipelined_ms": 1e3 * pipelined, "calls": n, "cache_lengths_rewound": len(lengths),
            "cprofile_20_calls": buf.getvalue()[-12000:]}


def _cprofile_generate(model, ids, kw: dict, sync) -> str:
    """One ``generate`` under ``cProfile``: the 45 functions of largest cumulative time and the 30 of largest own
    time (where the host spends a generate's steps outside the compiled forward, and inside it)."""
    import cProfile
    import io
    import pstats

    sync()
    prof = cProfile.Profile()
    prof.enable()
    model.generate(ids, **kw)
    sync()
    prof.disable()
    buf = io.StringIO()
    pstats.Stats(prof, stream=buf).sort_stats("cumulative").print_stats(45)
    pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(30)
    return buf.getvalue()[-30000:]


def _stop_after_first(prompt_len: int):
    """A ``StoppingCriteriaList`` that ends ``generate`` after its first new token (the prefill's), with the same
    static cache shape as the full ``generate`` (so no program is recompiled)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    class _AfterFirst(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.full((input_ids.shape[0],), input_ids.shape[1] > prompt_len, dtype=torch.bool,
                              device=input_ids.device)

    return StoppingCriteriaList([_AfterFirst()])


def _profile_generate(model, ids, kw: dict, sync) -> dict:
    """One ``generate`` under ``torch.profiler`` (CUDA activity): the summed GPU time of kernels and of
    memcpy/memset, their counts, and the 12 kernels of largest total time (name, calls, ms)."""
    from collections import defaultdict

    from torch.profiler import ProfilerActivity, profile

    sync()
    t0 = time.perf_counter()
    import torch

    acts = [ProfilerActivity.CUDA] if torch.cuda.is_available() else [ProfilerActivity.CPU]  # CPU: smoke run only
    with profile(activities=acts) as prof:
        model.generate(ids, **kw)
        sync()
    wall = time.perf_counter() - t0
    kern: dict = defaultdict(lambda: [0, 0.0])
    mem = [0, 0.0]
    for e in prof.events():
        if getattr(e, "device_type", None) is None or str(e.device_type) != "DeviceType.CUDA":
            continue
        us = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
        if "memcpy" in e.name.lower() or "memset" in e.name.lower():
            mem[0] += 1
            mem[1] += us
        else:
            kern[e.name][0] += 1
            kern[e.name][1] += us
    top = sorted(kern.items(), key=lambda kv: -kv[1][1])[:12]
    return {"wall_ms": 1e3 * wall, "kernel_ms": sum(v[1] for v in kern.values()) / 1e3,
            "kernels": sum(v[0] for v in kern.values()), "memcpy_ms": mem[1] / 1e3, "memcpys": mem[0],
            "top": [[k[:120], v[0], v[1] / 1e3] for k, v in top]}


def _child(args: argparse.Namespace, layers: int, cases: list[str], tag: str, timeout: float) -> dict:
    path = Path(args.out) / f"layers_{layers}{tag}.json"
    path.unlink(missing_ok=True)
    cmd = [sys.executable, __file__, "--out", args.out, "--one-layers", str(layers), "--cases", ",".join(cases),
           "--device", args.device, "--size", args.size, "--batch", str(args.batch), "--prompt", str(args.prompt),
           "--new", str(args.new), "--repeats", str(args.repeats), "--result", str(path),
           *(["--split"] if args.split else []), *(["--profile"] if args.profile else []),
           *(["--step-loop", str(args.step_loop)] if args.step_loop else [])]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, timeout=timeout, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as e:
        log = f"timed out after {timeout:.0f} s\n{(e.stdout or b'')!s}"[-4000:]
    (Path(args.out) / f"layers_{layers}{tag}.log").write_text(log)
    res = json.loads(path.read_text()) if path.exists() else {"layers": layers, "error": log[-3000:]}
    res["process_s"] = time.perf_counter() - t0
    return res


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b <= 0 else a / b


def summarize(runs: dict) -> dict:
    """Ratios per layer count (``None`` where a case failed)."""
    table = {}
    for layers, r in runs.items():
        cases = r.get("main", {}).get("cases", {})
        warm = r.get("warm", {}).get("cases", {})
        ms = {k: v.get("ms_per_token") for k, v in cases.items()}
        table[layers] = {
            "ms_per_token": ms,
            "tessera_over_inductor": _ratio(ms.get("tessera"), ms.get("inductor")),
            "tessera_over_graphs": _ratio(ms.get("tessera"), ms.get("tessera+graphs")),
            "tokens_equal": {k: v.get("tokens_equal_inductor") for k, v in cases.items()},
            "warm_compile_s": {k: v.get("compile_s") for k, v in warm.items()},
            "warm_compile_tessera_over_inductor": _ratio(warm.get("tessera", {}).get("compile_s"),
                                                         warm.get("inductor", {}).get("compile_s")),
            "errors": {k: v["error"][:300] for k, v in {**cases, **warm}.items() if "error" in v},
        }
    return table


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, help="directory for backend_default.json and the children's logs")
    ap.add_argument("--layers", default="8,32", help="decoder layer counts, one process each")
    ap.add_argument("--warm-layers", default="8", help="layer counts whose warm-cache first compile is timed")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=32, help="new tokens per generate")
    ap.add_argument("--repeats", type=int, default=3, help="timed generates after the first (median)")
    ap.add_argument("--budget-s", type=float, default=450.0, help="stop starting children after this many seconds")
    ap.add_argument("--split", action="store_true",
                    help="also time generate stopped after its first token: prefill ms and decode ms per token")
    ap.add_argument("--step-loop", type=int, default=0,
                    help="also call one recorded decode step N times per case: synced, host-only, back to back")
    ap.add_argument("--cprofile-generate", action="store_true",
                    help="child mode: one generate per case under cProfile (host time by function), saved in the JSON")
    ap.add_argument("--profile", action="store_true",
                    help="after the rounds, one generate per case under torch.profiler: GPU kernel and memcpy time")
    ap.add_argument("--device", default="cuda", help=argparse.SUPPRESS)  # "cpu": smoke run of the logic
    ap.add_argument("--size", default="full", choices=("full", "tiny"), help=argparse.SUPPRESS)
    ap.add_argument("--one-layers", type=int, default=None, help=argparse.SUPPRESS)  # child mode
    ap.add_argument("--cases", default=",".join(CASES), help=argparse.SUPPRESS)
    ap.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one_layers is not None:  # child: one process, one layer count
        res = run_cases(args, [c for c in args.cases.split(",") if c])
        Path(args.result).write_text(json.dumps(res, indent=1))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    layer_counts = [int(x) for x in args.layers.split(",") if x.strip()]
    warm_counts = {int(x) for x in args.warm_layers.split(",") if x.strip()}
    runs: dict = {}
    left = lambda: args.budget_s - (time.perf_counter() - t_start)  # noqa: E731
    for layers in layer_counts:
        if left() < 30:
            runs[layers] = {"skipped": "time budget spent"}
            continue
        runs[layers] = {"main": _child(args, layers, list(CASES), "", left())}
    for layers in layer_counts:  # second, fresh process: warm disk caches, cold in-memory ones
        if layers in warm_counts and "main" in runs[layers]:
            if left() < 30:
                runs[layers]["warm"] = {"skipped": "time budget spent"}
                continue
            runs[layers]["warm"] = _child(args, layers, ["inductor", "tessera"], "_warm", left())
    report = {"args": vars(args), "runs": runs, "summary": summarize(runs),
              "wall_s": time.perf_counter() - t_start, "env_TORCHINDUCTOR_CACHE_DIR": os.environ.get(
                  "TORCHINDUCTOR_CACHE_DIR")}
    (out / "backend_default.json").write_text(json.dumps(report, indent=1, default=str))
    print(f"\n{'layers':>6} {'inductor':>9} {'tessera':>9} {'+graphs':>9} {'t/ind':>7} {'t/graphs':>8} "
          f"{'warm compile t/ind':>19}  tokens equal")
    for layers, s in report["summary"].items():
        ms = s["ms_per_token"]
        f = lambda v: "-" if v is None else f"{v:.3f}"  # noqa: E731
        print(f"{layers:>6} {f(ms.get('inductor')):>9} {f(ms.get('tessera')):>9} {f(ms.get('tessera+graphs')):>9} "
              f"{f(s['tessera_over_inductor']):>7} {f(s['tessera_over_graphs']):>8} "
              f"{f(s['warm_compile_tessera_over_inductor']):>19}  {s['tokens_equal']}")
        for k, v in s["errors"].items():
            print(f"       error in {k}: {v}")
    print(f"wrote {out / 'backend_default.json'} in {report['wall_s']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
