"""Cost of one cross-device hop in the runtime's copy path, split into its parts (run on a CUDA machine).

For each device pair (two streams of the whole GPU; whole GPU -> a green-context partition) and message size, times
per hop: the full path the executor uses (producer event -> copy stream -> consumer waits), the bare copy, and the
event/stream bookkeeping alone; wall-clock per hop over many hops queued back to back (CPU cost), and GPU time per hop
from CUDA events around the batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch


def hop_loop(src_stream, dst_stream, copy_stream, src, dst, n, mode):
    for _ in range(n):
        if mode == "full":
            copy_stream.wait_stream(src_stream)
            with torch.cuda.stream(copy_stream):
                dst.copy_(src, non_blocking=True)
                ev = torch.cuda.Event()
                ev.record(copy_stream)
            dst_stream.wait_event(ev)
        elif mode == "events-only":
            copy_stream.wait_stream(src_stream)
            ev = torch.cuda.Event()
            ev.record(copy_stream)
            dst_stream.wait_event(ev)
        elif mode == "copy-only":
            with torch.cuda.stream(copy_stream):
                dst.copy_(src, non_blocking=True)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    from torch_tessera.target.devices import open_device

    out = {}
    whole = open_device("cuda:0")
    part = open_device("cuda:0@72sm")
    pairs = {
        "two streams, whole GPU": (whole.new_stream(), whole.new_stream(), whole.new_stream(-1)),
        "whole -> 72-SM green context": (whole.new_stream(), part.new_stream(), part.new_stream(-1)),
    }
    n = 200
    for pname, (s_src, s_dst, s_copy) in pairs.items():
        for size in (4096, 262144, 4 << 20):
            src = torch.randn(size // 2, dtype=torch.bfloat16, device="cuda")
            dst = torch.empty_like(src)
            for mode in ("full", "events-only", "copy-only"):
                hop_loop(s_src, s_dst, s_copy, src, dst, 10, mode)
                torch.cuda.synchronize()
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record(s_dst)
                t0 = time.perf_counter()
                hop_loop(s_src, s_dst, s_copy, src, dst, n, mode)
                cpu = (time.perf_counter() - t0) / n
                end.record(s_dst)
                torch.cuda.synchronize()
                gpu = start.elapsed_time(end) * 1e-3 / n
                out[f"{pname} | {size} B | {mode}"] = {"cpu_us": cpu * 1e6, "gpu_us_per_hop": gpu * 1e6}
                print(f"{pname:32s} {size:>8d} B {mode:12s} cpu {cpu * 1e6:8.1f} us  gpu {gpu * 1e6:8.1f} us",
                      flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "hop.json").write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
