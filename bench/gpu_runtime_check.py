"""GPU check of the multi-device runtime (run on a CUDA machine; writes JSON + markdown to --out).

1. A Llama-3.1-8B-shaped model (hidden 4096, GQA 32/8 heads, FFN 14336; ``--layers`` decoder layers, random bf16
   weights) lowered with the tessera backend; a decode-shaped forward (batch ``--batch``, one token after a prefix of
   ``--ctx`` tokens is not modelled: this is a full forward of ``--seq`` tokens).
2. Placements over two devices (default ``cuda:0`` and ``cuda:0@72sm``, i.e. the same GPU split by a green context
   when only one GPU is present): all on device 0; attention launches on device 1 (two cuts per layer at least);
   a random placement. Each is compared with eager PyTorch (cosine of logits, argmax agreement).
3. Time per forward of each placement (CUDA events, median of repeats) and the cost per cut edge:
   (t_cut - t_home) / cuts.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from torch_tessera.backend.recording import RecordingBackend  # noqa: E402


def build(layers: int, seq: int, batch: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    from torch_tessera.models import CausalLMLogits

    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=layers,
                      num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=4096,
                      rms_norm_eps=1e-5, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(torch.bfloat16).cuda().eval()
    ids = torch.randint(0, cfg.vocab_size, (batch, seq), device="cuda")
    return CausalLMLogits(model).eval(), ids


def timed(fn, repeats: int) -> float:
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def kernel_profile(fn, calls: int = 5) -> dict:
    """GPU time per kernel name over ``calls`` calls (torch.profiler), the 15 largest, and the wall time per call."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
            torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / calls
    rows = []
    for e in prof.key_averages():
        dev_us = getattr(e, "self_device_time_total", None)
        if dev_us is None:
            dev_us = getattr(e, "self_cuda_time_total", 0)
        if dev_us > 0:
            rows.append((e.key, e.count, dev_us / calls))
    rows.sort(key=lambda r: -r[2])
    return {"top": rows[:15], "total_us": sum(r[2] for r in rows), "wall_ms": wall * 1e3}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--devices", default="cuda:0,cuda:0@72sm")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--graph-copies", default="link", choices=("link", "producer"),
                    help="where copies inside the one graph run (the backend's graph_copies option)")
    ap.add_argument("--profile", action="store_true",
                    help="also write the top GPU kernels of 5 calls of 'home +graphs' and of reduce-overhead")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res: dict = {"args": vars(args), "torch": torch.__version__, "errors": {}}
    from torch_tessera.runtime.runner import random_placement
    from torch_tessera.runtime.schedule import cut_edge_count

    model, ids = build(args.layers, args.seq, args.batch)
    with torch.no_grad():
        ref = model(ids).float()
        t_eager = timed(lambda: model(ids), args.repeats)
        backend = RecordingBackend(devices=args.devices, policy="home")
        t0 = time.perf_counter()
        compiled = torch.compile(model, backend=backend, dynamic=False)
        got = compiled(ids).float()
        res["compile_s"] = time.perf_counter() - t0
        runner = backend.executors[0]
        dag = runner.dag
        n = len(runner.program.launches)
        res["launches"] = n
        inductor = torch.compile(model, backend="inductor", dynamic=False)
        inductor(ids)
        t_inductor = timed(lambda: inductor(ids), args.repeats)
        ro = torch.compile(model, mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            ro(ids)
        t_ro = timed(lambda: ro(ids), args.repeats)
        attn = {v for v, d in dag.graph.nodes(data=True) if d["op_class"] == "attention"}
        placements = {
            "home": {i: 0 for i in range(n)},
            "attention-on-1": {i: (1 if i in attn else 0) for i in range(n)},
            "random": random_placement(dag, 2, 0),
        }
        rows = []
        graphed = {}
        for mode in ("whole", "segments"):  # one graph over both GPUs / one graph per segment, copies from Python
            extra = {"graph_copies": args.graph_copies} if mode == "whole" else {}
            b = RecordingBackend(devices=args.devices, policy="home", cuda_graphs=mode, **extra)
            fn = torch.compile(model, backend=b, dynamic=False)
            fn(ids)
            graphed[mode] = (fn, b.executors[0])
        cases = [(name, pl, None) for name, pl in placements.items()]
        cases += [(name + " +graphs", pl, "whole") for name, pl in placements.items()]
        cases += [(name + " +graphs(segments)", pl, "segments") for name, pl in placements.items()]
        plain = {}
        for name, pl, graphs in cases:
            try:
                compiled_fn, runner = graphed[graphs] if graphs else (compiled, backend.executors[0])
                runner.set_placement(pl)
                y = compiled_fn(ids).float()
                y = compiled_fn(ids).float()  # a replay (the first call after a new placement captures)
                base = name.split(" +")[0]
                if graphs is None:
                    plain[base] = y.clone()
                whole = graphs == "whole" and runner.executor._graphs is not None and \
                    runner.executor._graphs.whole is not None
                cos = torch.nn.functional.cosine_similarity(y.flatten(), ref.flatten(), dim=0).item()
                agree = (y.argmax(-1) == ref.argmax(-1)).float().mean().item()
                t = timed(lambda: compiled_fn(ids), args.repeats)
                cuts = cut_edge_count(dag, pl)
                rows.append(dict(placement=name, cuts=cuts, cosine=cos, argmax_agreement=agree, ms=t * 1e3,
                                 cut_bytes=runner.executor.bytes_moved["cut"] // max(1, runner.executor.calls),
                                 one_graph=whole, cut_edges_copied=runner.executor.cut_edges_transferred,
                                 bitwise_equal_no_graphs=(bool(torch.equal(y, plain[base])) if base in plain
                                                          else None)))
            except Exception:  # noqa: BLE001 - report and go on
                res["errors"][name] = traceback.format_exc()
                print(res["errors"][name], file=sys.stderr)
        res["rows"] = rows
        if args.profile:
            compiled_g, runner_g = graphed["whole"]
            runner_g.set_placement(placements["home"])
            compiled_g(ids)
            res["profile"] = {"home +graphs": kernel_profile(lambda: compiled_g(ids)),
                              "reduce-overhead": kernel_profile(lambda: ro(ids))}
        res["eager_ms"], res["inductor_ms"], res["reduce_overhead_ms"] = t_eager * 1e3, t_inductor * 1e3, t_ro * 1e3
        res["first_call_cosine"] = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item()
        for r in rows:
            suffix = r["placement"][len(r["placement"].split(" +")[0]):]
            base = next((h for h in rows if h["placement"] == "home" + suffix), None)
            if base and r["cuts"]:
                r["us_per_cut_edge"] = (r["ms"] - base["ms"]) * 1e3 / r["cuts"]
    (out / "runtime.json").write_text(json.dumps(res, indent=1))
    lines = [f"model: Llama-3.1-8B-shaped, {args.layers} layers, bf16, batch {args.batch} x seq {args.seq}; "
             f"{res['launches']} launches; devices {args.devices}; torch {torch.__version__}",
             f"eager {res['eager_ms']:.2f} ms, Inductor {res['inductor_ms']:.2f} ms, reduce-overhead "
             f"{res['reduce_overhead_ms']:.2f} ms, tessera compile {res['compile_s']:.1f} s", "",
             "| placement | cut edges | edges copied | cut bytes/call | one graph | = no graphs (bitwise) | cosine vs eager "
             "| argmax agreement | ms/forward | us per cut edge |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['placement']} | {r['cuts']} | {r['cut_edges_copied']} | {r['cut_bytes']} | "
                     f"{r['one_graph']} | {r['bitwise_equal_no_graphs']} | {r['cosine']:.6f} | "
                     f"{r['argmax_agreement']:.4f} | {r['ms']:.2f} | {r.get('us_per_cut_edge', float('nan')):.1f} |")
    for name, prof in res.get("profile", {}).items():
        lines += ["", f"top GPU time of 5 calls, {name}: total {prof['total_us']:.0f} us, "
                      f"wall {prof['wall_ms']:.2f} ms", "", "| kernel | calls | us |", "| --- | --- | --- |"]
        lines += [f"| {k[:90]} | {c} | {t:.0f} |" for k, c, t in prof["top"]]
    (out / "runtime.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
