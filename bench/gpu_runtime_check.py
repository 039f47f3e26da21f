"""GPU check of the multi-device runtime (run on a CUDA machine; writes JSON + markdown to --out).

1. A Llama-3.1-8B-shaped model (hidden 4096, GQA 32/8 heads, FFN 14336; ``--layers`` decoder layers, random bf16
   weights) lowered with the tessera backend; a decode-shaped forward (batch ``--batch``, one token after a prefix of
   ``--ctx`` tokens is not modelled: this is a full forward of ``--seq`` tokens).
2. Placements over two devices (default ``cuda:0`` and ``cuda:0@72sm``, i.e. the same GPU split by a green context
   when only one GPU is present): all on device 0; attention launches on device 1 (two cuts per layer at least);
   a random placement. Each is compared with eager PyTorch (cosine of logits, argmax agreement).
3. Time per forward of each placement (CUDA events, median of repeats) and the cost per cut edge:
   (t_cut - t_home) / cuts.
4. ``--graph-copies link,push`` (any of ``link``, ``producer``, ``push``): the one-graph rows once per way of copying
   inside the graph (``+graphs`` = ``link``, ``+graphs[push]``...), each compared bitwise with the ``link`` row of
   the same placement, with the number of copies that ran as push kernels. Before the push rows, a child process
   (``--push-preflight``) pushes bytes between every two of the devices' streams (eagerly and inside a graph, at
   several alignments) and checks them, so that a GPU that cannot (an illegal address is fatal to the process) costs
   only the push rows; its result is in ``runtime.json`` (``push_preflight``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
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


#: (source offset, destination offset, bytes) the preflight pushes: 8-byte words with and without head and tail,
#: 4-byte and 1-byte words (addresses in other phases), the hop bench's sizes
PREFLIGHT_CASES = ((0, 0, 8192), (0, 0, 262144), (0, 0, 4 << 20), (3, 3, 1500), (2, 6, 9000), (1, 2, 777))


def push_preflight(devices: str) -> dict:
    """Push bytes from every device's stream to every other GPU's memory, eagerly and replayed from a CUDA graph
    captured on that stream; check each byte (and that nothing outside the range changed)."""
    from torch_tessera.runtime.devices import open_device, parse_devices
    from torch_tessera.runtime.push import peer_access, push_copy

    devs = [open_device(s) for s in parse_devices(devices)]
    out: dict = {"devices": devices, "cases": [], "ok": True}
    for a in devs:
        for b in devs:
            if a.torch_device == b.torch_device:
                continue
            peer = peer_access(a.torch_device.index, b.torch_device.index)
            out["cases"].append({"from": a.name, "to": b.name, "peer_access": peer})
            if not peer:
                out["ok"] = False
                continue
            stream = a.new_stream()
            for so, do, n in PREFLIGHT_CASES:
                src = torch.randint(0, 256, (n + 64,), dtype=torch.uint8, device=a.torch_device)
                for how in ("eager", "graph"):
                    dst = torch.zeros(n + 64, dtype=torch.uint8, device=b.torch_device)
                    torch.cuda.synchronize(a.torch_device)
                    torch.cuda.synchronize(b.torch_device)
                    with a.guard(), torch.cuda.stream(stream):
                        if how == "eager":
                            lay = push_copy(src[so:so + n], dst[do:do + n])
                        else:
                            g = torch.cuda.CUDAGraph()
                            with torch.cuda.graph(g, stream=stream):
                                lay = push_copy(src[so:so + n], dst[do:do + n])
                            g.replay()
                    stream.synchronize()
                    torch.cuda.synchronize(b.torch_device)
                    got, want = dst.cpu(), src.cpu()
                    ok = bool(torch.equal(got[do:do + n], want[so:so + n]) and not got[:do].any()
                              and not got[do + n:].any())
                    out["ok"] &= ok
                    out["cases"].append({"from": a.name, "to": b.name, "how": how, "offsets": [so, do],
                                         "bytes": n, "width": lay.width, "head": lay.head, "tail": lay.tail,
                                         "equal": ok})
    for d in devs:
        d.close()
    return out


def run_preflight(args, out: Path) -> dict:
    """Run :func:`push_preflight` in a child process (an illegal address there leaves this process usable)."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--push-preflight", "--devices", args.devices, "--out",
           str(out)]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        rc, tail = r.returncode, (r.stdout + r.stderr)[-3000:]
    except subprocess.TimeoutExpired as e:
        rc, tail = "timeout", str(e)
    path = out / "push_preflight.json"
    got = json.loads(path.read_text()) if path.exists() and rc == 0 else {}
    return {"rc": rc, "ok": rc == 0 and bool(got.get("ok")), "result": got, "output_tail": tail}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--devices", default="cuda:0,cuda:0@72sm")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--graph-copies", default="link",
                    help="comma-separated ways copies inside the one graph run (the backend's graph_copies option: "
                         "link, producer, push); each gets its own one-graph rows, compared bitwise with link's")
    ap.add_argument("--no-segments", action="store_true", help="skip the graph-per-segment rows")
    ap.add_argument("--push-preflight", action="store_true", help=argparse.SUPPRESS)  # the child of run_preflight
    ap.add_argument("--profile", action="store_true",
                    help="also write the top GPU kernels of 5 calls of 'home +graphs' and of reduce-overhead")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.push_preflight:
        got = push_preflight(args.devices)
        (out / "push_preflight.json").write_text(json.dumps(got, indent=1))
        print(json.dumps(got, indent=1))
        return 0 if got["ok"] else 1
    copies_modes = [m.strip() for m in args.graph_copies.split(",") if m.strip()]
    bad = [m for m in copies_modes if m not in ("link", "producer", "push")]
    if bad or not copies_modes:
        ap.error(f"--graph-copies takes link, producer, push (comma-separated), got {args.graph_copies!r}")
    res: dict = {"args": vars(args), "torch": torch.__version__, "errors": {}}
    if "push" in copies_modes:
        from torch_tessera.runtime.push import PUSH_MAX_BYTES

        res["push_max_bytes"] = PUSH_MAX_BYTES
        res["push_preflight"] = run_preflight(args, out)
        if not res["push_preflight"]["ok"]:
            res["errors"]["push preflight"] = res["push_preflight"]["output_tail"]
            print("push preflight failed; no push rows:\n" + res["push_preflight"]["output_tail"], file=sys.stderr)
            copies_modes.remove("push")
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
        # one graph over both GPUs per way of copying inside it / one graph per segment, copies from Python
        row_suffix = {gc: " +graphs" if gc == "link" else f" +graphs[{gc}]" for gc in copies_modes}
        for key in [*copies_modes, *([] if args.no_segments else ["segments"])]:
            opts = {"cuda_graphs": "segments"} if key == "segments" else {"cuda_graphs": "whole", "graph_copies": key}
            b = RecordingBackend(devices=args.devices, policy="home", **opts)
            fn = torch.compile(model, backend=b, dynamic=False)
            fn(ids)
            graphed[key] = (fn, b.executors[0])
        cases = [(name, pl, None) for name, pl in placements.items()]
        cases += [(name + row_suffix[gc], pl, gc) for gc in copies_modes for name, pl in placements.items()]
        if not args.no_segments:
            cases += [(name + " +graphs(segments)", pl, "segments") for name, pl in placements.items()]
        plain, outputs = {}, {}
        for name, pl, graphs in cases:
            try:
                compiled_fn, runner = graphed[graphs] if graphs else (compiled, backend.executors[0])
                runner.set_placement(pl)
                y = compiled_fn(ids).float()
                y = compiled_fn(ids).float()  # a replay (the first call after a new placement captures)
                base = name.split(" +")[0]
                if graphs is None:
                    plain[base] = y.clone()
                if graphs not in (None, "segments"):
                    outputs[(base, graphs)] = y.clone()
                state = runner.executor._graphs
                whole = graphs not in (None, "segments") and state is not None and state.whole is not None
                cos = torch.nn.functional.cosine_similarity(y.flatten(), ref.flatten(), dim=0).item()
                agree = (y.argmax(-1) == ref.argmax(-1)).float().mean().item()
                t = timed(lambda: compiled_fn(ids), args.repeats)
                cuts = cut_edge_count(dag, pl)
                rows.append(dict(placement=name, cuts=cuts, cosine=cos, argmax_agreement=agree, ms=t * 1e3,
                                 cut_bytes=runner.executor.bytes_moved["cut"] // max(1, runner.executor.calls),
                                 one_graph=whole, cut_edges_copied=runner.executor.cut_edges_transferred,
                                 bitwise_equal_no_graphs=(bool(torch.equal(y, plain[base])) if base in plain
                                                          else None),
                                 graph_copies=graphs if graphs != "segments" else None,
                                 copies_in_graph=len(state.copies) if whole else None,
                                 push_copies=len(state.pushes) if whole else None, bitwise_equal_link_graph=None))
            except Exception:  # noqa: BLE001 - report and go on
                res["errors"][name] = traceback.format_exc()
                print(res["errors"][name], file=sys.stderr)
        for r in rows:  # each way of copying inside the graph against link's, same placement
            base, gc = r["placement"].split(" +")[0], r["graph_copies"]
            if gc not in (None, "link") and (base, "link") in outputs and (base, gc) in outputs:
                r["bitwise_equal_link_graph"] = bool(torch.equal(outputs[(base, gc)], outputs[(base, "link")]))
        res["rows"] = rows
        if args.profile:
            compiled_g, runner_g = graphed[copies_modes[0]]
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
             "| placement | cut edges | edges copied | cut bytes/call | one graph | copies in graph (push kernels) "
             "| = no graphs (bitwise) | = link graph (bitwise) | cosine vs eager | argmax agreement | ms/forward "
             "| us per cut edge |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        copies = "-" if r["copies_in_graph"] is None else f"{r['copies_in_graph']} ({r['push_copies']})"
        lines.append(f"| {r['placement']} | {r['cuts']} | {r['cut_edges_copied']} | {r['cut_bytes']} | "
                     f"{r['one_graph']} | {copies} | {r['bitwise_equal_no_graphs']} | "
                     f"{'-' if r['bitwise_equal_link_graph'] is None else r['bitwise_equal_link_graph']} | "
                     f"{r['cosine']:.6f} | {r['argmax_agreement']:.4f} | {r['ms']:.2f} | "
                     f"{r.get('us_per_cut_edge', float('nan')):.1f} |")
    if "push_preflight" in res:
        pf = res["push_preflight"]
        lines += ["", f"push preflight (child process, rc {pf['rc']}): "
                      f"{'passed' if pf['ok'] else 'FAILED: no push rows'}; push kernels take cut copies of at most "
                      f"{res['push_max_bytes'] >> 20} MiB"]
    for name, prof in res.get("profile", {}).items():
        lines += ["", f"top GPU time of 5 calls, {name}: total {prof['total_us']:.0f} us, "
                      f"wall {prof['wall_ms']:.2f} ms", "", "| kernel | calls | us |", "| --- | --- | --- |"]
        lines += [f"| {k[:90]} | {c} | {t:.0f} |" for k, c, t in prof["top"]]
    (out / "runtime.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not res["errors"] else 1


if __name__ == "__main__":
    sys.exit(main())
