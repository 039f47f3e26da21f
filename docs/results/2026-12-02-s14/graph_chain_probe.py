"""Issue 24 probe (one H200): what a CUDA graph's launch costs the host, by node count, and whether replaying the
same launches as a chain of smaller graphs starts the GPU sooner.

For N launches of one kernel (in-place multiply of E fp32 elements) captured as ONE graph and as chains of graphs of
C launches each, replayed on one stream: ``host_us`` = time the replay call(s) take on the host (synchronised before
each); ``e2e_us`` = synchronise, replay, synchronise (what a decode step that ends in a host sync sees); ``gpu_us`` =
CUDA events around the replay. Medians of 30. Writes graph_chain_probe.json into the directory given.

    python3 docs/results/2026-12-02-s14/graph_chain_probe.py $OUT/probe
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch


def capture(x, n):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            x.mul_(1.0)
    torch.cuda.synchronize()
    with torch.cuda.graph(g, stream=s):
        for _ in range(n):
            x.mul_(1.0)
    torch.cuda.synchronize()
    return g


def measure(graphs, reps=30):
    host, e2e, gpu = [], [], []
    for _ in range(3):
        for g in graphs:
            g.replay()
    torch.cuda.synchronize()
    for _ in range(reps):
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        a.record()
        for g in graphs:
            g.replay()
        t1 = time.perf_counter()
        b.record()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        host.append(1e6 * (t1 - t0))
        e2e.append(1e6 * (t2 - t0))
        gpu.append(1e3 * a.elapsed_time(b))
    return {"host_us": statistics.median(host), "e2e_us": statistics.median(e2e), "gpu_us": statistics.median(gpu)}


def main():
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for elems in (4096, 1 << 22):
        x = torch.ones(elems, device="cuda")
        for n in (200, 800, 3200):
            for chunk in (n, 400, 200, 100, 50):
                if chunk > n:
                    continue
                graphs = [capture(x, min(chunk, n - i)) for i in range(0, n, chunk)]
                r = {"elements": elems, "launches": n, "chunk": chunk, "graphs": len(graphs), **measure(graphs)}
                rows.append(r)
                print(f"E={elems:>8} N={n:>5} chunk={chunk:>5} graphs={len(graphs):>3}: host {r['host_us']:8.1f} us, "
                      f"e2e {r['e2e_us']:8.1f} us, gpu {r['gpu_us']:8.1f} us", flush=True)
                del graphs
    (out / "graph_chain_probe.json").write_text(json.dumps({"torch": torch.__version__,
                                                             "device": torch.cuda.get_device_name(),
                                                             "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
