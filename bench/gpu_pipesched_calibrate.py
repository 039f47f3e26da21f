"""Measure what the pipelined-schedule simulator assumes, on two SM partitions of one GPU (issue 23).

1. **DRAM sharing.** A memory-bound copy (``dst.copy_(src)``) on each partition alone, then on both at once; a
   compute-bound GEMM on the large partition beside the copy on the small one. Each concurrent case is also
   predicted by ``scheduler.simulate`` (two launches in one memory domain, max-min fair sharing) from the solo
   times, the bytes moved, and the whole GPU's copy bandwidth measured on the default stream: predicted vs measured.
2. **Cost per wait.** A chain of tiny kernels alternating between the two partitions' streams, each waiting on an
   event the other recorded, against the same chain on one stream; ``(alternating - one stream) / hops`` is the
   cost per cross-stream wait. Timed inside one CUDA graph (falls back to eager launches, said in the output, if the
   capture fails); this is the figure ``scheduler.modulo.WAIT_SECONDS`` stands for.

Usage::

    python bench/gpu_pipesched_calibrate.py --out DIR [--devices cuda:0@104sm,cuda:0@24sm]
    python bench/gpu_pipesched_calibrate.py --out /tmp/x --devices cpu:0,cpu:1 --small   # CPU dry run (plumbing)

Writes ``DIR/pipesched_calibration.json`` and prints a table. Under a minute on one H200.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch


def _timer(gpu: bool):
    """``(start(stream), stop(stream) -> seconds)`` with CUDA events on a GPU, wall time on CPU."""
    if not gpu:
        t = {}
        return (lambda s: t.__setitem__("t", time.perf_counter())), (lambda s: time.perf_counter() - t["t"])
    ev = {}

    def start(s):
        ev["a"] = torch.cuda.Event(enable_timing=True)
        ev["a"].record(s)

    def stop(s):
        b = torch.cuda.Event(enable_timing=True)
        b.record(s)
        b.synchronize()
        return ev["a"].elapsed_time(b) / 1e3

    return start, stop


def _on(stream, gpu):
    return torch.cuda.stream(stream) if gpu else torch.autograd.profiler.record_function("cpu")


def _sync(devs):
    for d in devs:
        d.synchronize()


def sharing(devs, gpu: bool, nbytes: int, repeats: int) -> dict:
    """Solo and concurrent copy / GEMM times on the two partitions (seconds per launch) and the simulator's
    prediction of the concurrent ones."""
    from torch_tessera.scheduler.modulo import build_pipelined_schedule
    from torch_tessera.scheduler.simulate import MemoryShare, simulate
    from torch_tessera.scheduler.synthetic import layered_dag

    dev = devs[0].torch_device
    n = nbytes // 2
    bufs = [(torch.empty(n, dtype=torch.bfloat16, device=dev), torch.ones(n, dtype=torch.bfloat16, device=dev))
            for _ in devs]
    k = 4096 if gpu else 256
    a, b = (torch.randn(k, k, dtype=torch.bfloat16 if gpu else torch.float32, device=dev) for _ in range(2))
    streams = [d.default_stream for d in devs]

    def copy(i):
        bufs[i][0].copy_(bufs[i][1])

    def gemm(i):
        torch.mm(a, b)

    def run(jobs):
        """``jobs``: [(device index, fn)]; each device runs its fn ``repeats`` times, all at once; seconds each."""
        _sync(devs)
        out = {}
        marks = {}
        for i, fn in jobs:
            with _on(streams[i], gpu):
                if gpu:
                    marks[i] = [torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)]
                    marks[i][0].record(streams[i])
                t0 = time.perf_counter()
                for _ in range(repeats):
                    fn(i)
                if gpu:
                    marks[i][1].record(streams[i])
                else:
                    out[i] = (time.perf_counter() - t0) / repeats
        _sync(devs)
        for i in marks:
            out[i] = marks[i][0].elapsed_time(marks[i][1]) / 1e3 / repeats
        return out

    for jobs in ([(0, copy)], [(1, copy)], [(0, gemm)]):  # warm-up
        run(jobs)
    whole = _whole_gpu_copy(bufs[0], gpu, repeats)
    solo_copy = [run([(i, copy)])[i] for i in range(2)]
    solo_gemm = run([(0, gemm)])[0]
    both_copy = run([(0, copy), (1, copy)])
    mixed = run([(0, gemm), (1, copy)])
    moved = 2.0 * n * 2  # bytes read + written per copy
    gemm_bytes = 3.0 * k * k * a.element_size()
    solo_bw = [moved / t for t in solo_copy]
    share = MemoryShare({0: moved, 1: moved}, tuple(solo_bw), {0: moved / whole})

    def predict(costs, launch_bytes):
        dag = layered_dag(2, width=2, seed=0)  # two independent launches
        from torch_tessera.target.costs import CostTable

        table = CostTable(("p0", "p1"), (0, 1), np.array([[costs[0], costs[0]], [costs[1], costs[1]]]))
        s = build_pipelined_schedule(dag, {0: 0, 1: 1}, 1, costs=table, domains=(0, 0))
        r = simulate(s, table, None, memory=MemoryShare(launch_bytes, share.device_bandwidth,
                                                         share.domain_bandwidth))
        return [float(r.end[d][-1] - r.start[d][0]) for d in range(2)]

    pred_copy = predict(solo_copy, {0: moved, 1: moved})
    pred_mixed = predict([solo_gemm, solo_copy[1]], {0: gemm_bytes, 1: moved})
    return dict(bytes_per_copy=moved, whole_gpu_copy_s=whole, whole_gpu_GBps=moved / whole / 1e9,
                solo_copy_s=solo_copy, solo_GBps=[x / 1e9 for x in solo_bw], solo_gemm_s=solo_gemm,
                both_copy_s=[both_copy[0], both_copy[1]], both_copy_predicted_s=pred_copy,
                gemm_beside_copy_s=[mixed[0], mixed[1]], gemm_beside_copy_predicted_s=pred_mixed)


def _whole_gpu_copy(pair, gpu: bool, repeats: int) -> float:
    """Seconds of one copy on the whole GPU (the default stream of the primary context, every SM)."""
    start, stop = _timer(gpu)
    s = torch.cuda.current_stream() if gpu else None
    pair[0].copy_(pair[1])
    start(s)
    for _ in range(repeats):
        pair[0].copy_(pair[1])
    return stop(s) / repeats


def waits(devs, gpu: bool, hops: int, repeats: int) -> dict:
    """Seconds per cross-stream wait: a chain of ``hops`` tiny kernels alternating between the two streams vs on
    one stream, in one CUDA graph where it captures (else eager)."""
    x = torch.zeros(1024, device=devs[0].torch_device)
    s0, s1 = devs[0].default_stream, devs[1].default_stream

    def chain(alternate: bool):
        streams = [s0, s1] if alternate else [s0, s0]
        for i in range(hops):
            cur, prev = streams[i % 2], streams[(i - 1) % 2]
            if gpu and alternate and i:
                ev = torch.cuda.Event()
                ev.record(prev)
                cur.wait_event(ev)
            with _on(cur, gpu):
                x.add_(1.0)
        if gpu and alternate and hops % 2 == 0:
            ev = torch.cuda.Event()
            ev.record(s1)
            s0.wait_event(ev)

    mode = "eager"
    runners = {}
    if gpu:
        try:
            for alt in (False, True):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, stream=s0):
                    chain(alt)
                runners[alt] = lambda g=g: _replay_on(g, s0)
            mode = "graph"
        except Exception as err:  # noqa: BLE001 - report why and time eager launches instead
            mode = f"eager (graph capture failed: {type(err).__name__}: {err})"
            runners = {}
    if not runners:
        runners = {alt: (lambda alt=alt: chain(alt)) for alt in (False, True)}
    start, stop = _timer(gpu)
    out = {}
    for alt, fn in runners.items():
        fn()
        _sync(devs)
        start(s0)
        for _ in range(repeats):
            fn()
        out[alt] = stop(s0) / repeats
    return dict(mode=mode, hops=hops, one_stream_s=out[False], alternating_s=out[True],
                per_wait_us=(out[True] - out[False]) / max(1, hops - 1) * 1e6)


def _replay_on(graph, stream) -> None:
    with torch.cuda.stream(stream):
        graph.replay()


def main(argv: list[str] | None = None) -> int:
    from torch_tessera.target.devices import open_device

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--devices", default="cuda:0@104sm,cuda:0@24sm")
    ap.add_argument("--small", action="store_true", help="small sizes (CPU dry run)")
    args = ap.parse_args(argv)
    names = args.devices.split(",")
    if len(names) != 2:
        raise SystemExit("--devices needs two devices (partitions of one GPU)")
    devs = [open_device(n) for n in names]
    gpu = devs[0].spec.is_gpu
    try:
        res = dict(devices=[d.name for d in devs], torch=torch.__version__,
                   gpu=torch.cuda.get_device_name(0) if gpu else "cpu")
        res["sharing"] = sharing(devs, gpu, (1 << 20) if args.small else (1 << 30), 3 if args.small else 20)
        res["waits"] = waits(devs, gpu, 16 if args.small else 256, 2 if args.small else 50)
    finally:
        for d in devs:
            d.close()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "pipesched_calibration.json").write_text(json.dumps(res, indent=1))
    sh, w = res["sharing"], res["waits"]
    print(f"devices {res['devices']} ({res['gpu']}, torch {res['torch']})")
    print(f"whole GPU copy: {sh['whole_gpu_GBps']:.0f} GB/s; solo: {sh['solo_GBps'][0]:.0f} / "
          f"{sh['solo_GBps'][1]:.0f} GB/s")
    print("| case | partition 0 ms | partition 1 ms | simulator predicts ms |")
    print("| --- | --- | --- | --- |")
    print(f"| copy alone | {sh['solo_copy_s'][0] * 1e3:.3f} | {sh['solo_copy_s'][1] * 1e3:.3f} | (input) |")
    print(f"| copy on both | {sh['both_copy_s'][0] * 1e3:.3f} | {sh['both_copy_s'][1] * 1e3:.3f} | "
          f"{sh['both_copy_predicted_s'][0] * 1e3:.3f} / {sh['both_copy_predicted_s'][1] * 1e3:.3f} |")
    print(f"| GEMM on 0 beside copy on 1 | {sh['gemm_beside_copy_s'][0] * 1e3:.3f} | "
          f"{sh['gemm_beside_copy_s'][1] * 1e3:.3f} | {sh['gemm_beside_copy_predicted_s'][0] * 1e3:.3f} / "
          f"{sh['gemm_beside_copy_predicted_s'][1] * 1e3:.3f} |")
    print(f"cost per cross-partition wait ({w['mode']}, {w['hops']} hops): {w['per_wait_us']:.2f} us "
          f"(scheduler.modulo.WAIT_SECONDS assumes 5 us)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
