"""Can one CUDA graph hold work on two GPUs with the copies between them, and what does a hop cost inside it?

A chain of ``--hops`` steps ping-pongs a buffer between GPU 0 and GPU 1: on each step the current device adds 1 to its
buffer in place (one small kernel), records an event, the other device's stream waits on it and copies the buffer to
its own. Timed three ways (wall time per chain, median of ``--repeats``, after a synchronise):

* ``eager``: the chain issued from Python every time (what the runtime does without graphs);
* ``one graph``: the whole chain captured ONCE on GPU 0's stream, GPU 1's stream joined to the capture by an event,
  then replayed (the copies are memcpy nodes inside the graph);
* ``same-device graph``: the same number of kernels, all on GPU 0, no copies, one graph: the reference the hop cost is
  measured against. Per hop inside the graph = (one graph - same-device graph) / hops.

The result is checked: after the chain the final buffer must equal ``hops`` (every add ran once, in order).
Writes ``multidevice_graph.json`` under ``--out``. Needs two CUDA devices.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from pathlib import Path

import torch


def wall(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def chain(bufs, streams, hops: int, cross: bool) -> None:
    """Issue the chain. ``cross``: alternate devices with a copy per hop; else every add on device 0."""
    cur = 0
    for _ in range(hops):
        with torch.cuda.device(cur), torch.cuda.stream(streams[cur]):
            bufs[cur].add_(1)
        if not cross:
            continue
        nxt = 1 - cur
        ev = torch.cuda.Event()
        ev.record(streams[cur])
        streams[nxt].wait_event(ev)
        # torch copies between GPUs on the SOURCE device's current stream, with a barrier on the destination's
        # current stream: both must be this chain's streams (inside a capture, a default stream would break it)
        with torch.cuda.stream(streams[cur]), torch.cuda.stream(streams[nxt]):
            bufs[nxt].copy_(bufs[cur], non_blocking=True)
        cur = nxt
    if cross and cur != 0:  # join back to the origin stream
        ev = torch.cuda.Event()
        ev.record(streams[cur])
        streams[0].wait_event(ev)


def capture(bufs, streams, hops: int, cross: bool) -> torch.cuda.CUDAGraph:
    g = torch.cuda.CUDAGraph()
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    with torch.cuda.device(0):
        with torch.cuda.graph(g, stream=streams[0]):
            if cross:  # GPU 1's stream joins the capture before anything runs on it
                ev = torch.cuda.Event()
                ev.record(streams[0])
                streams[1].wait_event(ev)
            chain(bufs, streams, hops, cross)
    return g


def case(nbytes: int, hops: int, repeats: int) -> dict:
    n = nbytes // 2
    bufs = [torch.zeros(n, dtype=torch.bfloat16, device=f"cuda:{d}") for d in (0, 1)]
    streams = [torch.cuda.Stream(device=d) for d in (0, 1)]
    row: dict = {"bytes": nbytes, "hops": hops}

    def reset():
        for b in bufs:
            b.zero_()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)

    reset()
    row["eager_s"] = wall(lambda: chain(bufs, streams, hops, True), repeats)
    reset()
    chain(bufs, streams, hops, True)
    torch.cuda.synchronize(0)
    torch.cuda.synchronize(1)
    final = bufs[hops % 2]  # after an even number of hops the chain ends on device 0
    row["eager_correct"] = bool((final.float() == hops).all().item())
    try:
        g = capture(bufs, streams, hops, True)
        reset()
        g.replay()
        torch.cuda.synchronize(0)
        torch.cuda.synchronize(1)
        row["graph_correct"] = bool((bufs[hops % 2].float() == hops).all().item())
        row["graph_s"] = wall(g.replay, repeats)
        g_same = capture(bufs, streams, hops, False)
        row["same_device_graph_s"] = wall(g_same.replay, repeats)
        row["us_per_hop_in_graph"] = (row["graph_s"] - row["same_device_graph_s"]) * 1e6 / hops
    except Exception:  # noqa: BLE001 - the point is to find out whether this works
        row["graph_error"] = traceback.format_exc()
        print(row["graph_error"], file=sys.stderr)
    row["us_per_hop_eager"] = row["eager_s"] * 1e6 / hops
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--hops", type=int, default=64)
    ap.add_argument("--sizes", default="8192,524288,8388608", help="bytes per hop")
    ap.add_argument("--repeats", type=int, default=30)
    args = ap.parse_args()
    if torch.cuda.device_count() < 2:
        print("needs two CUDA devices", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    res = {"torch": torch.__version__, "peer_access": torch.cuda.can_device_access_peer(0, 1), "rows": []}
    for nbytes in (int(s) for s in args.sizes.split(",")):
        row = case(nbytes, args.hops, args.repeats)
        res["rows"].append(row)
        print({k: v for k, v in row.items() if k != "graph_error"}, flush=True)
    (out / "multidevice_graph.json").write_text(json.dumps(res, indent=1))
    return 0 if all("graph_error" not in r for r in res["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
