"""Micro-batch pipelining on two devices (issue 5): time per micro-batch with 1, 2, 4 slots, eager and CUDA graphs.

Model: a Llama-3.1-8B-shaped decoder (hidden 4096, GQA 32/8 heads, FFN 14336, vocab 128256; ``--layers`` layers,
random bf16 weights); each micro-batch is a decode-shaped forward of ``--batch`` sequences x ``--seq`` tokens without a
KV cache, with its own random token ids. Placements over the two devices (``--plans``):

* ``dev0`` / ``dev1``: everything on one device (each device alone; ``dev1`` copies the weights there once);
* ``layer``: the first ``--split`` of the decoder layers (and the embedding) on device 0, the rest (and the head) on 1;
* ``af``: attention launches on device 1, everything else on device 0.

For every placement, mode (eager launches; ``+graphs``: CUDA graphs per device segment) and slot count, the time per
micro-batch of ``--microbatches`` micro-batches: ``single`` = one ``PlacedExecutor.run`` per micro-batch (no
pipelining), ``slots=k`` = ``run_pipelined(..., slots=k)``. Each pipelined output must equal the single call's
(``torch.testing.assert_close``; the maximum difference is recorded). Writes ``pipeline.json`` and ``pipeline.md`` to
``--out``.

GPU (two H200, the second restricted to 72 SMs by a green context)::

    python3 bench/gpu_pipeline.py --out $OUT/pipe --devices cuda:0,cuda:1@72sm

one GPU: ``--devices cuda:0,cuda:0@72sm``; CPU smoke test of the logic (Triton interpreter, tiny model, no graphs)::

    python bench/gpu_pipeline.py --out /tmp/pipe --devices cpu:0,cpu:1 --tiny --layers 2 --batch 2 --seq 4 \
        --microbatches 4 --slots 1,2 --plans layer,af --repeats 1 --warmup 0

Never imports ``tests/conftest.py`` (it forces the Triton interpreter). A watchdog ends the run after ``--deadline``
seconds with the stacks of all threads instead of hanging; each executor raises ``TransferTimeout`` after
``--timeout`` seconds.
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path



def parse_args(argv=None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="directory for pipeline.json and pipeline.md")
    ap.add_argument("--devices", default="cuda:0,cuda:1@72sm", help="two devices; the first holds the model")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="sequences per micro-batch")
    ap.add_argument("--seq", type=int, default=1, help="tokens per sequence")
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--slots", default="1,2,4")
    ap.add_argument("--plans", default="dev0,dev1,layer,af")
    ap.add_argument("--split", type=float, default=0.5, help="fraction of the layers on device 0 in 'layer'")
    ap.add_argument("--graphs", default="auto", choices=("auto", "on", "off"),
                    help="also time CUDA graphs (auto: when every device is a CUDA device)")
    ap.add_argument("--repeats", type=int, default=10, help="timed runs per case (median)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs per case first")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a call waits for its transfers")
    ap.add_argument("--deadline", type=float, default=540.0, help="seconds before the watchdog ends the run")
    ap.add_argument("--tiny", action="store_true", help="tiny fp32 model (CPU smoke test of the logic)")
    return ap.parse_args(argv)


def build(args, device):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from torch_tessera.models import CausalLMLogits

    if args.tiny:
        dims = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2)
        dtype = torch.float32
    else:
        dims = dict(vocab_size=args.vocab, hidden_size=4096, intermediate_size=14336, num_attention_heads=32,
                    num_key_value_heads=8)
        dtype = torch.bfloat16
    cfg = LlamaConfig(num_hidden_layers=args.layers, max_position_embeddings=4096, rms_norm_eps=1e-5,
                      tie_word_embeddings=False, **dims)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = CausalLMLogits(LlamaForCausalLM(cfg).to(dtype).to(device).eval()).eval()
    gen = torch.Generator().manual_seed(1)
    ids = [torch.randint(0, cfg.vocab_size, (args.batch, args.seq), generator=gen).to(device)
           for _ in range(args.microbatches)]
    return model, ids


def placements(dag, n_layers: int, split: float, names) -> dict:
    """The named placements (launch index -> device index) of the module docstring."""
    nodes = sorted(dag.graph.nodes)
    layer = {v: dag.node(v).layer for v in nodes}
    first_on_1 = round(n_layers * split)
    out = {}
    for name in names:
        if name == "dev0":
            out[name] = {v: 0 for v in nodes}
        elif name == "dev1":
            out[name] = {v: 1 for v in nodes}
        elif name == "layer":
            cut = min((v for v in nodes if layer[v] is not None and layer[v] >= first_on_1), default=nodes[-1] + 1)
            out[name] = {v: int(layer[v] >= first_on_1) if layer[v] is not None else int(v >= cut) for v in nodes}
        elif name == "af":
            out[name] = {v: int(dag.node(v).op_class == "attention") for v in nodes}
        else:
            raise SystemExit(f"unknown plan {name!r}; choose from dev0, dev1, layer, af")
    return out


def record_inputs(compiled, executor_of, first_ids):
    """The program's input list when the compiled model is called on ``first_ids`` (weights, buffers, ids)."""
    import torch

    seen = []
    ex = executor_of()
    run = ex.run
    ex.run = lambda a: (seen.append(list(a)), run(a))[1]
    try:
        with torch.no_grad():
            compiled(first_ids)
    finally:
        del ex.run
    hits = [i for i, a in enumerate(seen[0]) if a is first_ids]
    if len(hits) != 1:
        raise SystemExit(f"token ids found {len(hits)} times among the program's inputs; cannot build micro-batches")
    return seen[0], hits[0]


