"""GPU check of the multi-device runtime (run on a CUDA machine; writes JSON + markdown to --out).

1. A Llama-3.1-8B-shaped model (hidden 4096, GQA 32/8 heads, FFN 14336; ``--layers`` decoder layers, random bf16
   weights) lowered with the tessera backend; a decode-shaped forward (batch ``--batch``, one token after a prefix of
   ``--ctx`` tokens is not modelled: this is a full forward of ``--seq`` tokens).
2. Placements over two devices (default ``cuda:0`` and ``cuda:0@72sm``, i.e. the same GPU split by a green context
   when only one GPU is present): all on device 0; attention launches on device 1 (two cuts per layer at least);
   a random placement. Each is compared with eager PyTorch (cosine of logits, argmax agreement).
3. Time per forward of each placement and the cost per cut edge. The model is lowered once; every row is its own
   executor of that program (``runner.set_placement``). Rows without graphs (tens of ms per call) are timed one after
   another (median of ``--repeats``). The graph rows and ``torch.compile(mode="reduce-overhead")`` are timed in
   ``--rounds`` interleaved rounds of ``--calls`` calls each (order reversed every round,
   ``torch_tessera.measure.paired_timing``),
   so machine drift hits all of them alike; per round, (placement - home of the same mode) / cut edges and home /
   reduce-overhead, reported as median [quartiles] over rounds, with a verdict on the 3 % target.
   With devices that are whole GPUs of one model (``--devices cuda:0,cuda:1``), every kernel costs the same on either
   device and the per-cut-edge figure IS the hop cost. With a partition (``cuda:1@72sm``) it mixes the hop with the
   moved kernels' speed there; unless ``--no-compute-correction``, every launch is also timed on every device (one
   by one, calibrated to the program replayed as one graph on that device: ``measure.profile.profile_on_device``) and
   'hop est.' subtracts the placement's compute difference before dividing by the cut edges.
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
import tempfile
import time
import traceback
from pathlib import Path

import torch

from torch_tessera.backend.recording import RecordingBackend


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
    from torch_tessera.target.devices import open_device, parse_devices
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


#: row suffix -> (runner.cuda_graphs, runner.graph_copies) for each way of running a placement
def row_modes(copies_modes: list[str], segments: bool) -> dict[str, tuple]:
    """The ways each placement runs, by row suffix: no graphs, one graph per way of copying, a graph per segment."""
    modes: dict[str, tuple] = {"": (False, "link")}
    for gc in copies_modes:
        modes[" +graphs" if gc == "link" else f" +graphs[{gc}]"] = ("whole", gc)
    if segments:
        modes[" +graphs(segments)"] = ("segments", "link")
    return modes


def sync_time(fn) -> float:
    """Seconds of ``fn(); torch.cuda.synchronize()``."""
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def launch_costs(model, ids, compiled, runner, ex, args) -> list[dict]:
    """Per-launch seconds on every device (``measure.profile.profile_on_device``: one by one, calibrated to the
    program replayed as one graph on that device), launch index -> seconds, one dict per device."""
    from torch_tessera.measure.profile import profile_on_device
    from torch_tessera.measure.programs import Compiled
    from torch_tessera.measure.settings import MeasureSettings

    seen: dict = {}
    runner.executor = lambda a: (seen.__setitem__("args", list(a)), ex(a))[1]
    try:
        compiled(ids)
    finally:
        runner.executor = ex
    prog = Compiled(name="forward", module=model, inputs=(ids,), runner=runner, args=seen["args"],
                    restore=lambda: None)
    settings = MeasureSettings(model="llama", devices=args.devices, size="full", profile_repeats=10,
                               profile_warmup=2, profile_cache=tempfile.mkdtemp(prefix="rt_profiles_"))
    cols = [profile_on_device(prog, g, settings) for g in range(len(runner.devices))]
    return [{int(k): float(t) for k, t in zip(c.kernels, c.seconds)} for c in cols]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--devices", default="cuda:0,cuda:0@72sm")
    ap.add_argument("--repeats", type=int, default=20, help="timed calls of eager, Inductor and the rows without graphs")
    ap.add_argument("--rounds", type=int, default=30,
                    help="interleaved rounds over every graph row and reduce-overhead (order reversed every round)")
    ap.add_argument("--calls", type=int, default=10, help="timed calls of each graph row per round (median kept)")
    ap.add_argument("--graph-copies", default="link",
                    help="comma-separated ways copies inside the one graph run (the backend's graph_copies option: "
                         "link, producer, push); each gets its own one-graph rows, compared bitwise with link's")
    ap.add_argument("--no-segments", action="store_true", help="skip the graph-per-segment rows")
    ap.add_argument("--no-compute-correction", action="store_true",
                    help="skip timing every launch on every device (the hop estimate that subtracts the moved "
                         "kernels' speed difference)")
    ap.add_argument("--push-preflight", action="store_true", help=argparse.SUPPRESS)  # the child of run_preflight
    ap.add_argument("--profile", action="store_true",
                    help="also write the top GPU kernels of 5 calls of 'home +graphs' and of reduce-overhead")
    args = ap.parse_args()
    if args.rounds < 1 or args.calls < 1 or args.repeats < 1:
        ap.error("--rounds, --calls and --repeats must be >= 1")
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
    from torch_tessera.measure.paired_timing import (compute_difference_s, interleaved_rounds, judge_ratio,
                                                     paired_ratios, per_cut_us, spread, whole_identical)

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
        runner = backend.executors[0]  # one lowering; each row gets its own executor (runner.set_placement)
        dag = runner.dag
        n = len(runner.program.launches)
        res["launches"] = n
        identical, why = whole_identical([d.spec for d in runner.devices])
        res["devices_identical"], res["devices_identical_reason"] = identical, why
        inductor = torch.compile(model, backend="inductor", dynamic=False)
        inductor(ids)
        t_inductor = timed(lambda: inductor(ids), args.repeats)
        ro = torch.compile(model, mode="reduce-overhead", dynamic=False)
        for _ in range(3):
            ro(ids)
        attn = {k.index for k in dag.nodes() if k.op_class == "attention"}
        placements = {
            "home": {i: 0 for i in range(n)},
            "attention-on-1": {i: (1 if i in attn else 0) for i in range(n)},
            "random": random_placement(dag, 2, 0),
        }
        modes = row_modes(copies_modes, not args.no_segments)
        rows, executors, plain, outputs = [], {}, {}, {}
        for suffix, (cuda_graphs, graph_copies) in modes.items():
            for base, pl in placements.items():
                name = base + suffix
                try:
                    runner.cuda_graphs, runner.graph_copies = cuda_graphs, graph_copies
                    runner.set_placement(pl)
                    ex = runner.executor
                    y = compiled(ids).float()
                    y = compiled(ids).float()  # a replay (the first call after a new placement captures)
                    executors[name] = ex
                    if not cuda_graphs:
                        plain[base] = y.clone()
                    if cuda_graphs == "whole":
                        outputs[(base, graph_copies)] = y.clone()
                    state = ex.graphs.entry()
                    whole = cuda_graphs == "whole" and state is not None and state.whole is not None
                    rows.append(dict(
                        placement=name, base=base, suffix=suffix, cuts=cut_edge_count(dag, pl),
                        cosine=torch.nn.functional.cosine_similarity(y.flatten(), ref.flatten(), dim=0).item(),
                        argmax_agreement=(y.argmax(-1) == ref.argmax(-1)).float().mean().item(),
                        cut_bytes=ex.bytes_moved["cut"] // max(1, ex.calls), one_graph=whole,
                        cut_edges_copied=ex.cut_edges_transferred,
                        bitwise_equal_no_graphs=bool(torch.equal(y, plain[base])) if base in plain else None,
                        graph_copies=graph_copies if cuda_graphs == "whole" else None,
                        copies_in_graph=len(state.copies) if whole else None,
                        push_copies=len(state.pushes) if whole else None, bitwise_equal_link_graph=None))
                except Exception:  # noqa: BLE001 - report and go on
                    res["errors"][name] = traceback.format_exc()
                    print(res["errors"][name], file=sys.stderr)
        for r in rows:  # each way of copying inside the graph against link's, same placement
            gc = r["graph_copies"]
            if gc not in (None, "link") and (r["base"], "link") in outputs and (r["base"], gc) in outputs:
                r["bitwise_equal_link_graph"] = bool(torch.equal(outputs[(r["base"], gc)],
                                                                 outputs[(r["base"], "link")]))

        def on(ex):
            def call():
                runner.executor = ex
                compiled(ids)
            return call

        for r in rows:  # without graphs (tens of ms per call): timed one row after another
            if not r["suffix"]:
                try:
                    r["ms"] = timed(on(executors[r["placement"]]), args.repeats) * 1e3
                except Exception:  # noqa: BLE001
                    res["errors"][f"time {r['placement']}"] = traceback.format_exc()
        # graph rows and reduce-overhead: interleaved rounds, so drift hits them alike; per-round pairs below
        fns = {r["placement"]: on(executors[r["placement"]]) for r in rows if r["suffix"]}
        fns["reduce-overhead"] = lambda: ro(ids)
        rounds: dict = {}
        try:
            rounds = interleaved_rounds(fns, args.rounds, args.calls, sync_time)
        except Exception:  # noqa: BLE001
            res["errors"]["interleaved timing"] = traceback.format_exc()
            print(res["errors"]["interleaved timing"], file=sys.stderr)
        res["round_ms"] = {k: [x * 1e3 for x in v] for k, v in rounds.items()}
        costs = None
        if not args.no_compute_correction and "home" in executors:
            try:
                costs = launch_costs(model, ids, compiled, runner, executors["home"], args)
                res["launch_us"] = [{k: v * 1e6 for k, v in c.items()} for c in costs]
            except Exception:  # noqa: BLE001
                res["errors"]["launch costs"] = traceback.format_exc()
                print(res["errors"]["launch costs"], file=sys.stderr)
        for r in rows:
            home_name = "home" + r["suffix"]
            pl = placements[r["base"]]
            if costs is not None:
                r["compute_diff_us"] = compute_difference_s(costs, pl) * 1e6
            if r["placement"] in rounds:
                r["ms_spread"] = spread(rounds[r["placement"]], 1e3)
                r["ms"] = r["ms_spread"]["median"]
            if not r["cuts"]:
                continue
            if r["placement"] in rounds and home_name in rounds:
                per = per_cut_us(rounds[r["placement"]], rounds[home_name], r["cuts"])
                r["us_per_cut_edge_spread"] = spread(per)
                r["us_per_cut_edge"] = r["us_per_cut_edge_spread"]["median"]
                if costs is not None:
                    est = per_cut_us(rounds[r["placement"]], rounds[home_name], r["cuts"],
                                     compute_difference_s(costs, pl))
                    r["hop_estimate_us_spread"] = spread(est)
                    r["hop_estimate_us"] = r["hop_estimate_us_spread"]["median"]
            else:
                base = next((h for h in rows if h["placement"] == home_name and "ms" in h), None)
                if base is not None and "ms" in r:
                    r["us_per_cut_edge"] = (r["ms"] - base["ms"]) * 1e3 / r["cuts"]
        res["rows"] = rows
        res["home_vs_reduce_overhead"] = {}
        if "reduce-overhead" in rounds:
            res["reduce_overhead_ms_spread"] = spread(rounds["reduce-overhead"], 1e3)
            for name in (r["placement"] for r in rows if r["base"] == "home" and r["suffix"]):
                if name in rounds:
                    ratios = paired_ratios(rounds[name], rounds["reduce-overhead"])
                    res["home_vs_reduce_overhead"][name] = {
                        "ours_ms": spread(rounds[name], 1e3), "reduce_overhead_ms": res["reduce_overhead_ms_spread"],
                        "ratio": spread(ratios), "within_3_percent": judge_ratio(ratios, 0.03)}
        if args.profile:
            try:
                runner.executor = executors["home" + next(s for s in modes if s)]
                compiled(ids)
                res["profile"] = {"home +graphs": kernel_profile(lambda: compiled(ids)),
                                  "reduce-overhead": kernel_profile(lambda: ro(ids))}
            except Exception:  # noqa: BLE001
                res["errors"]["profile"] = traceback.format_exc()
        res["eager_ms"], res["inductor_ms"] = t_eager * 1e3, t_inductor * 1e3
        res["reduce_overhead_ms"] = res.get("reduce_overhead_ms_spread", {}).get("median", float("nan"))
        res["first_call_cosine"] = torch.nn.functional.cosine_similarity(got.flatten(), ref.flatten(), dim=0).item()
    (out / "runtime.json").write_text(json.dumps(res, indent=1))
    lines = report_lines(res, args)
    (out / "runtime.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if not res["errors"] else 1


def _q(s: dict | None, fmt: str = ".2f") -> str:
    """``median [p25-p75]`` of a :func:`torch_tessera.measure.paired_timing.spread` dict, ``-`` when missing."""
    if not s or not s.get("n"):
        return "-"
    return f"{s['median']:{fmt}} [{s['p25']:{fmt}}-{s['p75']:{fmt}}]"


def report_lines(res: dict, args) -> list[str]:
    """The markdown report of :func:`main`'s results."""
    nan = float("nan")
    lines = [f"model: Llama-3.1-8B-shaped, {args.layers} layers, bf16, batch {args.batch} x seq {args.seq}; "
             f"{res['launches']} launches; devices {args.devices}; torch {torch.__version__}",
             f"eager {res['eager_ms']:.2f} ms, Inductor {res['inductor_ms']:.2f} ms, reduce-overhead "
             f"{_q(res.get('reduce_overhead_ms_spread'), '.3f')} ms, tessera compile {res['compile_s']:.1f} s", ""]
    if res["devices_identical"]:
        lines.append(f"Devices: {res['devices_identical_reason']}. Every kernel costs the same on either device, so "
                     "**us per cut edge = (placement - home) / cut edges is the cost of one hop** (per-round pairs, "
                     "median [quartiles]).")
    else:
        lines.append(f"Devices differ ({res['devices_identical_reason']}): us per cut edge = (placement - home) / "
                     "cut edges MIXES the hop cost with the moved kernels' speed on the other device; 'hop est.' "
                     "subtracts that compute difference (per-launch times on each device, one by one, calibrated "
                     "to the program as one graph there) before dividing.")
    lines += [f"Graph rows and reduce-overhead timed in {args.rounds} interleaved rounds of {args.calls} calls (order "
              f"reversed every round); rows without graphs {args.repeats} calls one after another.", "",
              "| placement | cut edges | edges copied | cut bytes/call | one graph | copies in graph (push kernels) "
              "| = no graphs (bitwise) | = link graph (bitwise) | cosine vs eager | argmax agreement "
              "| ms/forward [p25-p75] | us per cut edge [p25-p75] | compute diff us | hop est. us per cut edge |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in res["rows"]:
        copies = "-" if r["copies_in_graph"] is None else f"{r['copies_in_graph']} ({r['push_copies']})"
        ms = _q(r.get("ms_spread"), ".3f") if "ms_spread" in r else f"{r.get('ms', nan):.2f}"
        per = (_q(r.get("us_per_cut_edge_spread"), ".1f") if "us_per_cut_edge_spread" in r
               else f"{r.get('us_per_cut_edge', nan):.1f}" if r["cuts"] else "-")
        comp = f"{r['compute_diff_us']:.0f}" if "compute_diff_us" in r and r["cuts"] else "-"
        lines.append(f"| {r['placement']} | {r['cuts']} | {r['cut_edges_copied']} | {r['cut_bytes']} | "
                     f"{r['one_graph']} | {copies} | {r['bitwise_equal_no_graphs']} | "
                     f"{'-' if r['bitwise_equal_link_graph'] is None else r['bitwise_equal_link_graph']} | "
                     f"{r['cosine']:.6f} | {r['argmax_agreement']:.4f} | {ms} | {per} | {comp} | "
                     f"{_q(r.get('hop_estimate_us_spread'), '.1f')} |")
    if res.get("home_vs_reduce_overhead"):
        lines += ["", "everything on GPU 0 as one graph vs `torch.compile(mode=\"reduce-overhead\")`, paired per round "
                      "(target: ratio <= 1.03; met = upper quartile within, MISSED = lower quartile above):", "",
                  "| ours | ours ms [p25-p75] | reduce-overhead ms [p25-p75] | ratio [p25-p75] | ratio min-max "
                  "| within 3 % |", "| --- | --- | --- | --- | --- | --- |"]
        for name, h in res["home_vs_reduce_overhead"].items():
            lines.append(f"| {name} | {_q(h['ours_ms'], '.3f')} | {_q(h['reduce_overhead_ms'], '.3f')} | "
                         f"{_q(h['ratio'], '.3f')} | {h['ratio']['min']:.3f}-{h['ratio']['max']:.3f} | "
                         f"{h['within_3_percent']} |")
    if "push_preflight" in res:
        pf = res["push_preflight"]
        lines += ["", f"push preflight (child process, rc {pf['rc']}): "
                      f"{'passed' if pf['ok'] else 'FAILED: no push rows'}; push kernels take cut copies of at most "
                      f"{res['push_max_bytes'] >> 20} MiB"]
    for name, prof in res.get("profile", {}).items():
        lines += ["", f"top GPU time of 5 calls, {name}: total {prof['total_us']:.0f} us, "
                      f"wall {prof['wall_ms']:.2f} ms", "", "| kernel | calls | us |", "| --- | --- | --- |"]
        lines += [f"| {k[:90]} | {c} | {t:.0f} |" for k, c, t in prof["top"]]
    if res["errors"]:
        lines += ["", f"errors: {sorted(res['errors'])} (tracebacks in runtime.json)"]
    return lines


if __name__ == "__main__":
    sys.exit(main())