def timed(fn, repeats: int, sync, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    sync()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(argv=None) -> int:
    args = parse_args(argv)
    on_cpu = all(d.strip().startswith("cpu") for d in args.devices.split(","))
    if on_cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    faulthandler.dump_traceback_later(args.deadline, exit=True)
    import torch

    from torch_tessera.backend.recording import RecordingBackend
    from torch_tessera.runtime.schedule import cut_edge_count

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    graphs = {"on": True, "off": False, "auto": not on_cpu}[args.graphs]
    slot_counts = [int(s) for s in args.slots.split(",")]
    device = "cpu" if on_cpu else args.devices.split(",")[0].split("@")[0]
    res: dict = {"args": vars(args), "torch": torch.__version__, "rows": [], "errors": {}}
    model, ids = build(args, device)

    def sync():
        if not on_cpu:
            torch.cuda.synchronize()

    modes = [False] + ([True] if graphs else [])
    with torch.no_grad():
        t_eager = timed(lambda: [model(x) for x in ids], args.repeats, sync, args.warmup) / len(ids)
        res["eager_ms_per_microbatch"] = t_eager * 1e3
        compiled_by_mode, runners = {}, {}
        for g in modes:
            backend = RecordingBackend(devices=args.devices, policy="home", cuda_graphs=g, timeout_s=args.timeout)
            torch._dynamo.reset()
            t0 = time.perf_counter()
            compiled_by_mode[g] = torch.compile(model, backend=backend, dynamic=False)
            compiled_by_mode[g](ids[0])
            res[f"compile_s{'_graphs' if g else ''}"] = time.perf_counter() - t0
            runners[g] = backend.executors[0]
        dag = runners[False].dag
        res["launches"] = len(runners[False].program.launches)
        plans = placements(dag, args.layers, args.split, args.plans.split(","))
        template, ids_at = record_inputs(compiled_by_mode[False], lambda: runners[False].executor, ids[0])
        batches = []
        for x in ids:
            b = list(template)
            b[ids_at] = x
            batches.append(b)
        for name, pl in plans.items():
            runner = runners[False]
            runner.set_placement(pl)
            ref = [[o.clone() for o in runner.executor.run(b)] for b in batches]  # single calls, no pipelining
            cuts = cut_edge_count(dag, pl)
            for g in modes:
                runner = runners[g]
                runner.set_placement(pl)
                ex = runner.executor
                label = f"{name}{' +graphs' if g else ''}"
                cases = [("single", None)] + [(f"slots={k}", k) for k in slot_counts]
                for case, k in cases:
                    key = f"{label} {case}"
                    try:
                        if k is None:
                            fn = lambda: [ex.run(b) for b in batches]  # noqa: E731
                            got = [[o.clone() for o in ex.run(b)] for b in batches]
                        else:
                            fn = lambda k=k: ex.run_pipelined(batches, slots=k)  # noqa: E731
                            got = ex.run_pipelined(batches, slots=k)
                        diff = max(float((a.float() - r.float()).abs().max()) for o, rr in zip(got, ref)
                                   for a, r in zip(o, rr))
                        for o, rr in zip(got, ref):
                            torch.testing.assert_close(o, rr)
                        per_mb = ex.cut_edges_per_batch if k is not None else [cuts]
                        if any(c != cuts for c in per_mb):
                            raise AssertionError(f"cut edges copied per micro-batch {per_mb}, plan has {cuts}")
                        t = timed(fn, args.repeats, sync, args.warmup) / len(batches)
                        res["rows"].append(dict(plan=name, graphs=g, case=case, slots=k, cuts=cuts,
                                                ms_per_microbatch=t * 1e3, max_abs_diff_vs_single=diff))
                        print(f"{key}: {t * 1e3:.3f} ms per micro-batch (max diff {diff:.2e})", flush=True)
                    except Exception:  # noqa: BLE001 - report and go on with the other cases
                        res["errors"][key] = traceback.format_exc()
                        print(res["errors"][key], file=sys.stderr, flush=True)
    _derive(res)
    (out / "pipeline.json").write_text(json.dumps(res, indent=1))
    md = _markdown(res, args)
    (out / "pipeline.md").write_text(md)
    print(md)
    faulthandler.cancel_dump_traceback_later()
    return 0 if not res["errors"] else 1


def _derive(res: dict) -> None:
    """Speed-up of each row over its placement's single calls, and over the faster single device (same mode)."""
    rows = res["rows"]
    for r in rows:
        single = next((s for s in rows if s["plan"] == r["plan"] and s["graphs"] == r["graphs"]
                       and s["case"] == "single"), None)
        alone = [s["ms_per_microbatch"] for s in rows if s["plan"] in ("dev0", "dev1") and s["graphs"] == r["graphs"]
                 and s["case"] == "single"]
        r["speedup_vs_single"] = single["ms_per_microbatch"] / r["ms_per_microbatch"] if single else None
        r["speedup_vs_best_device_alone"] = min(alone) / r["ms_per_microbatch"] if alone else None


def _markdown(res: dict, args) -> str:
    shape = "tiny Llama (fp32)" if args.tiny else f"Llama-3.1-8B-shaped, {args.layers} layers, bf16"
    lines = [f"model: {shape}; micro-batch {args.batch} x {args.seq} tokens, {args.microbatches} micro-batches; "
             f"{res.get('launches')} launches; devices {args.devices}; torch {res['torch']}",
             f"eager PyTorch: {res['eager_ms_per_microbatch']:.3f} ms per micro-batch", "",
             "| plan | graphs | run | cut edges | ms / micro-batch | vs single | vs best device alone | max diff |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["rows"]:
        f = lambda v: "-" if v is None else f"{v:.2f}x"  # noqa: E731
        lines.append(f"| {r['plan']} | {'yes' if r['graphs'] else 'no'} | {r['case']} | {r['cuts']} | "
                     f"{r['ms_per_microbatch']:.3f} | {f(r['speedup_vs_single'])} | "
                     f"{f(r['speedup_vs_best_device_alone'])} | {r['max_abs_diff_vs_single']:.1e} |")
    if res["errors"]:
        lines += ["", "errors: " + ", ".join(sorted(res["errors"]))]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
